"""A text corpus as one byte-addressable sequence, split deterministically into train and validation.

The coordinator owns the corpus and serves byte ranges of it to nodes (``ReadData``): a volunteer needs no copy of
the data, and a 1 GB corpus is never loaded whole anywhere: reads go to the files that hold the range.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

#: size of the built-in corpus: the first files of the standard library's sources, sorted by name
BUILTIN_BYTES = 4_000_000


class CorpusError(ValueError):
    """A data source that cannot serve as a corpus; the message names the path."""


@dataclass(frozen=True)
class Split:
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


class Corpus:
    """An ordered list of files read as one sequence of bytes, possibly truncated to ``max_bytes``."""

    def __init__(self, files: list[Path], max_bytes: int = 0, val_fraction: float = 0.1):
        if not files:
            raise CorpusError("the corpus has no text files")
        self.files = list(files)
        sizes = [f.stat().st_size for f in self.files]
        self.offsets = [0]
        for size in sizes:
            self.offsets.append(self.offsets[-1] + size)
        self.size = self.offsets[-1] if not max_bytes else min(self.offsets[-1], max_bytes)
        if self.size < 1024:
            raise CorpusError(f"the corpus holds only {self.size} bytes; at least 1024 are needed")
        val = max(512, int(self.size * val_fraction))
        self.train = Split(0, self.size - val)
        self.val = Split(self.size - val, self.size)
        digest = hashlib.sha256()
        for path, size in zip(self.files, sizes):
            digest.update(f"{path.name}\0{size}\0".encode())
        digest.update(str(self.size).encode())
        digest.update(self.read(0, min(self.size, 1 << 16)))
        digest.update(self.read(max(0, self.size - (1 << 16)), 1 << 16))
        self.sha256 = digest.hexdigest()

    @classmethod
    def from_source(cls, source: str, max_bytes: int = 0, val_fraction: float = 0.1) -> "Corpus":
        if source == "builtin":
            return cls(builtin_files(), max_bytes or BUILTIN_BYTES, val_fraction)
        path = Path(source).expanduser()
        if not path.exists():
            raise CorpusError(f"data source {source}: no such file or folder")
        if path.is_file():
            return cls([path], max_bytes, val_fraction)
        files = [p for p in sorted(path.rglob("*")) if p.is_file() and _looks_like_text(p)]
        if not files:
            raise CorpusError(f"data source {source}: the folder holds no text files")
        return cls(files, max_bytes, val_fraction)

    def read(self, offset: int, length: int) -> bytes:
        """Bytes [offset, offset + length) of the corpus, clipped to its end."""
        end = min(self.size, offset + max(0, length))
        if offset < 0 or offset >= end:
            return b""
        out = bytearray()
        index = bisect.bisect_right(self.offsets, offset) - 1
        while offset < end:
            file_start = self.offsets[index]
            take = min(end, self.offsets[index + 1]) - offset
            with open(self.files[index], "rb") as f:
                f.seek(offset - file_start)
                out += f.read(take)
            offset += take
            index += 1
        return bytes(out)

    def byte_counts(self, sample_bytes: int = 16 << 20, chunk_bytes: int = 1 << 16) -> list[int]:
        """How often each byte value 0..255 occurs in the training split: all of it up to ``sample_bytes``, else
        that many bytes in evenly spaced chunks (deterministic, so every caller gets the same counts)."""
        import numpy as np

        counts = np.zeros(256, dtype=np.int64)
        train = self.train
        if train.size <= sample_bytes:
            spans = [(offset, min(chunk_bytes, train.end - offset)) for offset in range(train.start, train.end, chunk_bytes)]
        else:
            n = max(1, sample_bytes // chunk_bytes)
            stride = (train.size - chunk_bytes) / max(1, n - 1)
            spans = [(train.start + int(i * stride), chunk_bytes) for i in range(n)]
        for offset, length in spans:
            counts += np.bincount(np.frombuffer(self.read(offset, length), dtype=np.uint8), minlength=256)
        return counts.tolist()

    def split(self, name: str) -> Split:
        if name == "train":
            return self.train
        if name == "val":
            return self.val
        raise CorpusError(f"split must be 'train' or 'val', got {name!r}")


def builtin_files() -> list[Path]:
    """The standard library's top-level ``.py`` files, sorted: text that every Python install carries."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.is_file())
    taken, total = [], 0
    for path in files:
        taken.append(path)
        total += path.stat().st_size
        if total >= BUILTIN_BYTES:
            break
    return taken


def _looks_like_text(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(8192)
    except OSError:
        return False
    if b"\0" in head or not head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start > len(head) - 4  # a multi-byte character cut at the end of the sample
    return not os.path.basename(path).startswith(".")

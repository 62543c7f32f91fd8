"""Checkpoints of the shared model: safetensors files written atomically and verified by hash when loaded.

A checkpoint holds the global (averaged) parameters and the outer optimizer's state, plus metadata: the run
config as TOML, the round, and the number of samples the swarm has trained on. Writing goes to a temporary file in
the same folder, is fsynced, then renamed over the final name, and the folder is fsynced: a crash leaves either
the old file or the new one, never half of one. A ``.sha256`` file beside it lets a reader detect corruption.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt or not a cotrain checkpoint; the message names the path."""


@dataclass
class Checkpoint:
    tensors: dict[str, torch.Tensor]
    metadata: dict

    @property
    def round(self) -> int:
        return int(self.metadata.get("round", 0))

    @property
    def config_toml(self) -> str:
        return self.metadata.get("config_toml", "")

    def model_state(self) -> dict[str, torch.Tensor]:
        return {k[len("model."):]: v for k, v in self.tensors.items() if k.startswith("model.")}


def named_state(param_names: list[str], tensors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """A swarm's shared state as checkpoint tensors: the first tensors are the model's parameters
    (``model.<name>``), the rest the strategy's own state in order (``shared.<i>``: outer momentum for DiLoCo,
    the optimizer's moments for sync, PowerSGD's Q factors)."""
    out = {f"model.{n}": t for n, t in zip(param_names, tensors)}
    out.update({f"shared.{i:04d}": t for i, t in enumerate(tensors[len(param_names):])})
    return out


def shared_tensors_of(checkpoint: "Checkpoint", param_names: list[str]) -> list[torch.Tensor]:
    """The inverse of :func:`named_state`."""
    rest = sorted(k for k in checkpoint.tensors if k.startswith("shared."))
    return [checkpoint.tensors[f"model.{n}"] for n in param_names] + [checkpoint.tensors[k] for k in rest]


def atomic_write_bytes(path: Path, data: bytes, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` at once: a reader sees the old file or the new one, never a part.
    ``durable``: also fsync the file and its folder, so the write survives a power cut (False for a status file
    rewritten every round, where the next write replaces a lost one and the fsyncs would cost the training loop)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def encode_checkpoint(tensors: dict[str, torch.Tensor], metadata: dict) -> bytes:
    """A checkpoint as bytes (safetensors, the metadata as JSON in its header): on disk and on the wire."""
    return st_save({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                   metadata={"cotrain": json.dumps(metadata, sort_keys=True)})


def decode_checkpoint(data: bytes, origin: str = "checkpoint") -> Checkpoint:
    try:
        tensors = st_load(data)
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8: 8 + header_len])
        metadata = json.loads((header.get("__metadata__") or {}).get("cotrain", "{}"))
    except Exception as e:  # safetensors raises several types for a malformed file
        raise CheckpointError(f"{origin} is not a readable safetensors file: {e}") from None
    if "config_toml" not in metadata and "round" not in metadata:
        raise CheckpointError(f"{origin} is not a cotrain checkpoint (no run metadata)")
    return Checkpoint(tensors, metadata)


def save_checkpoint(path: Path, tensors: dict[str, torch.Tensor], metadata: dict) -> str:
    """Write atomically; returns the file's sha256 (also written beside it as ``<name>.sha256``)."""
    data = encode_checkpoint(tensors, metadata)
    digest = hashlib.sha256(data).hexdigest()
    atomic_write_bytes(Path(path), data)
    atomic_write_bytes(Path(str(path) + ".sha256"), (digest + "\n").encode())
    return digest


def load_checkpoint(path: Path, expected_sha256: str | None = None) -> Checkpoint:
    """Read and verify a checkpoint: against ``expected_sha256`` if given, else against its ``.sha256`` file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror or e}") from None
    if expected_sha256 is None:
        sidecar = Path(str(path) + ".sha256")
        if sidecar.exists():
            expected_sha256 = sidecar.read_text().strip()
    if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256:
        raise CheckpointError(f"checkpoint {path} is corrupt: its sha256 does not match the one recorded")
    ckpt = decode_checkpoint(data, origin=f"checkpoint {path}")
    if "config_toml" not in ckpt.metadata:
        raise CheckpointError(f"checkpoint {path} is not a cotrain checkpoint (no run config in its metadata)")
    return ckpt

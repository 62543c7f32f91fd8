"""Chunked top-k with low-bit values: the sparse codec of SparseLoCo (Templar; Sarfi et al., arXiv 2508.15706).

Each tensor of the vector (``sizes``) is cut into chunks of ``chunk`` consecutive values; of each chunk the ``topk``
largest magnitudes are kept (a shorter chunk, or a tensor smaller than a chunk, keeps ``ceil(topk * len / chunk)``,
at least one), everything else is dropped. Kept values are quantized to ``bits`` bits: ``2**bits`` equal bins over
``[-r, r]`` with ``r = min(sigmas * rms, max |v|)`` of the tensor's kept values (values beyond ``r`` land in the outer
bins), and every value is sent as its bin's code; the decoded value is the *mean of the kept values in its bin*,
sent as a table of ``2**bits`` float32 per tensor. Dropped values and the quantization error are not lost: the
averaging layer keeps them in its error-feedback buffer and sends them in a later round.

Indices cost fewer bits than ``log2(chunk)``: within a chunk they are sorted and sent as gaps, Rice-coded with the
parameter that suits the chunk best (4 bits per chunk; about ``log2(len / k)``, 5-6 for 64 of 4096), the quotients
as one unary stream and the remainders as fixed-width fields, so both sides code and decode with numpy, no loop per
value. A gap averages ``len / k``, so an index costs about ``log2(len / k) + 1.6`` bits (7.6 instead of 12): at 64
of 4096 and 2 bits, ~0.15 bits per parameter, against 32 for fp32.

Payload: ``b"SP" | version | bits | chunk (u32) | topk (u32) | tables (f32, 2**bits per tensor) | Rice parameters
(4 bits per chunk) | unary length (u32) | unary bytes | remainder bytes | code bytes``. Everything but the unary stream's length follows from ``sizes``,
``chunk``, ``topk`` and ``bits``, which both sides must share (a payload of other settings is refused), so a
malformed or oversized payload is refused before anything is allocated from it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from cotrain.compression.codecs import Codec, _f32, _tensor

MAGIC = b"SP"
VERSION = 1
_HEADER = struct.Struct("<2sBBII")


@dataclass(frozen=True)
class _Layout:
    """Where every chunk of a vector lies and how many values it keeps; derived from the sizes alone."""

    starts: np.ndarray     # int64, the chunk's first position in the vector
    lengths: np.ndarray    # int64, values in the chunk
    keep: np.ndarray       # int64, values kept from it
    segment: np.ndarray    # int64, index of the tensor it belongs to
    segments: int

    @property
    def kept(self) -> int:
        return int(self.keep.sum())


def _layout(sizes: Sequence[int], chunk: int, topk: int) -> _Layout:
    starts, lengths, segment = [], [], []
    offset = 0
    for s, size in enumerate(sizes):
        for a in range(0, size, chunk):
            starts.append(offset + a)
            lengths.append(min(chunk, size - a))
            segment.append(s)
        offset += size
    lengths_a = np.array(lengths, dtype=np.int64)
    keep = np.minimum(lengths_a, np.maximum(1, -(-topk * lengths_a // chunk)))
    return _Layout(np.array(starts, dtype=np.int64), lengths_a, keep, np.array(segment, dtype=np.int64), len(sizes))


RICE_FIELD_BITS = 4  # a chunk's Rice parameter, 0..15


def _best_rice(gaps: np.ndarray, lay: _Layout) -> np.ndarray:
    """Per chunk, the Rice parameter that codes its gaps in the fewest bits (quotients in unary + remainders)."""
    firsts = np.cumsum(lay.keep) - lay.keep
    costs = np.stack([np.add.reduceat(gaps >> r, firsts) + lay.keep * (r + 1) for r in range(1 << RICE_FIELD_BITS)])
    return costs.argmin(axis=0).astype(np.int64)


def _pack_fields(values: np.ndarray, widths: np.ndarray) -> bytes:
    """``values[i]`` in ``widths[i]`` bits, most significant first, one bit stream padded to whole bytes."""
    if values.size == 0 or int(widths.max(initial=0)) == 0:
        return np.packbits(np.zeros(int(widths.sum()), dtype=np.uint8)).tobytes()
    top = int(widths.max())
    shifts = np.arange(top - 1, -1, -1, dtype=np.int64)
    bits = ((values[:, None] >> shifts[None, :]) & 1).astype(np.uint8)
    used = shifts[None, :] < widths[:, None]
    return np.packbits(bits[used]).tobytes()


def _unpack_fields(data: bytes, widths: np.ndarray) -> np.ndarray:
    total = int(widths.sum())
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8))[:total].astype(np.int64)
    top = int(widths.max(initial=0))
    if top == 0:
        return np.zeros(widths.size, dtype=np.int64)
    shifts = np.arange(top - 1, -1, -1, dtype=np.int64)
    used = shifts[None, :] < widths[:, None]
    grid = np.zeros(used.shape, dtype=np.int64)
    grid[used] = bits
    return (grid << shifts[None, :]).sum(axis=1)


def _field_bytes(widths: np.ndarray) -> int:
    return (int(widths.sum()) + 7) // 8


class SparseLowBit(Codec):
    """Top ``topk`` of every ``chunk`` values per tensor, each sent as a Rice-coded index gap and a ``bits``-bit code
    into its tensor's table of bin means. ``sizes``: the tensors the vector concatenates (a vector of another length
    is coded as one tensor)."""

    name = "sparse"

    def __init__(self, sizes: Sequence[int] = (), chunk: int = 4096, topk: int = 64, bits: int = 2,
                 sigmas: float = 6.0):
        if not 1 <= topk <= chunk:
            raise ValueError(f"compression.sparse_topk: must be in 1..sparse_chunk ({chunk}), got {topk}")
        if not 1 <= bits <= 8:
            raise ValueError(f"compression.sparse_bits: must be in 1..8, got {bits}")
        if chunk < 1 or chunk > 1 << 24:
            raise ValueError(f"compression.sparse_chunk: must be in 1..2**24, got {chunk}")
        self.sizes = [int(s) for s in sizes]
        self.chunk, self.topk, self.bits, self.sigmas = chunk, topk, bits, sigmas
        self._layouts: dict[int, _Layout] = {}

    def layout(self, numel: int) -> _Layout:
        if numel not in self._layouts:
            sizes = self.sizes if sum(self.sizes) == numel and self.sizes else [numel]
            self._layouts[numel] = _layout(sizes, self.chunk, self.topk)
        return self._layouts[numel]

    # ---- encoding ------------------------------------------------------------------------------------------------
    def select(self, a: np.ndarray, lay: _Layout) -> np.ndarray:
        """Positions (int64, ascending within each chunk, chunks in order) of the largest magnitudes per chunk."""
        mag = np.abs(a)
        # chunks of one (length, keep) shape are selected together: in practice all full chunks, then each tail
        shapes = sorted({(int(n), int(k)) for n, k in zip(lay.lengths, lay.keep)})
        picked: list = [None] * len(lay.starts)
        for length, keep in shapes:
            rows = np.flatnonzero((lay.lengths == length) & (lay.keep == keep))
            block = mag[lay.starts[rows][:, None] + np.arange(length)[None, :]]
            if keep < length:
                top = np.argpartition(-block, keep - 1, axis=1)[:, :keep]
            else:
                top = np.broadcast_to(np.arange(length), (rows.size, length))
            top = np.sort(top, axis=1)
            for r, t in zip(rows, top):
                picked[r] = t
        return np.concatenate(picked).astype(np.int64) if picked else np.zeros(0, dtype=np.int64)

    def _bin_range(self, vs: np.ndarray) -> float:
        """r of a tensor's kept values (float64, not empty): the bins span [-r, r]."""
        return min(self.sigmas * float(np.sqrt(np.mean(vs * vs))), float(np.abs(vs).max()))

    def _quantize(self, v: np.ndarray, seg: np.ndarray, segments: int) -> tuple[np.ndarray, np.ndarray]:
        """-> (codes uint, tables float32 (segments, 2**bits))"""
        levels = 1 << self.bits
        codes = np.zeros(v.size, dtype=np.int64)
        tables = np.zeros((segments, levels), dtype=np.float32)
        for s in range(segments):
            sel = seg == s
            vs = v[sel].astype(np.float64)
            if vs.size == 0:
                continue
            r = self._bin_range(vs)
            if r <= 0:
                continue  # all zero: code 0 with a table of zeros
            c = np.clip(np.floor((vs + r) / (2 * r) * levels), 0, levels - 1).astype(np.int64)
            sums = np.bincount(c, weights=vs, minlength=levels)
            counts = np.bincount(c, minlength=levels)
            centres = -r + (np.arange(levels) + 0.5) * (2 * r / levels)
            tables[s] = np.where(counts > 0, sums / np.maximum(counts, 1), centres).astype(np.float32)
            codes[sel] = c
        return codes, tables

    def encode(self, x: torch.Tensor) -> bytes:
        a = _f32(x)
        lay = self.layout(a.size)
        local = self.select(a, lay)
        chunk_of = np.repeat(np.arange(len(lay.starts)), lay.keep)
        values = a[lay.starts[chunk_of] + local]
        codes, tables = self._quantize(values, lay.segment[chunk_of], lay.segments)
        first = np.r_[True, chunk_of[1:] != chunk_of[:-1]] if local.size else np.zeros(0, dtype=bool)
        gaps = np.where(first, local, local - np.r_[0, local[:-1]] - 1)
        chunk_rice = _best_rice(gaps, lay) if gaps.size else np.zeros(len(lay.starts), dtype=np.int64)
        rice = chunk_rice[chunk_of]
        quotients = gaps >> rice
        remainders = gaps & ((1 << rice) - 1)
        unary = np.ones(int(quotients.sum()) + quotients.size, dtype=np.uint8)
        unary[np.cumsum(quotients + 1) - 1] = 0
        unary_bytes = np.packbits(unary, bitorder="big")
        if unary.size % 8:  # pad with ones, which a decoder never takes for the end of a quotient
            unary_bytes[-1] |= (1 << (8 - unary.size % 8)) - 1
        return (_HEADER.pack(MAGIC, VERSION, self.bits, self.chunk, self.topk) + tables.astype("<f4").tobytes()
                + _pack_fields(chunk_rice, np.full(chunk_rice.size, RICE_FIELD_BITS, dtype=np.int64))
                + struct.pack("<I", unary_bytes.size) + unary_bytes.tobytes() + _pack_fields(remainders, rice)
                + _pack_fields(codes, np.full(codes.size, self.bits, dtype=np.int64)))

    # ---- decoding ------------------------------------------------------------------------------------------------
    def decode_sparse(self, data: bytes, numel: int) -> tuple[np.ndarray, np.ndarray]:
        """-> (positions int64 ascending, values float32) of the payload; ValueError naming what is wrong."""
        lay = self.layout(numel)
        levels = 1 << self.bits
        if len(data) < _HEADER.size:
            raise ValueError("sparse: truncated header")
        magic, version, bits, chunk, topk = _HEADER.unpack_from(data)
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"sparse: not a version-{VERSION} sparse payload")
        if (bits, chunk, topk) != (self.bits, self.chunk, self.topk):
            raise ValueError(f"sparse: payload of bits={bits} chunk={chunk} topk={topk}, this swarm uses "
                             f"bits={self.bits} chunk={self.chunk} topk={self.topk}")
        pos = _HEADER.size
        table_bytes = 4 * levels * lay.segments
        if len(data) < pos + table_bytes + 4:
            raise ValueError("sparse: truncated tables")
        tables = np.frombuffer(data, dtype="<f4", count=levels * lay.segments, offset=pos).reshape(lay.segments,
                                                                                                     levels)
        if not np.isfinite(tables).all():
            raise ValueError("sparse: non-finite values in a table")
        pos += table_bytes
        chunks = len(lay.starts)
        rice_widths = np.full(chunks, RICE_FIELD_BITS, dtype=np.int64)
        rice_len = _field_bytes(rice_widths)
        if len(data) < pos + rice_len + 4:
            raise ValueError("sparse: truncated Rice parameters")
        chunk_rice = _unpack_fields(data[pos: pos + rice_len], rice_widths)
        pos += rice_len
        (unary_len,) = struct.unpack_from("<I", data, pos)
        pos += 4
        kept = lay.kept
        chunk_of = np.repeat(np.arange(chunks), lay.keep)
        rice = chunk_rice[chunk_of]
        # a chunk's quotients sum to at most len / 2**rice, so the unary stream has a bound known beforehand
        most_unary = int((lay.lengths >> chunk_rice).sum()) + kept
        if unary_len > (most_unary + 7) // 8:
            raise ValueError(f"sparse: unary stream of {unary_len} bytes, at most {(most_unary + 7) // 8} possible")
        rem_len = _field_bytes(rice)
        code_len = _field_bytes(np.full(kept, self.bits, dtype=np.int64))
        if len(data) != pos + unary_len + rem_len + code_len:
            raise ValueError(f"sparse: expected {pos + unary_len + rem_len + code_len} bytes, got {len(data)}")
        unary = np.unpackbits(np.frombuffer(data, dtype=np.uint8, count=unary_len, offset=pos))
        ends = np.flatnonzero(unary == 0)
        if ends.size != kept or (unary_len and unary.size - 1 - (ends[-1] if ends.size else -1) > 7):
            raise ValueError(f"sparse: the unary stream holds {ends.size} quotients, expected {kept}")
        quotients = np.diff(np.r_[-1, ends]) - 1
        pos += unary_len
        remainders = _unpack_fields(data[pos: pos + rem_len], rice)
        pos += rem_len
        codes = _unpack_fields(data[pos:], np.full(kept, self.bits, dtype=np.int64))
        gaps = (quotients << rice) + remainders
        # positions within each chunk: a running sum of gap + 1 that restarts at every chunk
        steps = gaps + 1
        run = np.cumsum(steps)
        chunk_first = np.cumsum(lay.keep) - lay.keep
        before = np.r_[0, run][chunk_first]  # the running sum before each chunk's first value
        local = run - np.repeat(before, lay.keep) - 1
        if kept and (local >= lay.lengths[chunk_of]).any():
            raise ValueError("sparse: an index beyond its chunk")
        positions = lay.starts[chunk_of] + local
        values = tables[lay.segment[chunk_of], codes].astype(np.float32)
        return positions, values

    def decode(self, data: bytes, numel: int) -> torch.Tensor:
        positions, values = self.decode_sparse(data, numel)
        out = np.zeros(numel, dtype=np.float32)
        out[positions] = values
        return _tensor(out)

    # ---- what it costs and what it loses -------------------------------------------------------------------------
    def payload_bytes_bound(self, numel: int) -> int:
        """The largest payload a vector of ``numel`` values can have (peers refuse larger ones unread)."""
        lay = self.layout(numel)
        # the largest codes: every gap at most len, coded with Rice parameter r costs (len >> r) + kept (r + 1)
        chunks = len(lay.starts)
        worst = max(int((lay.lengths >> r).sum()) + lay.kept + int((lay.keep * r).sum())
                    for r in range(1 << RICE_FIELD_BITS))  # bits of unary stream and remainders together
        return (_HEADER.size + 4 * (1 << self.bits) * lay.segments + _field_bytes(np.full(chunks, RICE_FIELD_BITS))
                + 4 + worst // 8 + 2 + _field_bytes(np.full(lay.kept, self.bits, dtype=np.int64)))

    def error_bound(self, x: torch.Tensor) -> float:
        """The largest dropped magnitude, or the quantization error: at most a bin's width ``2r / 2**bits`` inside
        ``[-r, r]``, and ``max|v| - r + width`` for values clipped into an outer bin."""
        a = _f32(x)
        if a.size == 0:
            return 0.0
        lay = self.layout(a.size)
        local = self.select(a, lay)
        chunk_of = np.repeat(np.arange(len(lay.starts)), lay.keep)
        kept_pos = lay.starts[chunk_of] + local
        dropped = np.ones(a.size, dtype=bool)
        dropped[kept_pos] = False
        bound = float(np.abs(a[dropped]).max(initial=0.0))
        v = a[kept_pos].astype(np.float64)
        seg = lay.segment[chunk_of]
        for s in range(lay.segments):
            vs = v[seg == s]
            if vs.size == 0:
                continue
            top = float(np.abs(vs).max())
            r = self._bin_range(vs)
            width = 2 * r / (1 << self.bits)
            bound = max(bound, width, top - r + width)
        return bound * (1 + 1e-6) + 1e-12


def sparse_mean(supports: Sequence[tuple[np.ndarray, np.ndarray]], weights: Sequence[float], numel: int,
                scales: Optional[Sequence[float]] = None) -> torch.Tensor:
    """Each position averaged over the contributions that sent it: ``sum w_i s_i v_i / sum w_i`` over the peers
    whose support holds the position (zero where none does). ``supports``: (positions, values) per contribution, in
    the group's order, which every peer uses, so that every peer computes the very same float32 sums."""
    total = np.zeros(numel, dtype=np.float64)
    weight = np.zeros(numel, dtype=np.float64)
    for (positions, values), w, s in zip(supports, weights, scales if scales is not None else [1.0] * len(weights)):
        total[positions] += float(w) * float(s) * values.astype(np.float64)  # positions are unique in a payload
        weight[positions] += float(w)
    out = np.divide(total, weight, out=np.zeros_like(total), where=weight > 0)
    return _tensor(out.astype(np.float32))


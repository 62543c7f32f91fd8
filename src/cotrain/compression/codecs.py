"""Codecs for what peers send each other when averaging: a flat float32 vector <-> bytes.

Written here rather than taken from hivemind: hivemind 1.1.12's 8-bit codecs raise under numpy 2, and hivemind
swallows the error, so averaging silently uses part of the peers' data. Each codec documents its error bound and
tests hold it to that bound. Lossy codecs are used with error feedback (the averaging layer keeps what a codec
dropped and adds it to the next round's input).
"""

from __future__ import annotations

import abc
import math

import numpy as np
import torch


class Codec(abc.ABC):
    name = "base"
    lossy = True

    @abc.abstractmethod
    def encode(self, x: torch.Tensor) -> bytes:
        ...

    @abc.abstractmethod
    def decode(self, data: bytes, numel: int) -> torch.Tensor:
        ...

    def encode_result(self, x: torch.Tensor) -> bytes:
        """How a reducer sends back an averaged part (the same as ``encode`` unless a codec says otherwise)."""
        return self.encode(x)

    def decode_result(self, data: bytes, numel: int) -> torch.Tensor:
        return self.decode(data, numel)

    @abc.abstractmethod
    def error_bound(self, x: torch.Tensor) -> float:
        """The largest absolute error ``decode(encode(x))`` may have, element-wise."""
        ...

    def __repr__(self) -> str:
        return self.name


def _f32(x: torch.Tensor) -> np.ndarray:
    return x.detach().to(torch.float32).contiguous().cpu().numpy().reshape(-1)


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(a, dtype=np.float32, copy=True))


def _check(data: bytes, expected: int, what: str) -> None:
    if len(data) != expected:
        raise ValueError(f"{what}: expected {expected} bytes, got {len(data)}")


class NoCompression(Codec):
    """float32 as is: 4 bytes per value, exact."""

    name, lossy = "none", False

    def encode(self, x):
        return _f32(x).astype("<f4", copy=False).tobytes()

    def decode(self, data, numel):
        _check(data, 4 * numel, "none")
        return _tensor(np.frombuffer(data, dtype="<f4"))

    def error_bound(self, x):
        return 0.0


class Float16(Codec):
    """IEEE half precision: 2 bytes per value. Relative error at most 2**-11 within fp16's range (|x| <= 65504,
    larger values are clipped); values below 2**-14 lose precision to at most 2**-25 absolute."""

    name = "fp16"

    # the casts are torch's: numpy converts to and from half precision in software, and an update's small values
    # (fp16's subnormals, below 6.1e-5) took it 75x longer (a 1.1 MB part of gradients: 32 ms to encode against
    # 0.4; the bits are the same), which made sync rounds in fp16 slower than in fp32
    def encode(self, x):
        half = x.detach().to(torch.float32).reshape(-1).clamp(-65504, 65504).to(torch.float16).cpu().numpy()
        return half.astype("<f2", copy=False).tobytes()

    def decode(self, data, numel):
        _check(data, 2 * numel, "fp16")
        return torch.from_numpy(np.frombuffer(data, dtype="<f2").astype(np.float16)).to(torch.float32)

    def error_bound(self, x):
        a = float(x.abs().max()) if x.numel() else 0.0
        return min(a, 65504.0) * 2.0**-11 + 2.0**-24 + max(0.0, a - 65504.0)


class Int8Blockwise(Codec):
    """Blockwise absmax quantisation: per block of ``block`` values one float32 scale (absmax / 127) and one int8 per
    value: 1 + 4/block bytes per value. Error at most half a step: absmax(block) / 254."""

    name = "int8"
    levels = 127  # codes -levels..levels

    def __init__(self, block: int = 256):
        self.block = block

    def _blocks(self, numel: int) -> int:
        return math.ceil(numel / self.block)

    def _as_blocks(self, values: np.ndarray) -> np.ndarray:
        """-> float32 (blocks, block), the values zero-padded to whole blocks"""
        padded = np.zeros(self._blocks(values.size) * self.block, dtype=np.float32)
        padded[: values.size] = values
        return padded.reshape(-1, self.block)

    def _quantize(self, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """-> (float32 scale per block, int8 codes of the values, unpadded)"""
        a = _f32(x)
        padded = self._as_blocks(a)
        scale = (np.abs(padded).max(axis=1) / self.levels).astype(np.float32)
        safe = np.where(scale > 0, scale, 1.0).astype(np.float32)
        q = np.clip(np.rint(padded / safe[:, None]), -self.levels, self.levels).astype(np.int8)
        return scale, q.reshape(-1)[: a.size]

    def _dequantize(self, scale: np.ndarray, q: np.ndarray, numel: int) -> torch.Tensor:
        return _tensor((self._as_blocks(q) * scale[:, None]).reshape(-1)[:numel])

    def encode(self, x):
        scale, q = self._quantize(x)
        return scale.astype("<f4").tobytes() + q.tobytes()

    def decode(self, data, numel):
        nb = self._blocks(numel)
        _check(data, 4 * nb + numel, self.name)
        return self._dequantize(np.frombuffer(data[: 4 * nb], dtype="<f4"), np.frombuffer(data[4 * nb:], np.int8),
                                numel)

    def error_bound(self, x):
        a = _f32(x)
        if a.size == 0:
            return 0.0
        return float(np.abs(a).max()) / (2 * self.levels) * (1 + 1e-6)


class Int4Blockwise(Int8Blockwise):
    """Blockwise absmax quantisation to 4 bits: per block one float32 scale (absmax / 7) and a code in -7..7 per
    value, two codes to a byte: 1/2 + 4/block bytes per value (half of int8). Error at most absmax(block) / 14:
    coarse, so use it with error feedback (the default), which sends what one round rounded away in the next."""

    name = "int4"
    levels = 7

    def encode(self, x):
        scale, q = self._quantize(x)
        nibbles = (q.astype(np.int16) + 8).astype(np.uint8)  # 1..15
        if nibbles.size % 2:
            nibbles = np.append(nibbles, np.uint8(8))  # a code of 0 pads the odd last value
        return scale.astype("<f4").tobytes() + (nibbles[0::2] | (nibbles[1::2] << 4)).tobytes()

    def decode(self, data, numel):
        nb = self._blocks(numel)
        _check(data, 4 * nb + (numel + 1) // 2, self.name)
        packed = np.frombuffer(data[4 * nb:], dtype=np.uint8)
        nibbles = np.empty(packed.size * 2, dtype=np.int16)
        nibbles[0::2], nibbles[1::2] = packed & 0x0F, packed >> 4
        q = nibbles[:numel] - 8
        if q.size and (q.min() < -self.levels or q.max() > self.levels):
            raise ValueError(f"{self.name}: a code outside -{self.levels}..{self.levels}")
        return self._dequantize(np.frombuffer(data[: 4 * nb], dtype="<f4"), q, numel)


class TopK(Codec):
    """Top-k sparsification: the ``fraction`` largest-magnitude values, sent as uint32 indices plus int8 values
    (blockwise scales over the kept values): 5 + 4/256 bytes per kept value. The dropped values are the error
    (carried to the next round by error feedback); kept values are off by at most absmax(kept block) / 254.

    A reducer sends its averaged part back with every nonzero value kept (the union of its contributors' supports).
    """

    name = "topk"

    def __init__(self, fraction: float = 0.01, block: int = 256):
        if not 0 < fraction <= 1:
            raise ValueError(f"compression.topk_fraction: must be in (0, 1], got {fraction}")
        self.fraction = fraction
        self.values = Int8Blockwise(block)

    def _encode_indices(self, a: np.ndarray, idx: np.ndarray) -> bytes:
        idx = np.sort(idx).astype("<u4")
        return np.uint32(idx.size).astype("<u4").tobytes() + idx.tobytes() + self.values.encode(_tensor(a[idx]))

    def encode(self, x):
        a = _f32(x)
        if a.size == 0:
            return np.uint32(0).astype("<u4").tobytes()
        k = min(a.size, max(1, math.ceil(self.fraction * a.size)))
        idx = np.argpartition(np.abs(a), a.size - k)[a.size - k:]
        return self._encode_indices(a, idx)

    def encode_result(self, x):
        a = _f32(x)
        return self._encode_indices(a, np.flatnonzero(a))

    def decode(self, data, numel):
        if len(data) < 4:
            raise ValueError("topk: truncated header")
        k = int(np.frombuffer(data[:4], dtype="<u4")[0])
        if k > numel:
            raise ValueError(f"topk: {k} indices for {numel} values")
        idx = np.frombuffer(data[4: 4 + 4 * k], dtype="<u4")
        if idx.size != k or (k and int(idx.max()) >= numel):
            raise ValueError("topk: bad indices")
        out = np.zeros(numel, dtype=np.float32)
        out[idx] = self.values.decode(data[4 + 4 * k:], k).numpy()
        return _tensor(out)

    def error_bound(self, x):
        a = _f32(x)
        if a.size == 0:
            return 0.0
        k = min(a.size, max(1, math.ceil(self.fraction * a.size)))
        kth = float(np.partition(np.abs(a), a.size - k)[a.size - k])
        return max(kth, float(np.abs(a).max()) / 254.0 * (1 + 1e-6))


def make_codec(kind: str, topk_fraction: float = 0.01, block: int = 256) -> Codec:
    if kind == "none":
        return NoCompression()
    if kind == "fp16":
        return Float16()
    if kind == "int8":
        return Int8Blockwise(block)
    if kind == "int4":
        return Int4Blockwise(block)
    if kind == "topk":
        return TopK(topk_fraction, block)
    raise ValueError(f"compression.kind: no codec named {kind!r}")

"""Batches for truncated backpropagation through time over a byte range, read lazily in chunks.

The range is cut into ``batch_size`` contiguous streams; each batch takes the next ``seq_len`` bytes of every
stream, so the hidden state of row i at one batch continues row i of the previous batch. Only a small window of
each stream is held in memory, so the range may be far larger than memory.
"""

from __future__ import annotations

from typing import Callable

import torch

ReadFn = Callable[[int, int], bytes]


class StreamBatches:
    def __init__(self, read: ReadFn, start: int, end: int, batch_size: int, seq_len: int, chunk_bytes: int = 1 << 16):
        length = (end - start) // batch_size
        if length < seq_len + 1:
            raise ValueError(
                f"the data range [{start}, {end}) is too small for batch_size={batch_size} x seq_len={seq_len}: "
                f"each stream needs at least {seq_len + 1} bytes"
            )
        self.read, self.batch_size, self.seq_len = read, batch_size, seq_len
        self.stream_len = length
        self.starts = [start + i * length for i in range(batch_size)]
        self.chunk_bytes = max(chunk_bytes, seq_len + 1)
        self.position = 0  # offset inside every stream
        self.epoch = 0
        self._buffers = [b""] * batch_size
        self._buffer_pos = [0] * batch_size

    def _take(self, i: int, offset: int, n: int) -> bytes:
        buf, pos = self._buffers[i], self._buffer_pos[i]
        if not (pos <= offset and offset + n <= pos + len(buf)):
            want = min(self.chunk_bytes, self.stream_len - offset)
            buf = self.read(self.starts[i] + offset, want)
            if len(buf) < n:
                raise IOError(f"data source returned {len(buf)} bytes at offset {self.starts[i] + offset}, expected {n}")
            self._buffers[i], self._buffer_pos[i] = buf, offset
            pos = offset
        return buf[offset - pos: offset - pos + n]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """-> (inputs, targets, new_epoch). new_epoch: the streams wrapped, so reset the carried hidden state."""
        new_epoch = False
        if self.position + self.seq_len + 1 > self.stream_len:
            self.position, new_epoch = 0, True
            self.epoch += 1
        rows = [self._take(i, self.position, self.seq_len + 1) for i in range(self.batch_size)]
        self.position += self.seq_len
        data = torch.frombuffer(bytearray(b"".join(rows)), dtype=torch.uint8).view(self.batch_size, -1).long()
        return data[:, :-1], data[:, 1:], new_epoch

"""Batches for truncated backpropagation through time over a byte range, read lazily in chunks.

``batch_size`` parallel streams; each batch takes the next ``seq_len`` bytes of every stream, so the hidden state of
row i at one batch continues row i of the previous batch. Only a small window of each stream is held in memory, so
the range may be far larger than memory.

Where the streams lie (:func:`stream_ranges`): the split is cut into ``batch_size`` bands, as a plain training
loop over the whole split cuts it (char-rnn, nanoGPT's streams), and a work unit's streams are the same slice of
every band. A swarm whose nodes take the units in turn reads the split as that plain loop reads it, each batch from
all over the text; a unit that is the whole split is that loop. (Streams inside one contiguous unit read one
stretch of text a batch: at 16 streams in a 128 KB unit, a swarm needed 1.77x the plain loop's samples.)
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

ReadFn = Callable[[int, int], bytes]


def stream_ranges(start: int, end: int, streams: int,
                  split: Optional[tuple[int, int]] = None) -> list[tuple[int, int]]:
    """The byte ranges of the ``streams`` streams of the unit ``[start, end)`` of ``split`` (default: the unit
    itself): band ``j`` of the split is ``[split_start + j * band, split_start + (j + 1) * band)`` with ``band =
    len(split) // streams``, and the unit's stream ``j`` is the part of band ``j`` at the unit's place in the split.
    The units of a split tile every band, so an epoch reads every byte once (but the split's last ``len % streams``)."""
    lo, hi = split if split is not None else (start, end)
    if not lo <= start <= end <= hi or streams < 1:
        raise ValueError(f"the unit [{start}, {end}) does not lie in the split [{lo}, {hi}) with {streams} stream(s)")
    size = hi - lo
    band = size // streams
    a, b = (start - lo) * band // size if size else 0, (end - lo) * band // size if size else 0
    return [(lo + j * band + a, lo + j * band + b) for j in range(streams)]


class StreamBatches:
    def __init__(self, read: ReadFn, start: int, end: int, batch_size: int, seq_len: int, chunk_bytes: int = 1 << 16,
                 split: Optional[tuple[int, int]] = None):
        ranges = stream_ranges(start, end, batch_size, split)
        length = ranges[0][1] - ranges[0][0]
        if length < seq_len + 1:
            raise ValueError(
                f"the data range [{start}, {end}) is too small for batch_size={batch_size} x seq_len={seq_len}: "
                f"each stream needs at least {seq_len + 1} bytes"
            )
        self.read, self.batch_size, self.seq_len = read, batch_size, seq_len
        self.stream_len = length
        self.starts = [s for s, _ in ranges]
        self.chunk_bytes = max(chunk_bytes, seq_len + 1)
        self.position = 0  # offset inside every stream
        self.last_position: Optional[int] = None  # where the last batch began in every stream
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

    def last_ranges(self) -> list[tuple[int, int]]:
        """The byte ranges the last batch read, one a stream (none before the first batch)."""
        if self.last_position is None:
            return []
        return [(s + self.last_position, s + self.last_position + self.seq_len + 1) for s in self.starts]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """-> (inputs, targets, new_epoch). new_epoch: the streams wrapped, so reset the carried hidden state."""
        new_epoch = False
        if self.position + self.seq_len + 1 > self.stream_len:
            self.position, new_epoch = 0, True
            self.epoch += 1
        rows = [self._take(i, self.position, self.seq_len + 1) for i in range(self.batch_size)]
        self.last_position = self.position
        self.position += self.seq_len
        data = torch.frombuffer(bytearray(b"".join(rows)), dtype=torch.uint8).view(self.batch_size, -1).long()
        return data[:, :-1], data[:, 1:], new_epoch

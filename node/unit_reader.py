"""A work unit's training data: the bytes of its streams (spread over the training split), read from the coordinator
once and kept while it is the node's unit, so that training the unit again while the coordinator is away needs
nothing from the coordinator. A unit is small (coordinator.unit_bytes). Tasks that collect their own data (world
models) read nothing.
"""

from __future__ import annotations

import threading

from cotrain.client import CoordinatorClient
from cotrain.v1 import coordinator_pb2 as pb


class UnitReader:
    """The batches of a work unit of ``task`` over a training split of ``train_bytes`` bytes; keeps the bytes of the
    last unit it read."""

    def __init__(self, task, client: CoordinatorClient, stop: threading.Event, train_bytes: int):
        self.task, self.client, self.stop = task, client, stop
        self.split = (0, int(train_bytes))
        self._key = None  # (start, end) of the unit whose bytes are kept
        self._pieces: list[tuple[int, bytes]] = []  # (offset in the split, bytes) of each of its streams

    def batches(self, unit: pb.WorkUnit, patience: float = 600.0):
        """``unit``'s batches (the task's train data), its bytes read unless kept. Raises CoordinatorUnavailable
        when the coordinator does not answer within ``patience`` seconds (the unit kept before stays)."""
        task = self.task
        if task.needs_corpus and self._key != (unit.start, unit.end):
            pieces = [(s, self.client.read("train", s, e - s, stop=self.stop, give_up_after=patience))
                      for s, e in task.unit_ranges(unit.start, unit.end, self.split)]
            self._key, self._pieces = (unit.start, unit.end), pieces
        return task.train_data(self._read, unit.start, unit.end, unit.seed, split=self.split)

    def _read(self, offset: int, length: int) -> bytes:
        for start, data in self._pieces:  # the batches never read across two streams
            if start <= offset < start + len(data):
                return data[offset - start: offset - start + length]
        return b""

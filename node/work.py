"""The node's side of work units: ask for a unit, train on it once, report it done, ask again.

The coordinator may be away (restarting, link down) while the swarm trains on: then the node trains its last unit
again rather than idling, keeps its completion reports, and delivers them when the coordinator answers again
(a unit reported twice counts once).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

import grpc

from cotrain.v1 import coordinator_pb2 as pb

from cotrain.client import CoordinatorClient, CoordinatorUnavailable

logger = logging.getLogger(__name__)


class WorkQueue:
    def __init__(self, client: CoordinatorClient, stop: threading.Event, ask_timeout: float = 10.0):
        """``ask_timeout``: seconds to keep retrying an unreachable coordinator before training on the last unit
        again (the next unit's end retries)."""
        self.client, self.stop, self.ask_timeout = client, stop, ask_timeout
        self.unsent: list[tuple[pb.WorkUnit, int]] = []
        #: while the coordinator is away, ask at most once per ``retry_away_s`` and without waiting, so that
        #: training is not held up at every unit's end
        self.away_since: Optional[float] = None
        self.retry_away_s = 15.0
        self._last_try = 0.0
        self.units_done = 0

    def _patience(self) -> Optional[float]:
        """Seconds to keep retrying the coordinator now; None: do not try (it is away and was tried just now)."""
        now = time.monotonic()
        if self.away_since is None:
            return self.ask_timeout
        if now - self._last_try < self.retry_away_s:
            return None
        return 1.0

    def _call(self, fn):
        patience = self._patience()
        if patience is None:
            raise CoordinatorUnavailable("the coordinator is away; asking again later")
        self._last_try = time.monotonic()
        try:
            result = fn(patience)
        except CoordinatorUnavailable:
            if self.away_since is None:
                self.away_since = time.monotonic()
            raise
        if self.away_since is not None:
            logger.info("the coordinator answers again after %.0fs", time.monotonic() - self.away_since)
            self.away_since = None
        return result

    def next_unit(self, on_wait: Optional[Callable[[], None]] = None) -> Optional[pb.WorkUnit]:
        """The next unit; waits while every unit is taken (calling ``on_wait`` first). None when the coordinator is
        unreachable or on stop."""
        while not self.stop.is_set():
            self.flush()
            try:
                response = self._call(lambda patience: self.client.get_work(give_up_after=patience, stop=self.stop))
            except CoordinatorUnavailable as e:
                logger.warning("%s", e)
                return None
            logger.info("work: %s", response.reason)
            if response.HasField("unit"):
                return response.unit
            if on_wait is not None:
                on_wait()
            self.stop.wait(max(0.5, response.retry_after_s))
        return None

    def report(self, unit: pb.WorkUnit, samples: int) -> None:
        self.unsent.append((unit, samples))
        self.flush()

    def flush(self) -> None:
        """Deliver the completion reports the coordinator has not acknowledged yet, oldest first."""
        while self.unsent:
            unit, samples = self.unsent[0]
            try:
                response = self._call(lambda patience: self.client.report_work(
                    unit.epoch, unit.index, samples, give_up_after=patience, stop=self.stop))
            except CoordinatorUnavailable:
                return  # kept; delivered when the coordinator answers again
            except grpc.RpcError as e:
                logger.warning("work unit %d/%d: report refused: %s", unit.epoch, unit.index, e.details())
            else:
                if response.accepted:
                    self.units_done += 1
                logger.info("work unit %d/%d reported: %s", unit.epoch, unit.index, response.reason)
            self.unsent.pop(0)

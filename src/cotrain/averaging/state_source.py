"""Where a peer takes the shared state from when it joins or falls behind: other peers, over the exchange.

:class:`StateSource` finds donors (the peers with the most progress on the board, or the groupmates a round named)
and downloads their state (:func:`~cotrain.averaging.state.download_state`). It returns the checkpoint and changes
nothing: the front (:class:`~cotrain.averaging.rounds.RoundAverager`) takes it in on the main thread.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional, Sequence

from cotrain.averaging.board_view import BoardView
from cotrain.averaging.clock import DhtClock
from cotrain.averaging.state import Progress, download_state, pick_donors
from cotrain.checkpoint import Checkpoint


class StateSource:
    """``view()``: the board as last read; ``read_all()``: every shard's records (a sharded board's view is one
    shard); ``wait_for_read(timeout)``: wait for a first read of the board. ``retry_wait_s``: how long the
    groupmates of a round are asked again for its state (``matchmaking_time``)."""

    def __init__(self, exchange, peer_id: str, run_id: str, *, view: Callable[[], BoardView],
                 read_all: Callable[[], Optional[list]], wait_for_read: Callable[[float], bool], sharded: bool,
                 stale_after: float, progress_interval: float, retry_wait_s: float, stop: threading.Event,
                 now: Callable[[], float] = DhtClock().now):
        self.exchange, self.peer_id, self.run_id, self.sharded = exchange, peer_id, run_id, sharded
        self._view, self._read_all, self._wait_for_read = view, read_all, wait_for_read
        self.stale_after, self.progress_interval, self.retry_wait_s = stale_after, progress_interval, retry_wait_s
        self._stop, self._now = stop, now

    def from_the_swarm(self, timeout: float, on_progress: Optional[Progress] = None) -> Optional[Checkpoint]:
        """The state of the peer with the most progress that sends a valid one; None when no peer does."""
        self._wait_for_read(min(timeout, 3 * self.progress_interval + 5.0))
        donors = pick_donors(self._now(), self.peer_id, self._view().peers, self.stale_after)
        if not donors and self.sharded:  # nobody in our shard's key: look in every shard
            donors = pick_donors(self._now(), self.peer_id, self._read_all() or [], self.stale_after)
        result = download_state(self.exchange, donors, timeout, on_progress, run_id=self.run_id)
        return None if result is None else result[0]

    def from_groupmates(self, donors: Sequence[str], min_round: int, timeout: float) -> Optional[Checkpoint]:
        """The state of the first of ``donors`` that holds round ``min_round`` or later. They apply the round at
        their next local step, so each try waits half a second first; four tries, a whole state each at most."""
        for _ in range(4):
            if self._stop.wait(0.5):
                return None
            result = download_state(self.exchange, donors, min(timeout, self.retry_wait_s), run_id=self.run_id)
            if result is None:
                return None
            try:
                if int(result[0].metadata.get("round", -1)) < min_round:
                    continue
            except (TypeError, ValueError):
                return None
            return result[0]
        return None

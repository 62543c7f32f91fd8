"""The swarm's clock: the time that peers compare with each other.

A board record carries the time it was written, a peer judges another's record by its age, and a round remembers when
it began. These times cross machines, so every peer reads them from one clock: DHT time (hivemind's ``get_dht_time``,
the wall clock on one epoch for all). :class:`~cotrain.averaging.rounds.RoundAverager` and its parts read it through
the :class:`Clock` port; :class:`~cotrain.averaging.testing.ManualClock` is one a test moves by hand.

Not on this clock: the waits for the network (a meeting's wait, an all-reduce's deadline, a download's timeout) and a
thread's pace. They measure how long this process waited, on ``time.monotonic``, which no clock adjustment moves.
"""

from __future__ import annotations

from typing import Protocol

from hivemind.utils import get_dht_time


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on the swarm's epoch (comparable with any peer's record)."""


class DhtClock:
    """The clock of a node: hivemind's DHT time."""

    def now(self) -> float:
        return float(get_dht_time())

"""What a peer counts about its rounds (:class:`RoundStats`): the node's heartbeat, status file and checkpoint read
it, as a snapshot taken under its lock."""

from __future__ import annotations

import collections
import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Sequence

from cotrain.averaging.outcome import Kind, RoundResult

#: rounds kept in RoundStats.history (the most recent): a node of days makes millions
HISTORY_ROUNDS = 4096
#: peers kept in RoundStats.flagged
FLAGGED_PEERS = 1024


@dataclass
class RoundStats:
    """A peer's figures about its rounds. The round's threads write them; others read :meth:`snapshot`, a copy of
    their own that nothing changes afterwards (the heartbeat's thread sorted ``flagged`` while a round wrote it)."""

    rounds_completed: int = 0  # averaged with at least one peer
    partial_rounds: int = 0  # some groupmate's contribution was left out
    last_group_size: int = 0
    #: the peer ids of the last averaged round's group, ourselves out (the board counts them at our round)
    last_group: list = field(default_factory=list)
    #: how the groups of the averaged rounds formed: from the progress board, or by hivemind's matchmaking
    groups_from_board: int = 0
    groups_matchmade: int = 0
    #: rounds whose group was planned as the group of the round before (averaging.group_rounds)
    groups_kept: int = 0
    #: averaged rounds whose all-reduce rode with the board's meeting (a small vector: allreduce.hosted)
    rounds_hosted: int = 0
    #: reads of the progress board this peer made, and those it left out while its group was kept (see
    #: RoundAverager._reads_paused)
    board_reads: int = 0
    board_reads_skipped: int = 0
    #: seconds, in total, the rounds spent forming groups and in the all-reduce (failed rounds included)
    meet_s: float = 0.0
    allreduce_s: float = 0.0
    last_reason: str = ""  # what the last round decision was, or why the last round failed (in the node's log line)
    #: (round, group size) of the last HISTORY_ROUNDS applied rounds: kept in the node's last checkpoint
    history: collections.deque = field(default_factory=lambda: collections.deque(maxlen=HISTORY_ROUNDS))
    #: rounds whose group also averaged its members' differing states (averaging.state_averaging), and downloads
    #: of the shared state (a peer ahead, or a group whose majority held another state)
    states_averaged: int = 0
    resyncs: int = 0
    #: peers whose contributions this peer dropped as reducer (non-finite values, malformed), with the reason
    flagged: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def flag(self, peer: str, why: str) -> None:
        with self._lock:
            if peer in self.flagged or len(self.flagged) < FLAGGED_PEERS:
                self.flagged[peer] = why

    def applied(self, round_number: int, group_size: int, states_averaged: bool = False) -> None:
        """A round applied, with a group of ``group_size`` (1: alone); ``states_averaged``: the group's average of
        its members' states came with it."""
        with self._lock:
            self.states_averaged += int(states_averaged)
            self.last_group_size = group_size
            self.history.append((round_number, group_size))

    def averaged_with(self, group: Sequence[str]) -> None:
        """The last averaged round's group, ourselves out."""
        with self._lock:
            self.last_group = list(group)

    def counted(self, result: RoundResult, kept_before: bool) -> None:
        """A round's ``result`` counted. ``kept_before``: the round's group was the one of the round before, meeting
        again (averaging.group_rounds)."""
        with self._lock:
            self.meet_s += result.meet_s
            self.allreduce_s += result.allreduce_s
            if result.kind in (Kind.APPLY, Kind.RESYNC):
                self.groups_kept += result.from_board and kept_before
                self.partial_rounds += result.partial
            if result.kind is Kind.APPLY:
                self.last_group = sorted(result.group)
                self.rounds_completed += 1
                self.rounds_hosted += result.hosted
                if result.from_board:
                    self.groups_from_board += 1
                else:
                    self.groups_matchmade += 1

    def snapshot(self) -> "RoundStats":
        """A copy to read on another thread: its containers are the reader's own (a tuple, a dict copy)."""
        with self._lock:
            return dataclasses.replace(self, last_group=tuple(self.last_group), history=tuple(self.history),
                                       flagged=dict(self.flagged), _lock=threading.Lock())

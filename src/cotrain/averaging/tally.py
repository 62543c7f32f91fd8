"""Where a peer stands on the swarm's clock: the swarm's samples as its group agreed them, its own, and every peer's
as last seen (:class:`Tally`).

The run's schedule (:mod:`cotrain.optim.schedule`) takes a round's lr from ``samples_total`` and ``round_samples``,
which every member of a group sets from the same figures when it applies the round; with groups smaller than the
swarm the :class:`~cotrain.averaging.ledger.Ledger` adds the other groups' rounds (``swarm_view``). Peers' counts are
hostile: the ledger bounds them by what a peer could have done, and a claim cut, or one its contribution did not
show, is logged once for that peer.
"""

from __future__ import annotations

import logging
import threading
from typing import Iterable, Mapping

from cotrain.averaging.ledger import SPEEDUP_BOUND, Ledger
from cotrain.averaging.outcome import Kind, RoundResult
from cotrain.averaging.overlap import PendingRound
from cotrain.optim.schedule import RoundClock

logger = logging.getLogger(__name__)

#: peers whose cut claims are remembered (each logged once)
MAX_CUT_PEERS = 4096


class Tally:
    """``round_cap``: the most samples a peer could add in a round (the run's batch x H x the speedup bound);
    ``inner_steps`` and ``step_samples`` (the run's H and batch): the pace of a round's steps before any round set
    one (:meth:`round_clock`)."""

    def __init__(self, peer_id: str, round_cap: int, inner_steps: int = 1, step_samples: int = 0):
        self.peer_id, self.inner_steps, self.step_samples = peer_id, inner_steps, step_samples
        #: the swarm's samples as of the last round this peer applied (or the state it took): the shared state's
        #: count, the same on every member of a group. A round's own samples join it when the round is applied
        self.samples_total = 0
        #: the samples the last applied round added, all its members' together (the pace RoundClock keeps)
        self.round_samples = 0
        #: this peer's samples in the rounds it applied, and every peer's as last seen: the swarm's count over all
        #: its groups (cotrain.averaging.ledger), bounded to SPEEDUP_BOUND times the run's pace a round
        self.contributed = 0
        self.ledger = Ledger(round_cap)
        self._cut: set[str] = set()  # peers whose claims were cut (logged once each)
        self._lock = threading.Lock()  # claims come from the board's thread and the round's

    @classmethod
    def for_run(cls, peer_id: str, inner_steps: int, step_samples: int) -> "Tally":
        return cls(peer_id, inner_steps * max(1, step_samples) * SPEEDUP_BOUND, inner_steps, step_samples)

    def round_clock(self) -> RoundClock:
        """Where the next round's local steps stand on the run's schedule: from the shared state's count, at the
        last round's pace (the same on every member of a group)."""
        return RoundClock(self.samples_total, self.round_samples, self.inner_steps, self.step_samples)

    def swarm_view(self) -> int:
        """The swarm's samples as this peer knows them: the shared state's count, or every peer's contributed count
        it saw (groups smaller than the swarm: the other groups' rounds too), whichever is more."""
        return max(self.samples_total, self.ledger.total())

    def observe(self, claims: Iterable[tuple[str, int, int]]) -> None:
        """Take peers' contributed counts (``(peer, round, count)``) into the ledger; a claim beyond what the peer
        could have done is cut, and logged once for that peer."""
        for peer, round_number, count in claims:
            cut = self.ledger.observe(peer, round_number, count)  # the ledger has its own lock
            if cut and self._first_cut(peer):
                logger.warning("peer %s %s: its count is cut to that", peer[-8:], cut)

    def note_credits(self, round_number: int, claimed: Mapping[str, int], credited: Mapping[str, int]) -> None:
        """Log, once for each peer, a claim its contribution did not show half of (cotrain.averaging.work): a liar,
        or a peer whose pseudo-gradient points away from its groupmates'."""
        for peer, claim in claimed.items():
            counted = credited.get(peer, claim)
            if counted * 2 < claim and self._first_cut(peer):
                logger.warning("peer %s claimed %d samples in round %d; its contribution shows %d: counted %d",
                               peer[-8:], claim, round_number, counted, counted)

    def _first_cut(self, peer: str) -> bool:
        with self._lock:
            if peer in self._cut or len(self._cut) >= MAX_CUT_PEERS:
                return False
            self._cut.add(peer)
            return True

    def count_own(self, samples: int, next_round: int) -> None:
        """This peer's ``samples`` of a round joined the swarm's count (``next_round``: the round after it)."""
        with self._lock:
            self.contributed += samples
            self.ledger.own(self.peer_id, next_round, self.contributed)

    def credit_round(self, result: RoundResult, launch: PendingRound, next_round: int) -> None:
        """A round whose average holds this peer's samples, applied or to be downloaded (``result.kind`` APPLY or
        RESYNC): its own samples as the group credited them, and its groupmates' counts as the round said them. For
        RESYNC the swarm's count moves now (the state it downloads next brings the count; should that fail, this
        peer still knows it)."""
        credited = dict(result.contributed).get(self.peer_id, launch.contributed + launch.samples)
        self.count_own(credited - launch.contributed, next_round)
        self.observe((peer, launch.round + 1, count) for peer, count in result.contributed if peer != self.peer_id)
        if result.kind is Kind.RESYNC:
            self.advance(result.swarm, result.samples)

    def advance(self, swarm: int, added: int) -> None:
        """A round applied: the swarm's count is the group's agreed ``swarm`` before it plus its ``added`` samples."""
        self.samples_total = swarm + added
        self.round_samples = added

    def to_metadata(self) -> dict:
        """What the shared state carries of the count (a joiner takes it with :meth:`take`)."""
        with self._lock:
            return dict(samples_total=self.samples_total, round_samples=self.round_samples,
                        ledger=self.ledger.to_metadata())

    def take(self, metadata: Mapping) -> None:
        """The count of a downloaded state (its metadata, checked by the caller to be this run's)."""
        with self._lock:
            self.samples_total = int(metadata.get("samples_total", 0))
            self.round_samples = int(metadata.get("round_samples", 0))
            self.ledger.take(metadata.get("ledger"))
            self.contributed = max(self.contributed, self.ledger.count_of(self.peer_id))  # a node back, same identity
            # a state kept a while (its holder was waiting, or leaving) may count less than the swarm did since:
            # the ledger, the donor's merged in, counts every peer once
            self.samples_total = max(self.samples_total, self.ledger.total())

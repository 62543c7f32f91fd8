"""One round's network side, from its launch to its result: form the group, reduce the contributions, judge.

:meth:`RoundRun.run` takes the round as the node ended it (:class:`~cotrain.averaging.overlap.PendingRound`) and
the hash of the shared state it ended on, and returns a :class:`~cotrain.averaging.outcome.RoundResult`: the
average to apply, a state to download, or why the round failed. It changes no model and no round counter: the
front (:class:`~cotrain.averaging.rounds.RoundAverager`) acts on the result on the main thread, between two local
steps, so a round run on the averaging worker (``averaging.overlap``) and one run in place go the same way.

The group forms at the board's meeting (:class:`~cotrain.averaging.formation.GroupFormer`), falling back to
hivemind's matchmaking where the config allows it; the contributions go through :class:`~cotrain.averaging.
reduction.Reduction` (riding with the meeting when the host reduces a small vector); :func:`~cotrain.averaging.
outcome.round_outcome` decides between applying and downloading the group's state.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping, Optional

import torch

from cotrain.averaging.allreduce import AllReduceFailed, group_tag
from cotrain.averaging.formation import Formation, GroupFormer
from cotrain.averaging.ledger import agreed_count, said_counts
from cotrain.averaging.outcome import (Kind, RoundResult, credited_samples, majority_holders, members_of,
                                       round_outcome)
from cotrain.averaging.overlap import PendingRound
from cotrain.averaging.reduction import Reduction
from cotrain.config import AveragingConfig
from cotrain.verification.witness import PartSigning

#: (round, {peer: why}) for the contributions a round left out as bad (a late one is not reported)
OnDropped = Callable[[int, Mapping[str, str]], None]
#: (round, samples each member claimed, samples each was credited with)
OnCredits = Callable[[int, Mapping[str, int], Mapping[str, int]], None]
#: (round, the hash of the shared state it began on, this peer's contribution flat as the group decoded it): the
#: evidence a validator may ask for (:class:`cotrain.verification.evidence.EvidenceKeeper`)
#: (round, state hash, the contribution as the group decoded it, what this peer reduced of its groupmates')
OnSent = Callable[[int, str, torch.Tensor, tuple], None]


class RoundRun:
    """Runs rounds for one peer. ``shared_copy``: a copy of the strategy's shared tensors, taken consistently (the
    states a group averages when its members' differ, ``averaging.state_averaging``)."""

    def __init__(self, peer_id: str, cfg: AveragingConfig, former: GroupFormer, reduction: Reduction,
                 shared_copy: Callable[[], list[torch.Tensor]], on_dropped: OnDropped, on_credits: OnCredits,
                 on_sent: Optional[OnSent] = None, signing: Optional[Callable[[int], PartSigning]] = None):
        """``signing``: a round's signing of the parts sent and checking of those taken in (verification)."""
        self.peer_id, self.cfg, self.former, self.reduction = peer_id, cfg, former, reduction
        self._shared_copy, self._on_dropped, self._on_credits = shared_copy, on_dropped, on_credits
        self._on_sent, self._signing = on_sent, signing

    def run(self, launch: PendingRound, state_hash: str) -> RoundResult:
        """Form the round's group and run its all-reduce (on the averaging thread with overlap)."""
        weight = float(max(1, launch.claimed))
        started = time.monotonic()
        board = self.cfg.group_formation == "board_only" or (self.cfg.group_formation == "board"
                                                              and self.former.met_round != launch.round)
        signing = self._signing(launch.round) if self._signing is not None else None
        hosting = self.reduction.hosting(launch.contribution, weight, signing) if board else None
        tried = self.former.meet(launch, state_hash, hosting) if board else Formation()
        if tried.formed is None:
            failed = self._not_formed(tried, launch, started)
            if failed is not None:
                return failed
            tried = self.former.matchmake(weight, launch, state_hash)
            if tried.formed is None:
                return RoundResult(Kind.FAILED, tried.reason, meet_s=time.monotonic() - started)
        met = time.monotonic()
        formed = tried.formed
        group, info = formed.group, dict(formed.info)
        # the host reduced at the meeting: its result came with the roster
        by_host = hosting is not None and formed.from_board
        if len(group) < 2:
            if by_host:
                self._on_dropped(launch.round, hosting.dropped)
            return RoundResult(Kind.FAILED, "no admitted groupmate", meet_s=met - started)
        tag = group_tag(f"r{launch.round}", [str(p) for p in group])
        me = next(p for p in group if str(p) == self.peer_id)
        reducers = [info.get(str(p), {}).get("reducer", True) is not False for p in group]
        info.setdefault(self.peer_id, dict(hash=state_hash, samples=launch.claimed, swarm=launch.swarm,
                                           contributed=launch.contributed))
        # every member sees the same hashes at the meeting, so all of them average the states, or none
        differ = len({str(v.get("hash")) for v in info.values()}) > 1
        state = None
        try:
            if by_host:
                reduced = hosting.average(formed.hosted_result, [str(p) for p in group])
            else:
                reduced = self.reduction.allreduce(launch.contribution, tag, group, me, weight, reducers, signing)
            self._on_dropped(launch.round, reduced.dropped)
            if self._on_sent is not None and reduced.sent is not None:
                self._on_sent(launch.round, state_hash, reduced.sent, reduced.seen)
            if self.cfg.state_averaging and differ:
                states = self.reduction.average_states(self._shared_copy(), f"{tag}-state", group, me, reducers)
                self._on_dropped(launch.round, states.dropped)
                state = states.average
        except AllReduceFailed as e:
            if by_host:
                self._on_dropped(launch.round, hosting.dropped)
            return RoundResult(Kind.FAILED, f"all-reduce failed ({e})", meet_s=met - started,
                               allreduce_s=time.monotonic() - met)
        kind, partial, reason = round_outcome(self.peer_id, state_hash, info, reduced.complete, launch.seen)
        if state is not None and kind is Kind.RESYNC:  # the states were averaged: nothing to download
            kind, reason = Kind.APPLY, f"averaged with {len(group) - 1} peer(s), and our states"
        donors = tuple(p for p in majority_holders(info) if p != self.peer_id) if kind is Kind.RESYNC else ()
        samples = credited_samples(info, reduced.credits)
        self._on_credits(launch.round, credited_samples(info), samples)
        views, contributed = said_counts(info, samples)
        return RoundResult(kind, reason, reduced.average, len(group), partial, sum(samples.values()),
                           members_of(group, self.peer_id), formed.from_board, meet_s=met - started,
                           allreduce_s=time.monotonic() - met, state=state, donors=donors,
                           hosted=by_host, swarm=agreed_count(views), contributed=tuple(contributed.items()))

    def _not_formed(self, tried: Formation, launch: PendingRound, started: float):
        """The result of a round whose meeting formed no group, or None: try hivemind's matchmaking."""
        if launch.early:
            return RoundResult(Kind.UNFILLED, tried.reason or "the planned group did not meet",
                               meet_s=time.monotonic() - started)
        if self.former.averager is None and not tried.disagreed and tried.went:
            # board_only: the meeting already waited matchmaking_time for the others; pausing as long again before
            # the next (as after a failed round) left 32 loaded nodes meeting half the time, and four peers' windows
            # seldom overlapped: no group formed in 15 minutes. Meet again at the next step
            return RoundResult(Kind.UNFILLED, tried.reason, meet_s=time.monotonic() - started)
        if tried.disagreed or self.former.averager is None:  # no matchmaking: meet again at the next try
            return RoundResult(Kind.FAILED, tried.reason, meet_s=time.monotonic() - started, reread=tried.disagreed)
        return None

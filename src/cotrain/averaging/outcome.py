"""What became of a round, as plain values: :class:`RoundResult` (apply the average, resync, failed, or an early
meeting that did not fill) and :func:`round_outcome`, the pure decision between applying and resyncing once the
group's all-reduce is done. The network side (:mod:`cotrain.averaging.rounds`) produces a result; the node's main
thread acts on it, so a round averaged in the background (``averaging.overlap``) changes the model only between
two local steps."""

from __future__ import annotations

import collections
import enum
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence


class Kind(enum.Enum):
    APPLY = "apply"  # the group averaged: apply the average and go to the next round
    RESYNC = "resync"  # the group averaged, but our shared state differs from the group's: download it
    FAILED = "failed"  # no group, or the all-reduce failed: train on and retry after a pause
    UNFILLED = "unfilled"  # a meeting (early, or board_only's) not every planned peer came to: train on, no pause


@dataclass(frozen=True)
class RoundResult:
    kind: Kind
    reason: str
    average: Optional[list] = None  # APPLY: the averaged contribution, shaped like ours
    group_size: int = 0
    partial: bool = False  # fewer contributions than the peers seen at the round
    samples: int = 0  # APPLY, RESYNC: the group's samples in the round, every member's as credited (ourselves too)
    group: frozenset = field(default_factory=frozenset)  # the groupmates (ourselves excluded)
    from_board: bool = False  # the group formed from the progress board (else by hivemind's matchmaking)
    meet_s: float = 0.0  # seconds forming the group (the board's meeting, then matchmaking if it fell back)
    allreduce_s: float = 0.0  # seconds in the all-reduce
    #: FAILED because a planned groupmate saw another board: try again once a fresh read of the board came in (the
    #: round's peers may have gone on without us: then the read shows them ahead and we take their state), not
    #: after matchmaking's pause
    reread: bool = False
    #: APPLY with averaging.state_averaging: the group's average of the members' shared states, shaped like
    #: ``RoundAverager._all_shared()``, taken before the round's average is applied (None: the states were one)
    state: Optional[list] = None
    #: RESYNC: the members that hold the group's state (its majority), to download it from
    donors: tuple = ()
    #: the all-reduce rode with the board's meeting (cotrain.averaging.allreduce.hosted)
    hosted: bool = False
    #: APPLY, RESYNC: the swarm's count the group agreed on before this round (cotrain.averaging.ledger), and each
    #: member's contributed count after it ((peer, count), ourselves included)
    swarm: int = 0
    contributed: tuple = ()


def round_outcome(me: str, my_hash: str, info: Mapping[str, Mapping], complete: bool,
                  seen: int) -> tuple[Kind, bool, str]:
    """After a group's all-reduce: apply, or resync because our shared state is not the group's (the majority of
    the members' state hashes, ties broken by the hash so every member picks the same), and whether the round was
    partial. ``info``: member id -> what it said at the meeting (``hash``, ``samples``), ourselves included;
    ``complete``: every contribution arrived; ``seen``: peers at this round on the board, ourselves included.
    -> (kind, partial, reason in words)."""
    majority, votes = _majority(info)
    size = len(info)
    partial = not complete or size < seen
    if my_hash != majority:
        return Kind.RESYNC, partial, (f"our shared state {my_hash} differs from the group's ({votes} of {size} "
                                      f"members hold {majority}): downloading it")
    if not complete:
        return Kind.APPLY, True, f"averaged with {size - 1} peer(s), some contributions left out"
    if size < seen:
        return Kind.APPLY, True, f"averaged {size} of the {seen} peers seen at this round"
    return Kind.APPLY, False, f"averaged with {size - 1} peer(s)"


def _majority(info: Mapping[str, Mapping]) -> tuple[str, int]:
    hashes = collections.Counter(str(v.get("hash")) for v in info.values())
    return max(hashes.items(), key=lambda kv: (kv[1], kv[0]))


def majority_holders(info: Mapping[str, Mapping]) -> list[str]:
    """The members (ids, sorted) whose state is the group's: the hash :func:`round_outcome` says the majority holds.
    A member that resyncs after the round downloads the group's new state from one of them, rather than from the
    peer with the most progress (at 32 nodes that was often a peer rounds ahead, and the member left its group)."""
    majority, _ = _majority(info)
    return sorted(peer for peer, said in info.items() if str(said.get("hash")) == majority)


def credited_samples(info: Mapping[str, Mapping], credits: Optional[Mapping[str, float]] = None) -> dict[str, int]:
    """Each member's samples in the round as the group counts them: what it said at the meeting (``info``, bounded),
    at most the weight the all-reduce credited its contribution with (``credits``: member -> weight,
    :mod:`cotrain.averaging.work`; a member missing from it keeps its claim, one credited 0 was left out). Every
    member computes it from the same values, so the group's total is one figure on all of them."""
    out = {}
    for peer, said in info.items():
        try:
            samples = max(0, min(int(said.get("samples", 0)), 1 << 40))
        except (TypeError, ValueError):
            samples = 0
        if credits is not None and peer in credits:
            samples = min(samples, int(credits[peer]))
        out[peer] = samples
    return out


def members_of(group: Sequence, me: str) -> frozenset:
    return frozenset(str(p) for p in group if str(p) != me)

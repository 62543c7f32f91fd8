"""A round's reduction: a peer's contribution in, the group's average out, as values.

:class:`Reduction` owns what a peer's contributions go through on the wire, round after round: the codec (or
PowerSGD, or the sparse all-gather), the robust aggregator, the error that compression left out (fed back into the
next round's contribution, or handed to the strategy to keep in its local model) and, for benches, an attack. A
round calls :meth:`Reduction.allreduce` (the butterfly, :mod:`cotrain.averaging.allreduce`) or, when the vector is
small enough to ride with the board's meeting, :meth:`Reduction.hosting` and then :meth:`Hosting.average`. Either
returns a :class:`Reduced`: the average, whether every member's contribution was in it, each member's credited
weight (:mod:`cotrain.averaging.work`) and the contributions left out, with why.

Contract: one round at a time (the round's thread); the strategy takes what compression left in its local model
with :meth:`Reduction.take_residual`, between rounds, on the round's thread or after the round's result came back.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from cotrain.averaging.allgather import sparse_allgather
from cotrain.averaging.allreduce import (butterfly_allreduce, contribution_piece, hosted, piece_bound,
                                        hosted_average, hosted_reduce, reputation_of, weighted_mean)
from cotrain.averaging.attacks import EQUIVOCATE, make_attack
from cotrain.averaging.exchange import Exchange
from cotrain.averaging.meeting import MAX_ROSTER_MEMBERS
from cotrain.averaging.robust import build_aggregator
from cotrain.compression import NoCompression, PowerSGD, SparseLowBit, make_codec
from cotrain.config import AveragingConfig, CompressionConfig
from cotrain.verification.witness import PartSigning


@dataclass(frozen=True)
class Feedback:
    """Where what compression left out of a contribution goes (a strategy's choice, :meth:`for_strategy`).

    ``in_params``: into the local model (DiLoCo: it restarts from the new global parameters plus its unsent
    progress), handed over by :meth:`Reduction.take_residual`; else into a buffer added to the next contribution.
    ``outer``: the buffer is the outer optimizer's memory (SparseLoCo's error feedback): kept for every codec,
    lossless ones too, and multiplied by ``decay`` before each send."""

    in_params: bool = False
    outer: bool = False
    decay: float = 1.0


@dataclass(frozen=True)
class Reduced:
    average: list  # shaped like the contribution
    complete: bool  # every member's contribution was in it
    credits: dict = field(default_factory=dict)  # member -> the weight its contribution was credited with
    dropped: dict = field(default_factory=dict)  # member -> why its contribution was left out
    #: this peer's contribution flat, as the group decoded it (None where it is no one vector: PowerSGD)
    sent: Optional[torch.Tensor] = None
    #: what this peer reduced of its groupmates' contributions, each signed by its member (with parts signed:
    #: :class:`~cotrain.verification.witness.PartSigning`)
    seen: tuple = ()


def unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    out, offset = [], 0
    for t in like:
        out.append(flat[offset: offset + t.numel()].reshape(t.shape))
        offset += t.numel()
    return out


class Reduction:
    def __init__(self, exchange: Exchange, cfg: AveragingConfig, compression: CompressionConfig,
                 shapes: Sequence[torch.Size], feedback: Feedback = Feedback(), seed: int = 0, attack: str = ""):
        self.exchange, self.cfg, self.compression, self.feedback = exchange, cfg, compression, feedback
        self.numel = sum(int(torch.Size(s).numel()) for s in shapes)
        if compression.kind == "sparse":
            self.codec = SparseLowBit([int(torch.Size(s).numel()) for s in shapes], compression.sparse_chunk,
                                      compression.sparse_topk, compression.sparse_bits)
        else:
            self.codec = make_codec(compression.kind if compression.kind != "powersgd" else "none",
                                    compression.topk_fraction, compression.block)
        self.powersgd = (PowerSGD([torch.Size(s) for s in shapes], compression.powersgd_rank, seed,
                                  decay=feedback.decay if feedback.outer else 1.0)
                         if compression.kind == "powersgd" else None)
        self.aggregator = (None if compression.kind == "sparse" else  # the sparse all-gather aggregates itself
                           build_aggregator(cfg.aggregation, cfg.trim_fraction, cfg.clip_tau, cfg.clip_multiple))
        self.attack: Optional[Callable[[torch.Tensor], torch.Tensor]] = make_attack(attack, seed) if attack else None
        #: the "equivocate" attack: the evidence shows the honest contribution, the group gets the attacked one
        self.two_faced = attack == EQUIVOCATE
        self.error: Optional[torch.Tensor] = None  # the feedback buffer (not ``in_params``)
        self._residual: Optional[list[torch.Tensor]] = None  # ``in_params``: the last round's unsent part

    def take_residual(self) -> Optional[list[torch.Tensor]]:
        """What the last round did not send, for the local model (``Feedback.in_params``); None once taken."""
        residual, self._residual = self._residual, None
        return residual

    # ---- the butterfly ---------------------------------------------------------------------------------------
    def allreduce(self, contribution: list[torch.Tensor], tag: str, group, me, weight: float,
                  reducers: Sequence[bool], signing: Optional[PartSigning] = None) -> Reduced:
        """The group's average of ``contribution`` (this peer's, weighted ``weight``) over the exchange; ``signing``:
        the round's parts signed and checked (verification). Raises
        :class:`~cotrain.averaging.allreduce.AllReduceFailed` when a reduced part does not come."""
        timeout = self.cfg.allreduce_timeout
        if self.powersgd is not None:
            return self._powersgd(contribution, tag, group, me, weight, reducers)
        flat, sent, use_feedback = self.prepared(contribution)
        if isinstance(self.codec, SparseLowBit):
            result = sparse_allgather(self.exchange, tag, group, me, sent, weight, self.codec, timeout,
                                      self.cfg.aggregation, self.cfg.clip_multiple, reducers)
        else:
            result = butterfly_allreduce(self.exchange, tag, group, me, sent, weight, self.codec, timeout,
                                         self.aggregator, reducers, self.cfg.min_part_values, signing)
        self.took_feedback(contribution, flat, result.sent, use_feedback)
        return Reduced(unflatten(result.average, contribution), result.complete, result.credits, result.dropped,
                       self.shown(flat, result.sent), tuple(result.seen))

    def _powersgd(self, contribution, tag, group, me, weight, reducers) -> Reduced:
        complete, credits, dropped = True, [], {}

        def reduce(vector: torch.Tensor, phase: str) -> torch.Tensor:
            nonlocal complete
            if self.attack is not None:
                vector = self.attack(vector)
            result = butterfly_allreduce(self.exchange, f"{tag}-{phase}", group, me, vector, weight, self.codec,
                                         self.cfg.allreduce_timeout, self.aggregator, reducers,
                                         self.cfg.min_part_values)
            complete = complete and result.complete
            credits.append(result.credits)
            dropped.update(result.dropped)
            return result.average

        average = self.powersgd.reduce(contribution, reduce)
        if self.feedback.outer and self.feedback.in_params:  # its error waits in the local model instead
            self._residual = self.powersgd.take_error()
        # every phase credits each member; the least it was credited with counts
        least = {name: min(c.get(name, 0.0) for c in credits) for name in credits[0]}
        return Reduced(average, complete, least, dropped)

    def average_states(self, like: list[torch.Tensor], tag: str, group, me, reducers: Sequence[bool]) -> Reduced:
        """averaging.state_averaging: the group's mean of its members' shared states (``like``: this peer's, a
        copy), losslessly; each member counts once, whatever its samples, and the run's robust aggregator holds off
        a member sending a wrecked one."""
        flat = torch.cat([t.float().reshape(-1) for t in like])
        result = butterfly_allreduce(self.exchange, tag, group, me, flat, 1.0, NoCompression(),
                                     self.cfg.allreduce_timeout, self.aggregator or weighted_mean, reducers,
                                     self.cfg.min_part_values)
        return Reduced(unflatten(result.average, like), result.complete, result.credits, result.dropped)

    # ---- error feedback --------------------------------------------------------------------------------------
    def prepared(self, contribution: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """A one-pass codec's round: ``contribution`` flat with the error fed back, and what this peer sends (the
        attack of a Byzantine bench applied) -> (flat, sent, whether error feedback is on)."""
        flat = torch.cat([c.detach().float().cpu().reshape(-1) for c in contribution])
        use_feedback = ((self.codec.lossy or self.feedback.outer) and self.compression.error_feedback
                        and self.attack is None)
        if use_feedback and self.error is not None:
            flat = flat + self.feedback.decay * self.error
        sent = self.attack(flat) if self.attack is not None else flat
        return flat, sent, use_feedback

    def shown(self, flat: torch.Tensor, decoded: torch.Tensor) -> torch.Tensor:
        """The contribution this peer shows as the one it sent: ``decoded`` (as the group decoded it), or for the
        "equivocate" attack the honest ``flat`` as the group would have decoded it."""
        return self.codec.decode(self.codec.encode(flat), flat.numel()) if self.two_faced else decoded

    def took_feedback(self, contribution: list[torch.Tensor], flat: torch.Tensor, decoded: torch.Tensor,
                      use_feedback: bool) -> None:
        """The round went through: keep what compression left out of ``flat`` (``decoded``: it as the reducers
        decoded it) for the next round."""
        if use_feedback and self.feedback.in_params:
            self._residual = unflatten(flat - decoded, contribution)
        elif use_feedback:
            self.error = flat - decoded

    # ---- a reduction that rides with the board's meeting --------------------------------------------------------
    def hosts(self, numel: int) -> bool:
        """Whether a contribution of ``numel`` values rides with the meeting (:func:`allreduce.hosted`: a vector the
        butterfly would give one reducer, a one-pass codec)."""
        return self.powersgd is None and not isinstance(self.codec, SparseLowBit) and hosted(
            numel, self.cfg.min_part_values)

    def hosting(self, contribution: list[torch.Tensor], weight: float,
                signing: Optional[PartSigning] = None) -> Optional["Hosting"]:
        """What this round's meeting carries when its all-reduce rides with it; else None."""
        numel = sum(c.numel() for c in contribution)
        return Hosting(contribution, numel, weight, self, signing) if self.hosts(numel) else None

    def deposit_bound(self) -> int:
        """The most bytes of a contribution or a result riding on a meeting (0: none ride)."""
        return Hosting.max_rest_of(self.numel) if self.hosts(self.numel) else 0


@dataclass
class Hosting:
    """A round whose all-reduce rides with the board's meeting: this peer's contribution (``piece``, with its meeting)
    and, should it host the group, the reduction of the group's (:meth:`reduce`, called by meet.hold_meeting).
    The piece is encoded when the meeting first asks for it: a try that finds no group on the board (a peer waiting
    for its shardmates tries at every step) encodes nothing."""

    contribution: list
    numel: int
    weight: float
    reduction: Reduction
    signing: Optional[PartSigning] = None  # the round's pieces signed and checked (verification)
    dropped: dict = field(default_factory=dict)  # the host's: contributions it left out, and why
    took: list = field(default_factory=list)  # the host's: what it took in of each contribution (Reduced.seen)

    @functools.cached_property
    def _sent(self) -> tuple[torch.Tensor, torch.Tensor, bool, bytes]:
        """(the contribution flat with the error fed back, what this peer sent as the host decodes it, whether error
        feedback is on, the piece)."""
        flat, sent, use_feedback = self.reduction.prepared(self.contribution)
        piece, decoded = contribution_piece(sent, self.weight, self.reduction.codec, self.signing)
        return flat, decoded, use_feedback, piece

    @property
    def piece(self) -> bytes:
        return self._sent[3]

    @property
    def max_rest(self) -> int:
        """The most bytes a groupmate's contribution, or the host's result, may take (a larger piece is none)."""
        return self.max_rest_of(self.numel)

    @staticmethod
    def max_rest_of(numel: int) -> int:
        return 8 * MAX_ROSTER_MEMBERS + piece_bound(numel)  # a contribution, or a result with its credits

    def reduce(self, pieces: dict[str, bytes]) -> bytes:
        return hosted_reduce(pieces, self.numel, self.reduction.codec, self.reduction.aggregator, self.dropped,
                             reputation_of(self.reduction.exchange), self.signing, self.took)

    def average(self, result: bytes, group: Sequence[str]) -> Reduced:
        """The host's result for ``group`` (every member's id), and the error compression left out kept for the next
        round. Raises AllReduceFailed for a result that is none. ``dropped``: the host's, when this peer hosted."""
        count, average, credits = hosted_average(result, group, self.numel, self.reduction.codec)
        flat, decoded, use_feedback, _ = self._sent
        self.reduction.took_feedback(self.contribution, flat, decoded, use_feedback)
        return Reduced(unflatten(average, self.contribution), count == len(group), credits, dict(self.dropped),
                       self.reduction.shown(flat, decoded),
                       tuple(part for part in self.took if self.signing is None or part.member != self.signing.me))

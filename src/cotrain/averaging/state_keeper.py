"""The shared state as it goes out to the node and to joiners, and as it comes in from a checkpoint or a peer.

Out: :meth:`StateKeeper.snapshot` (the metadata and a copy of the tensors, taken together) and
:meth:`StateKeeper.encoded` (the checkpoint a joiner downloads); the metadata is the peer's round and the swarm's
count (:class:`~cotrain.averaging.tally.Tally`). In: :meth:`StateKeeper.take` checks a state and writes it under the
shared state's lock; the peer's round and count become the state's, and its round begins afresh, mid-round.
:meth:`StateKeeper.download` takes the state of other peers (:class:`~cotrain.averaging.state_source.StateSource`).

Its part of the front (:class:`~cotrain.averaging.rounds.RoundAverager`): what comes in is taken on the node's main
thread, between two local steps; what goes out is served from any thread.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

import torch

from cotrain.averaging.overlap import PendingRound
from cotrain.averaging.position import Position
from cotrain.averaging.reduction import Reduction
from cotrain.averaging.shared_state import SharedState
from cotrain.averaging.state import Progress
from cotrain.averaging.state_source import StateSource
from cotrain.averaging.strategy import Strategy
from cotrain.averaging.tally import Tally
from cotrain.checkpoint import Checkpoint, shared_tensors_of

logger = logging.getLogger("cotrain.averaging.rounds")  # the round's own log


class StateKeeper:
    """``at`` and ``tally``: the front's position and count, which a state taken in sets; ``now``: the swarm's
    clock."""

    def __init__(self, shared: SharedState, source: StateSource, strategy: Strategy, reduction: Reduction,
                 at: Position, tally: Tally, param_names: Sequence[str], now: Callable[[], float]):
        self.shared, self.source, self.strategy, self.reduction = shared, source, strategy, reduction
        self.at, self.tally, self.param_names, self.now = at, tally, list(param_names), now

    @property
    def hash(self) -> str:
        """The hash of the shared state as it is now: the same on every member of a group after a round."""
        return self.shared.hash()

    def metadata(self) -> dict:
        return dict(round=self.at.round, **self.tally.to_metadata())

    def snapshot(self) -> tuple[dict, list[torch.Tensor]]:
        return self.shared.snapshot(self.metadata)

    def encoded(self) -> bytes:
        """The shared state as a peer downloads it (checkpoint format)."""
        return self.shared.encoded(self.metadata)

    def take(self, metadata: dict, tensors: Sequence[torch.Tensor]) -> None:
        """Take a state in (raises ValueError naming what does not fit). With only the model's parameters (a
        checkpoint a coordinator made, e.g. by shrink and perturb), the strategy's own state starts afresh,
        identically on every peer."""
        params_only = self.shared.check(metadata, tensors)
        self.shared.settle()
        with torch.no_grad(), self.shared.lock:
            self.shared.write(tensors, params_only)
            self.at.enter(int(metadata["round"]), self.now())
            self.tally.take(metadata)
            self.strategy.load_shared_metadata(metadata)
        self.strategy.after_shared_change()
        self.strategy.discard_round()
        self.reduction.error = None
        self.shared.changed()
        self.at.begin(self.tally.round_clock(), mid_round=True)
        logger.info("took the shared state of round %d (state %s)", self.at.round, self.hash)

    def apply(self, average: list[torch.Tensor], carried: Optional[PendingRound], state: Optional[list],
              swarm: int, added: int) -> None:
        """Apply a round's ``average`` through the strategy (with what compression left out of this peer's
        contribution); the swarm's count becomes ``swarm`` plus the round's ``added`` samples, and the peer is at the
        next round. ``state``: the group's average of its members' shared states, taken first. ``carried``: with
        overlap, the round the average is of (the strategy keeps the local steps taken since)."""
        self.shared.settle()
        with torch.no_grad(), self.shared.lock:
            if state is not None:
                for dst, src in zip(self.shared.tensors(), state):
                    dst.copy_(src.to(dst.device, dst.dtype))
            self.strategy.apply(average, carried, self.reduction.take_residual(), self.reduction.feedback.decay)
            self.tally.advance(swarm, added)
            self.at.enter(self.at.round + 1, self.now())
        self.shared.changed()  # hashed while the node takes its next local step: the next round's meeting reads it

    def take_checkpoint(self, ckpt: Checkpoint) -> None:
        self.take(ckpt.metadata, shared_tensors_of(ckpt, self.param_names))

    def download(self, timeout: float = 30.0, on_progress: Optional[Progress] = None, prefer: Sequence[str] = (),
                 min_round: int = 0) -> bool:
        """Take the shared state of the peer with the most progress; False when no peer has a valid one.
        ``prefer``: peers to take it from first, once they hold round ``min_round`` (the groupmates whose state is
        the group's, after a round this peer's state differed in: they apply the round's average at their next
        step, so their state is asked for again for up to ``matchmaking_time``); then as without."""
        if prefer and self._took(self.source.from_groupmates(prefer, min_round, timeout)):
            return True
        return self._took(self.source.from_the_swarm(timeout, on_progress))

    def _took(self, ckpt: Optional[Checkpoint]) -> bool:
        if ckpt is None:
            return False
        try:
            self.take_checkpoint(ckpt)
        except (ValueError, KeyError, TypeError) as e:
            logger.warning("ignoring downloaded state: %s", e)
            return False
        return True

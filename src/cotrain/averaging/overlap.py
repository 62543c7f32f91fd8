"""Bookkeeping of a round averaged in the background while the node trains on (``averaging.overlap``, one outer
step of delay, as in "eager updates" and Streaming DiLoCo).

At the round's end the node takes its contribution and counters (:class:`PendingRound`), hands the group's
meeting and all-reduce to a worker thread, and goes on with the next round's local steps; its counters restart
from zero. When the result arrives (checked after every local step, waited for once the next round's steps are
taken too) the main thread applies it between two steps:

- DiLoCo (eager updates, Kale et al. 2025): when the round is launched the local model goes on from where this
  peer's own pseudo-gradient alone would take the global parameters (the outer step's best guess of the average
  still on its way); when the average arrives the global parameters take the outer step as without overlap, and the
  local model keeps what it learned since: ``local += new_global - guess`` (:func:`carry_local_progress`), so the
  next pseudo-gradient is all the progress since the new global state. Without the guess the local model trains a
  round behind the outer step: in-process (bench/delay.py), an average 9 steps late at H=10 cost 6% of loss under
  Nesterov 0.7 / 0.9, 4% with the guess;
- sync: the optimizer steps with the averaged gradients (one step late), and the gradients accumulated meanwhile
  stay for the next round.

A round that fails or does not fill gives the node back what it took (:meth:`PendingRound.give_back`): its
counters, for sync the gradients it had accumulated, for DiLoCo the local model it had moved to the guess, and the
next round sends everything since the last applied one, as without overlap.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from cotrain.averaging.outcome import Kind, RoundResult

logger = logging.getLogger("cotrain.averaging.rounds")  # the round's own log


@dataclass
class PendingRound:
    round: int
    steps: int  # local steps the contribution holds
    samples: int  # samples they trained on (the contribution's weight)
    reached_h_at: Optional[float]
    contribution: list  # what the node sends, taken at the round's end
    early: bool  # a meeting at once after the H-th step: if it does not fill, train on with no pause
    seen: int  # peers at this round on the board, ourselves included
    clock: Any = None  # the round's RoundClock: where its steps stood on the schedule
    swarm: int = 0  # the swarm's count as this peer knew it at the round's end (said at the meeting)
    contributed: int = 0  # this peer's own samples in the rounds it applied before this one
    claimed: int = 0  # the samples this peer says it trained on (``samples``; a liar of a bench says more)
    held: Any = None  # what the strategy set aside (sync: its accumulated gradients; DiLoCo: its eager guess)
    future: Optional[Future] = field(default=None, repr=False)

    def result(self) -> RoundResult:
        """The round's result, once its thread is done (waits for it); a bug in that thread is a failed round,
        logged with its traceback: the node goes on."""
        try:
            return self.future.result()
        except Exception as e:  # noqa: BLE001 - see above
            logger.error("round %d: the averaging thread failed", self.round, exc_info=e)
            return RoundResult(Kind.FAILED, f"the averaging thread failed ({e!r})")

    def give_back(self, steps: int, samples: int, reached_h_at: Optional[float]) -> tuple[int, int, Optional[float]]:
        """The counters of a node whose round did not happen, given its counters since the round's end: the round
        goes on as if it had never been launched."""
        return self.steps + steps, self.samples + samples, self.reached_h_at or reached_h_at


def carry_local_progress(local: Sequence[torch.Tensor], start: Sequence[torch.Tensor],
                         new_global: Sequence[torch.Tensor]) -> None:
    """DiLoCo with overlap: move the local model to the new global parameters while keeping what it learned since
    it went on from ``start``: ``local = new_global + (local - start)``."""
    with torch.no_grad():
        for p, s, new in zip(local, start, new_global):
            p.add_((new - s).to(p.device, p.dtype))

"""What a strategy is to the rounds: the math of one way of training together, with no network and no threads.

:class:`~cotrain.averaging.rounds.RoundAverager` (the front) takes a :class:`Strategy` by composition: it runs the
rounds, and asks the strategy what a peer contributes, how the group's average is applied, and what the shared
state is. The strategies: :class:`~cotrain.averaging.diloco.DiLoCo` (local steps, an outer step on the averaged
pseudo-gradient) and :class:`~cotrain.averaging.sync.SyncAveraging` (averaged gradients, one optimizer step a
round). The lifecycle of a round, as the front calls it on the node's main thread::

    local_step()                  after every backward pass
    contribution()                at the round's end: what this peer sends
    hold_round(launch)            overlap only: the next round's steps begin before the average is in
    apply(average, carried, ...)  the group's average came: every member applies the same
    give_back_round(launch)       overlap only: the round did not happen, undo hold_round
    discard_round()               the shared state moved on without this round (a download)
    after_shared_change()         the shared state was replaced (a download)
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import torch

from cotrain.averaging.overlap import PendingRound
from cotrain.averaging.reduction import Feedback


class Strategy(Protocol):
    #: its name in the shared state's metadata (a joiner refuses another strategy's state)
    name: str
    #: where what compression left out of its contributions goes (cotrain.averaging.reduction.Feedback)
    feedback: Feedback

    def shared_tensors(self) -> list[torch.Tensor]:
        """Tensors every peer of a round holds identically (downloaded by joiners)."""

    def shared_metadata(self) -> dict:
        """Values the shared state carries besides its tensors."""

    def load_shared_metadata(self, metadata: dict) -> None:
        """Take them from a downloaded state."""

    def local_step(self) -> None:
        """After backward: what a local step does with the gradients."""

    def contribution(self) -> list[torch.Tensor]:
        """What this peer sends at the round's end (on the CPU)."""

    def apply(self, average: list[torch.Tensor], carried: Optional[PendingRound],
              residual: Optional[list[torch.Tensor]], decay: float) -> None:
        """Apply the group's average. ``carried``: with overlap, the round the average is of (the local steps
        taken since are kept); ``residual``: what compression did not send of this peer's contribution, when it
        goes back into the local model (Feedback.in_params), scaled by ``decay``."""

    def set_outer_lr_factor(self, factor: float) -> None:
        """The run's schedule for the outer step (schedule.outer): its lr is the config's times ``factor``."""

    def outer_lr(self) -> Optional[float]:
        """The outer step's lr (None: the strategy takes none)."""

    def discard_round(self) -> None:
        """Forget this round's local work (the shared state moved on)."""

    def hold_round(self, launch: PendingRound) -> Any:
        """Overlap: the round's contribution was just taken; get ready for the next round's steps and return what
        :meth:`give_back_round` needs (kept as ``launch.held``)."""

    def give_back_round(self, launch: PendingRound) -> None:
        """Overlap: the round did not happen; undo :meth:`hold_round`, keeping the steps taken since."""

    def after_shared_change(self) -> None:
        """The shared state was replaced (a download)."""

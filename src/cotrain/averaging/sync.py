"""Collaborative large-batch training: every round the group averages the gradients its peers accumulated over
their local micro-batches, and every peer takes the same optimizer step from the same state (as hivemind's
Optimizer does). With one micro-batch per round this is data-parallel training."""

from __future__ import annotations

import torch

from cotrain.averaging.reduction import Feedback
from cotrain.config import AveragingConfig
from cotrain.optim import init_state, state_tensors


class SyncAveraging:
    """The strategy (cotrain.averaging.strategy.Strategy) of synchronous averaging; ``cfg``: the run's averaging
    section."""

    name = "sync"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: AveragingConfig,
                 grad_clip: float):
        self.model, self.optimizer, self.cfg, self.grad_clip = model, optimizer, cfg, grad_clip
        self.params = list(model.parameters())
        self.feedback = self.feedback_of(cfg)
        init_state(optimizer)  # the optimizer's state is shared: it must exist before the first step
        self.grad_sum = [torch.zeros_like(p) for p in self.params]
        self.micro_batches = 0

    @classmethod
    def feedback_of(cls, cfg: AveragingConfig) -> Feedback:
        return Feedback()

    def shared_metadata(self) -> dict:
        return {}

    def load_shared_metadata(self, metadata: dict) -> None:
        pass

    def set_outer_lr_factor(self, factor: float) -> None:
        pass  # no outer step

    def outer_lr(self) -> None:
        return None

    def after_shared_change(self) -> None:
        pass

    def shared_tensors(self):
        params = list(self.model.parameters())
        return [p.data for p in params] + state_tensors(self.optimizer, params)

    def local_step(self) -> None:
        for acc, p in zip(self.grad_sum, self.params):
            if p.grad is not None:
                acc.add_(p.grad)
        self.micro_batches += 1

    def contribution(self):
        n = max(1, self.micro_batches)
        return [g.detach().cpu() / n for g in self.grad_sum]

    def apply(self, average, carried=None, residual=None, decay: float = 1.0) -> None:
        # with overlap (carried), the gradients accumulated since the round's were taken stay for the next round
        for p, g in zip(self.params, average):
            p.grad = g.to(p.device, p.dtype).clone()
        torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def hold_round(self, launch):
        held = (self.grad_sum, self.micro_batches)
        self.grad_sum = [torch.zeros_like(g) for g in held[0]]
        self.micro_batches = 0
        return held

    def give_back_round(self, launch) -> None:
        grads, micro_batches = launch.held
        for acc, g in zip(self.grad_sum, grads):
            acc.add_(g)
        self.micro_batches += micro_batches

    def discard_round(self) -> None:
        for g in self.grad_sum:
            g.zero_()
        self.micro_batches = 0

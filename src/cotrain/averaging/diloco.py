"""DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models", 2023).

Every peer keeps the round's *global* parameters (identical on every peer) next to its local model. It takes H
local steps with its inner optimizer (AdamW); at the round's end the group averages the pseudo-gradient
``global - local`` (weighted by samples, compressed), and every peer applies the same outer Nesterov step to the
global parameters and restarts its local model from them. The inner optimizer's state stays local.

With ``averaging.outer = "error_feedback"`` (SparseLoCo, Templar 2025) the outer momentum is replaced by each
peer's error-feedback buffer: ``e <- error_decay * e + (global - local)``; the peer sends the compressed ``e``
and keeps what was not sent in it, and the outer step is plain SGD on the average. The buffer's decay does what
momentum did (it carries unsent progress into later rounds), so aggressive codecs lose nothing for good.
"""

from __future__ import annotations

import torch

from cotrain.averaging.overlap import carry_local_progress
from cotrain.averaging.reduction import Feedback
from cotrain.config import AveragingConfig


def outer_step(params, momentum, delta, lr: float, mu: float) -> list[torch.Tensor]:
    """Where SGD with Nesterov momentum ``mu`` (plain SGD at 0) takes ``params`` for the gradient ``delta``, as torch
    computes it, given its ``momentum`` buffers; nothing is changed in place."""
    out = []
    with torch.no_grad():
        for g, m, d in zip(params, momentum, delta):
            d = d.to(g.device, g.dtype)
            step = d + mu * (mu * m + d) if mu > 0 else d
            out.append(g - lr * step)
    return out


class DiLoCo:
    """The strategy (cotrain.averaging.strategy.Strategy) of DiLoCo; ``cfg``: the run's averaging section."""

    name = "diloco"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: AveragingConfig,
                 grad_clip: float):
        self.optimizer, self.cfg, self.grad_clip = optimizer, cfg, grad_clip
        self.params = list(model.parameters())
        self.feedback = self.feedback_of(cfg)
        self.global_params = [p.detach().clone() for p in self.params]
        self.momentum = [torch.zeros_like(p) for p in self.global_params]
        momentum = cfg.outer_momentum if cfg.outer == "nesterov" else 0.0
        # foreach: the multi-tensor step, bitwise the same as the loop torch picks on the CPU, in half the time
        self.outer = torch.optim.SGD(self.global_params, lr=cfg.outer_lr, momentum=momentum, nesterov=momentum > 0,
                                     foreach=True)
        if momentum > 0:
            for p, buf in zip(self.global_params, self.momentum):
                self.outer.state[p]["momentum_buffer"] = buf

    @classmethod
    def feedback_of(cls, cfg) -> Feedback:
        # error feedback through the parameters: after a round the local model restarts from the new global
        # parameters *plus its own progress that the codec did not send* (global - local = the unsent residual),
        # so the next pseudo-gradient carries it and the local model does not have to learn it again.
        # outer = "error_feedback" (SparseLoCo): what this node did not send is decayed each round and sent later, in
        # place of the outer momentum; the outer step is plain SGD. It waits in the local model (error_buffer
        # "model": the model restarts from global - decay x unsent) or apart (error_buffer "separate": from the
        # global parameters)
        outer = cfg.outer == "error_feedback"
        return Feedback(in_params=cfg.outer == "nesterov" or cfg.error_buffer == "model", outer=outer,
                        decay=cfg.error_decay if outer else 1.0)

    def shared_tensors(self):
        return self.global_params + self.momentum

    def local_step(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.optimizer.step()

    def contribution(self):
        return [g.detach().cpu() - p.detach().cpu() for g, p in zip(self.global_params, self.params)]

    def shared_metadata(self) -> dict:
        return {}

    def load_shared_metadata(self, metadata: dict) -> None:
        pass

    def discard_round(self) -> None:
        pass

    def apply(self, average, carried=None, residual=None, decay: float = 1.0) -> None:
        for g, d in zip(self.global_params, average):
            g.grad = d.to(g.device, g.dtype).clone()
        self.outer.step()
        self.outer.zero_grad(set_to_none=True)
        if carried is not None:  # overlap: the local steps taken since the round was launched are kept
            carry_local_progress(self.params, carried.held, self.global_params)
        for i, (p, g) in enumerate(zip(self.params, self.global_params)):
            if carried is None:
                p.copy_(g)
            if residual is not None:
                p.sub_(residual[i].to(p.device, p.dtype), alpha=decay)

    def set_outer_lr_factor(self, factor: float) -> None:
        self.outer.param_groups[0]["lr"] = self.cfg.outer_lr * factor

    def outer_lr(self) -> float:
        return float(self.outer.param_groups[0]["lr"])

    def outer_step_with(self, delta) -> list[torch.Tensor]:
        """Where the outer step would take the global parameters if the group's average were ``delta`` (the outer
        optimizer's state untouched)."""
        group = self.outer.param_groups[0]
        return outer_step(self.global_params, self.momentum, delta, group["lr"], group["momentum"])

    def hold_round(self, launch):
        # eager updates: the next round's local steps start from where this peer's own pseudo-gradient alone would
        # take the global parameters, the best guess of the average that is still on its way (a local model that
        # went on from where it was trains a round behind the outer step, and Nesterov's momentum overshoots it)
        proxy = self.outer_step_with(launch.contribution)
        with torch.no_grad():
            for p, x in zip(self.params, proxy):
                p.copy_(x)
        return proxy

    def give_back_round(self, launch) -> None:
        # the round did not happen: back to the local model the contribution was taken from, plus the steps since
        with torch.no_grad():
            for p, g, d, x in zip(self.params, self.global_params, launch.contribution, launch.held):
                p.add_(g - d.to(g.device, g.dtype) - x)

    def after_shared_change(self) -> None:
        with torch.no_grad():
            for p, g in zip(self.params, self.global_params):
                p.copy_(g)

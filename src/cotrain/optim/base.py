"""What every optimizer of this package shares: state created up front by :meth:`StatefulOptimizer.init_param_state`
(so that ``sync`` can share it before the first step), and the AdamW update used for the params that an
orthogonal optimizer does not orthogonalize."""

from __future__ import annotations

from abc import ABCMeta, abstractmethod

import torch


class StatefulOptimizer(torch.optim.Optimizer, metaclass=ABCMeta):
    """An optimizer whose per-param state is a fixed set of tensors (step counters included), created by
    :meth:`init_param_state` either up front (:func:`cotrain.optim.init_state`) or lazily on the first step.
    A subclass says what the state is and how one param steps (:meth:`update`)."""

    @abstractmethod
    def init_param_state(self, p: torch.Tensor, group: dict) -> dict[str, torch.Tensor]:
        """The state tensors of ``p`` before its first step."""

    @abstractmethod
    def update(self, p: torch.Tensor, grad: torch.Tensor, state: dict, group: dict) -> None:
        """One step of ``p`` (in place) from its gradient, its state and its group's settings."""

    def state_of(self, p: torch.Tensor, group: dict) -> dict:
        state = self.state[p]
        if not state:
            state.update(self.init_param_state(p, group))
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.update(p, p.grad, self.state_of(p, group), group)
        return loss


def adamw_state(p: torch.Tensor) -> dict[str, torch.Tensor]:
    """torch.optim.AdamW's state, same keys and types: ``step`` a float32 scalar tensor, two moment buffers."""
    return {"step": torch.tensor(0.0),
            "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}


def adamw_update(p: torch.Tensor, grad: torch.Tensor, state: dict, lr: float, betas, weight_decay: float,
                 eps: float = 1e-8) -> None:
    """One step of torch.optim.AdamW (decoupled weight decay, bias-corrected moments) on ``p``."""
    beta1, beta2 = betas
    state["step"] += 1
    step = float(state["step"])
    if weight_decay:
        p.mul_(1.0 - lr * weight_decay)
    state["exp_avg"].lerp_(grad, 1.0 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
    bias1 = 1.0 - beta1 ** step
    bias2 = 1.0 - beta2 ** step
    denom = (state["exp_avg_sq"].sqrt() / (bias2 ** 0.5)).add_(eps)
    p.addcdiv_(state["exp_avg"], denom, value=-lr / bias1)

"""Layer-wise adaptive rates: LAMB, LARS and TVLARS. Each weight matrix (ndim >= 2: the embedding, the recurrent
and output matrices) gets a step scaled by a trust ratio ``||w|| / ||update||``, so its relative change per step is
set by the learning rate whatever the scale of its gradient: meant for large collaborative batches (``sync``),
where the averaged gradient shrinks as the swarm grows. Biases and other 1-D params are excluded from the trust
ratio (and from weight decay), as is common (their norms say little about a safe step).

LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes"): the Adam
direction ``r = m_hat / (sqrt(v_hat) + eps) + wd * w``, step ``lr * ||w|| / ||r|| * r`` (trust ratio 1 when a norm
is zero; ``eps`` 1e-6 as in the paper). An Adam direction has entries of about 1, so LAMB's step changes each
matrix by about ``lr`` of its norm per step: where AdamW moves a 0.036-RMS LSTM weight by about ``lr`` absolute,
LAMB moves it by ``lr * 0.036``; for the byte LSTM it needs a larger lr than AdamW (see OptimizerConfig).

LARS (You et al. 2017, "Large Batch Training of Convolutional Networks"): local lr
``eta * ||w|| / ||g + wd * w||`` (``eta`` the trust coefficient, 0.001 in the paper), momentum SGD on the scaled
direction: ``v = mu v + local_lr (g + wd w)``, ``w -= lr v``. A matrix changes by about ``lr * eta / (1 - mu)`` of
its norm per step, so with eta = 0.001 LARS needs lr of order 1 (the ImageNet recipes use 2-30); the excluded 1-D
params take plain momentum SGD steps at ``lr``.

TVLARS (Do et al. 2023, "Revisiting LARS for Large Batch Training Generalization of Neural Networks",
arXiv 2309.14053): LARS without warm-up; the trust ratio is multiplied by the time-varying, sigmoid-like
``phi(t) = 1 / (alpha + exp(lambda (t - d))) + gamma_min`` (t: steps taken, d: delay). It starts high
(``1 / (alpha + exp(-lambda d)) + gamma_min``, about ``1/alpha``), explores, and decays smoothly to
``gamma_min`` (plain LARS at ``gamma_min * lr``) around step ``d`` over about ``1/lambda`` steps. From the paper and
the authors' repository we take the formula; we count t in optimizer steps (the paper's delay is in epochs), and
apply phi to the trust-ratio params only, as the authors' code does.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cotrain.optim.base import StatefulOptimizer, adamw_state


def trust_groups(model: nn.Module) -> list[dict]:
    """Two groups in ``model.parameters()`` order: the matrices (``trust=True``), then the 1-D params."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return [g for g in ({"params": matrices, "trust": True}, {"params": vectors, "trust": False}) if g["params"]]


def _ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator``, 1 when either is zero (a fresh zero matrix, a zero gradient)."""
    ok = (numerator > 0) & (denominator > 0)
    return torch.where(ok, numerator / denominator.clamp_min(1e-30), torch.ones_like(numerator))


def tvlars_factor(step, alpha: float, decay: float, delay: float, floor: float) -> float:
    """TVLARS's ``phi(t) = 1 / (alpha + exp(decay * (t - delay))) + floor``."""
    z = decay * (float(step) - delay)
    if z > 700.0:  # exp overflows; phi is at its floor
        return floor
    return 1.0 / (alpha + math.exp(z)) + floor


class Lamb(StatefulOptimizer):
    """LAMB. State per param: ``exp_avg``, ``exp_avg_sq``, ``step`` (tensor). Groups with ``trust=False`` take
    plain Adam steps without weight decay."""

    def __init__(self, params, lr: float = 1e-2, betas=(0.9, 0.99), weight_decay: float = 0.0, eps: float = 1e-6):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay, eps=eps, trust=True))

    def init_param_state(self, p, group):
        return adamw_state(p)

    def update(self, p, grad, state, group) -> None:
        beta1, beta2 = group["betas"]
        state["step"] += 1
        t = float(state["step"])
        state["exp_avg"].lerp_(grad, 1.0 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        m_hat = state["exp_avg"] / (1.0 - beta1 ** t)
        v_hat = state["exp_avg_sq"] / (1.0 - beta2 ** t)
        update = m_hat / (v_hat.sqrt() + group["eps"])
        if group["trust"]:
            if group["weight_decay"]:
                update.add_(p, alpha=group["weight_decay"])
            update.mul_(_ratio(p.norm(), update.norm()))
        p.add_(update, alpha=-group["lr"])


class Lars(StatefulOptimizer):
    """LARS. State per param: ``momentum_buffer`` and ``step`` (a tensor; TVLARS's clock)."""

    def __init__(self, params, lr: float = 1.0, weight_decay: float = 0.0, momentum: float = 0.9,
                 trust_coefficient: float = 1e-3, **extra_defaults):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                                      trust_coefficient=trust_coefficient, trust=True, **extra_defaults))

    def init_param_state(self, p, group):
        return {"momentum_buffer": torch.zeros_like(p, memory_format=torch.preserve_format),
                "step": torch.tensor(0.0)}

    def factor(self, step, group) -> float:
        """The schedule on the trust ratio: 1 for LARS."""
        return 1.0

    def update(self, p, grad, state, group) -> None:
        direction = grad
        if group["trust"]:
            if group["weight_decay"]:
                direction = direction.add(p, alpha=group["weight_decay"])
            scale = group["trust_coefficient"] * self.factor(state["step"], group)
            direction = direction * (scale * _ratio(p.norm(), direction.norm()))
        state["momentum_buffer"].mul_(group["momentum"]).add_(direction)
        p.add_(state["momentum_buffer"], alpha=-group["lr"])
        state["step"] += 1


class TVLars(Lars):
    """TVLARS: LARS whose trust ratio is multiplied by :func:`tvlars_factor` of the param's step count."""

    def __init__(self, params, lr: float = 1.0, weight_decay: float = 0.0, momentum: float = 0.9,
                 trust_coefficient: float = 1e-3, alpha: float = 1.0, decay: float = 0.01, delay: float = 500.0,
                 floor: float = 0.1):
        super().__init__(params, lr, weight_decay, momentum, trust_coefficient, tv_alpha=alpha, tv_decay=decay,
                         tv_delay=delay, tv_floor=floor)

    def factor(self, step, group) -> float:
        return tvlars_factor(step, group["tv_alpha"], group["tv_decay"], group["tv_delay"], group["tv_floor"])

"""The run's precision applied to a node's training step (the choice: :func:`cotrain.precision.choose_precision`).

The training loop (cotrain.node.runner) runs its forward pass in :meth:`StepPrecision.autocast` and hands the loss
to :meth:`StepPrecision.backward_and_step` instead of calling ``loss.backward()`` and the strategy's local step
itself. fp32 is exactly those two calls: no autocast, no scaler. Nothing here casts the model: autocast computes in
16 bits from float32 parameters, so the parameters, the optimizer's state and what the averaging sends stay
float32, and the gradients the strategy clips and steps with (or accumulates, for sync) are float32 at their true
scale.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable, ContextManager

import torch

from cotrain.config import RunConfig
from cotrain.precision import Precision, choose_precision

logger = logging.getLogger(__name__)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class _LocalStep:
    """What :class:`torch.amp.GradScaler` takes for an optimizer: the optimizer's parameter groups (whose gradients
    it unscales and checks), and as ``step`` the strategy's local step (which clips, then steps the optimizer or
    accumulates the gradients), so the scaler skips that whole local step when the gradients overflowed."""

    def __init__(self, optimizer: torch.optim.Optimizer, local_step: Callable[[], None]):
        self.param_groups = optimizer.param_groups
        self._local_step = local_step
        self.stepped = False

    def step(self) -> None:
        self._local_step()
        self.stepped = True


class StepPrecision:
    """One precision (``fp32``, ``bf16``, ``fp16``) on one device. Device-generic: the node chooses 16 bits on CUDA
    devices only, but bf16 and fp16 work on the CPU too (tests run them there)."""

    def __init__(self, precision: Precision, device: torch.device):
        self.precision = precision
        self.device_type = torch.device(device).type
        self.dtype = DTYPES.get(precision)
        #: fp16's loss scaling: the scale halves when the gradients overflow (that step is skipped) and doubles
        #: after 2000 steps without overflow (torch's defaults)
        self.scaler = torch.amp.GradScaler(self.device_type) if precision == "fp16" else None

    @classmethod
    def for_run(cls, cfg: RunConfig, device: torch.device) -> "StepPrecision":
        """The run config's ``precision`` chosen for its model on ``device``, logged once with its reason. The
        model's width: ``model.hidden_size`` (``model.fast_size`` for fast_slow)."""
        model = cfg.model
        width = model.fast_size if model.kind == "fast_slow" else model.hidden_size
        precision, reason = choose_precision(cfg.precision, model.kind, width, torch.device(device).type)
        logger.info("precision %s: %s", precision, reason)
        return cls(precision, device)

    def autocast(self) -> ContextManager:
        """The forward pass's context (the loss included): torch.autocast for bf16 and fp16, nothing for fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward_and_step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                          local_step: Callable[[], None]) -> bool:
        """Backward from ``loss`` (outside autocast), then ``local_step()`` (the strategy's: clip the gradients and
        step ``optimizer``, or accumulate them). fp16: the loss is scaled for backward and the gradients unscaled
        before ``local_step``, so clipping sees their true norm; when they overflowed, ``local_step`` is skipped
        and the scale lowered. -> whether ``local_step`` ran (False: the update was dropped; the caller counts the
        step as it counts one whose loss was not finite)."""
        if self.scaler is None:
            loss.backward()
            local_step()
            return True
        self.scaler.scale(loss).backward()
        step = _LocalStep(optimizer, local_step)
        self.scaler.unscale_(step)  # type: ignore[arg-type]
        self.scaler.step(step)  # type: ignore[arg-type]  # reads the overflow flag: one device sync
        self.scaler.update()
        return step.stepped

    def scale(self) -> float:
        """fp16's current loss scale (1 without scaling)."""
        return float(self.scaler.get_scale()) if self.scaler is not None else 1.0

"""Shrink and perturb (Ash and Adams, "On Warm-Starting Neural Network Training", NeurIPS 2020).

When training continues on more data, a model warm-started from a trained one generalizes worse than one trained
from scratch; shrinking the trained weights towards zero and adding a little noise from the model's own
initializer restores most of the gap while keeping most of the head start:

    theta <- shrink * theta + perturb * epsilon,    epsilon ~ the model's initializer

The paper's defaults: shrink 0.6, noise scale 0.01. The coordinator applies it once, when a new run starts from an
old run's checkpoint; nodes then receive the result through the normal state download. A node joining a running
run takes an exact copy of the swarm's state (no shrink, no noise), so that averaging stays consistent.
"""

from __future__ import annotations

import torch

from cotrain.models import initial_seed


class WarmStartError(ValueError):
    pass


def shrink_perturb(params: dict[str, torch.Tensor], noise: dict[str, torch.Tensor], shrink: float,
                   perturb: float) -> dict[str, torch.Tensor]:
    """``shrink * params + perturb * noise``, tensor by tensor; ``noise`` holds freshly initialized weights."""
    if set(params) != set(noise):
        missing = sorted(set(params) ^ set(noise))[:5]
        raise WarmStartError(f"the checkpoint's parameters do not match the run's model (differ in {missing})")
    out = {}
    for name, value in params.items():
        if value.shape != noise[name].shape:
            raise WarmStartError(f"parameter {name}: checkpoint shape {tuple(value.shape)}, the run's model has "
                                 f"{tuple(noise[name].shape)}")
        out[name] = shrink * value.float() + perturb * noise[name].float()
    return out


def fresh_parameters(build, seed: int) -> dict[str, torch.Tensor]:
    """The parameters of a model newly built by ``build()`` (which calls :func:`cotrain.models.build_model`) with its
    own initializer from ``seed`` instead of the run's seed; the caller's random state is left as it was."""
    with torch.random.fork_rng(devices=[]), initial_seed(seed):
        torch.manual_seed(seed)  # for a ``build`` that constructs its model itself
        model = build()
    return {name: p.detach().clone() for name, p in model.named_parameters()}

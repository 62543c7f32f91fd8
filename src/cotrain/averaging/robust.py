"""Robust aggregation of the peers' contributions, against a peer that sends garbage or attacks the model.

hivemind has none. Both run on every reducer's part of the butterfly all-reduce, as BTARD does (Gorbunov et al.,
"Secure Distributed Training at Scale", 2022):

- coordinate-wise trimmed mean: per coordinate, drop the ``trim`` largest and smallest values and average the rest;
- CenteredClip (Karimireddy, He and Jaggi, "Learning from History for Byzantine Robust Optimization", ICML 2021):
  start from the coordinate-wise median and iterate ``v <- v + sum_i w_i (x_i - v) min(1, tau / |x_i - v|)``, so
  that no contribution moves the result by more than tau however large it is. ``tau = 0`` picks it per part: the
  median distance of the contributions from the median.
"""

from __future__ import annotations

import math


import torch

from cotrain.averaging.allreduce import Aggregator, weighted_mean


def trimmed_mean(parts: list[torch.Tensor], weights: list[float], trim: float = 0.2) -> torch.Tensor:
    n = len(parts)
    k = min(int(math.floor(trim * n)), (n - 1) // 2)
    if k == 0:
        return weighted_mean(parts, weights)
    stacked = torch.stack(parts).sort(dim=0).values
    return stacked[k: n - k].mean(dim=0)


def centered_clip(parts: list[torch.Tensor], weights: list[float], tau: float = 0.0, iterations: int = 3) -> torch.Tensor:
    if len(parts) == 1:
        return parts[0].clone()
    stacked = torch.stack(parts)
    w = torch.tensor(weights, dtype=stacked.dtype)
    w = w / w.sum()
    v = stacked.median(dim=0).values
    if tau <= 0:
        tau = float((stacked - v).norm(dim=1).median()) or 1e-12
    for _ in range(iterations):
        diff = stacked - v
        norms = diff.norm(dim=1).clamp_min(1e-12)
        scale = (tau / norms).clamp(max=1.0)
        v = v + (w * scale) @ diff
    return v


def build_aggregator(kind: str, trim: float = 0.2, tau: float = 0.0) -> Aggregator:
    if kind == "mean":
        return weighted_mean
    if kind == "trimmed_mean":
        return lambda parts, weights: trimmed_mean(parts, weights, trim)
    if kind == "centered_clip":
        return lambda parts, weights: centered_clip(parts, weights, tau)
    raise ValueError(f"averaging.aggregation: expected mean, trimmed_mean or centered_clip, got {kind!r}")



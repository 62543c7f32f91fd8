"""Comparing a claimed contribution with a validator's replay of it: the same direction, about the same norm.

A validator replays a member's H local steps from the round's global parameters, the member's work unit and the
round's seed (with the node's own training loop, not here), and compares what the member claimed with what it got.
The replay repeats the same arithmetic; what differs between two honest runs is summation order (other kernels,
other hardware), which moves the result by a fraction of a percent on a model that trains stably. An update shifted
in one direction ("a little is enough"), trained on other data, scaled, noise or zeros lands far outside that.

Compare like with like: a contribution that travels compressed is compared with the replay passed through the same
codec, or both are compared decompressed before compression.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

#: replays differ by rounding only (50 AdamW steps of a small MLP in float32 and in float64 agree to a cosine of
#: 1 - 4e-11); 0.99 leaves room for bf16 and long H, and fails an update whose part off the replay's direction is a
#: seventh of its norm or more. Calibrate per model with bench/verify.py, on the hardware validators use
MIN_COSINE = 0.99
#: the claimed norm over the replayed one: the same arithmetic gives the same norm within a few percent; a scaled
#: update (x10, x0.1) is far outside
NORM_RATIO_BOUNDS = (0.95, 1.05)


@dataclass(frozen=True)
class Comparison:
    """Claimed against replayed. ``cosine`` is nan when either is all zeros; ``norm_ratio`` is claimed over replayed
    (inf when only the replay is zero, nan when both are)."""
    verdict: str  # "pass" or "fail"
    reason: str
    cosine: float = math.nan
    norm_ratio: float = math.nan
    claimed_norm: float = math.nan
    replayed_norm: float = math.nan

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


def _mismatch(claimed: Sequence[torch.Tensor], replayed: Sequence[torch.Tensor]) -> str:
    if len(claimed) != len(replayed):
        return f"claimed: {len(claimed)} tensors, the replay has {len(replayed)}"
    for i, (c, r) in enumerate(zip(claimed, replayed)):
        if not isinstance(c, torch.Tensor) or not c.is_floating_point():
            return f"claimed[{i}]: not a floating-point tensor"
        if c.shape != r.shape:
            return f"claimed[{i}]: shape {tuple(c.shape)}, the replay's is {tuple(r.shape)}"
        if not bool(torch.isfinite(c).all()):
            return f"claimed[{i}]: non-finite values"
    return ""


def compare(claimed: Sequence[torch.Tensor], replayed: Sequence[torch.Tensor], *, min_cosine: float = MIN_COSINE,
            norm_ratio_bounds: tuple[float, float] = NORM_RATIO_BOUNDS) -> Comparison:
    """Whether ``claimed`` (a member's contribution, hostile) agrees with ``replayed`` (the validator's) in direction
    (cosine similarity of the flattened vectors at least ``min_cosine``) and norm (claimed over replayed within
    ``norm_ratio_bounds``). Sums are taken in float64, tensor by tensor, without concatenating the model.

    ValueError: bad thresholds, or a non-finite replay (the validator's, not the member's, fault)."""
    low, high = norm_ratio_bounds
    if not -1.0 <= min_cosine <= 1.0:
        raise ValueError(f"min_cosine: expected a number in [-1, 1], got {min_cosine}")
    if not 0.0 < low <= 1.0 <= high < math.inf:
        raise ValueError(f"norm_ratio_bounds: expected 0 < low <= 1 <= high, got {norm_ratio_bounds}")
    if not all(bool(torch.isfinite(r).all()) for r in replayed):
        raise ValueError("replayed: non-finite values")
    why = _mismatch(claimed, replayed)
    if why:
        return Comparison("fail", why)
    dot = claimed_sq = replayed_sq = 0.0
    for c, r in zip(claimed, replayed):
        c64, r64 = c.detach().to(torch.float64).flatten(), r.detach().to(torch.float64).flatten()
        dot += float(c64 @ r64)
        claimed_sq += float(c64 @ c64)
        replayed_sq += float(r64 @ r64)
    claimed_norm, replayed_norm = math.sqrt(claimed_sq), math.sqrt(replayed_sq)
    norms = dict(claimed_norm=claimed_norm, replayed_norm=replayed_norm)
    if claimed_norm == 0.0 and replayed_norm == 0.0:
        return Comparison("pass", "both are all zeros: nothing to train on", **norms)
    if replayed_norm == 0.0:
        return Comparison("fail", f"claims an update of norm {claimed_norm:.3g} where the replay moved nothing",
                          norm_ratio=math.inf, **norms)
    ratio = claimed_norm / replayed_norm
    if claimed_norm == 0.0:
        return Comparison("fail", f"all-zero update where the replay moved by {replayed_norm:.3g}",
                          norm_ratio=ratio, **norms)
    cosine = max(-1.0, min(1.0, dot / (claimed_norm * replayed_norm)))
    figures = dict(cosine=cosine, norm_ratio=ratio, **norms)
    if cosine < min_cosine:
        return Comparison("fail", f"points elsewhere than the replay: cosine {cosine:.4f} (at least {min_cosine})",
                          **figures)
    if not low <= ratio <= high:
        return Comparison("fail", f"{ratio:.3g} times the replay's norm (between {low} and {high})", **figures)
    return Comparison("pass", f"agrees with the replay: cosine {cosine:.4f}, {ratio:.3f} times its norm", **figures)

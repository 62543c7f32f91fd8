"""A contribution's weight as far as its work shows: a fast node counts for its samples, a lie about them for nothing.

A peer says how many samples it trained on in the round, and the group's average weights its pseudo-gradient by
that figure. Nothing checks the figure itself (issue 46's verification will); what the reducer can check is whether
the contribution looks like that much work. Pseudo-gradients of one round start from the same parameters and take
steps of the same lr, so their displacement grows with the steps taken: about as the square root of the steps,
like a random walk's (the default LSTM, 20x the steps of its groupmates: 4.1x their norm from the start, 4.5x after
400 steps; 10x the steps: 3.1-3.2x). So a contribution of norm ``r`` times the group's median norm shows about
``r**2`` times the median's work. It is credited with the median's weight plus at most :data:`SLACK` times the
excess its norm shows, ``1 + SLACK * (r**2 - 1)`` medians (:func:`credited_weights`): a contribution as long as the
median's is credited as the median, however much it claims, so a liar gains nothing from the slack.

- A node that trained k times the median's samples sends a pseudo-gradient about ``sqrt(k)`` times as long: it is
  credited about k, and the aggregators do not clip it back (their radius grows with ``sqrt(credit)``,
  :func:`radius_scales`), so the outer step follows its longer path as a weighted mean would.
- A node that claims 1,000x (or 10^9) with an ordinary pseudo-gradient is credited as the median peer.
- A contribution that points away from its groupmates' (its cosine with their coordinate-wise median is not
  positive: a sign flip, noise) is credited at most the median weight, whatever its norm.
- No contribution is credited more than :data:`MAX_SPEEDUP` times the median weight.

What this cannot tell apart: a peer that scales an honest pseudo-gradient by s and claims s**2 its samples looks
like a fast node, and is credited as one, up to ``MAX_SPEEDUP`` (it pulls the result by at most
``sqrt(MAX_SPEEDUP)`` times the median norm, as a clipped mean with that multiple would). Telling them apart takes
a loss or a replay of its steps.

The credits travel with the reduced parts (:mod:`cotrain.averaging.allreduce`), so every member learns the same
credited samples of every groupmate, and the swarm's clock counts those, not the claims.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from cotrain.averaging.ledger import SPEEDUP_BOUND

#: how much more of the excess work its norm shows a contribution is credited with: the square-root law slightly
#: under-counts long runs of steps (20x the steps: 4.1x the norm, 17x squared, so 1 + 1.25 * 16 = 21x). The slack
#: applies to the excess only: honest norms at equal steps vary by 10-15%, and a slack on the whole figure credited
#: an ordinary norm claiming 1,000x about 1.5x, which ran the swarm's clock 18% fast (docs/results/longrun.md)
SLACK = 1.25
#: no contribution counts for more than this many median contributions (a GPU next to CPUs is tens of times faster):
#: the ledger's bound on a peer's count a round, the same figure
MAX_SPEEDUP = float(SPEEDUP_BOUND)


def lower_median_of(values: Sequence[float]) -> float:
    """The lower of the two middle values (an actual value; a member cannot move it by claiming a large one)."""
    return sorted(values)[(len(values) - 1) // 2]


def credited_weights(parts: Sequence[torch.Tensor], weights: Sequence[float],
                     max_speedup: float = MAX_SPEEDUP, norms: Optional[Sequence[float]] = None) -> list[float]:
    """Each contribution's claimed weight, bounded by the work its norm and direction show (see the module). A
    weight at or below the group's (lower) median weight is kept as claimed; above it, at most the median weight
    times ``1 + SLACK * ((norm / median norm) ** 2 - 1)``, times 1 when the contribution does not point the group's way, and
    never more than ``max_speedup``. Idempotent: crediting credited weights changes nothing. ``norms``: the parts'
    norms when the caller has them (computed here only when some weight is above the median)."""
    n = len(parts)
    weights = [float(w) for w in weights]
    if n < 2:
        return weights
    median_w = lower_median_of(weights)
    if all(w <= median_w for w in weights):
        return weights
    if norms is None:
        norms = [float(torch.linalg.vector_norm(p, dtype=torch.float64)) for p in parts]
    median_n = lower_median_of(norms)
    out = []
    for i, w in enumerate(weights):
        if w <= median_w:
            out.append(w)
            continue
        ratio = norms[i] / median_n if median_n > 0 else 1.0
        evidence = min(max_speedup, max(1.0, 1.0 + SLACK * (ratio * ratio - 1.0)))
        if evidence > 1.0 and not _points_the_groups_way(parts, i):
            evidence = 1.0
        out.append(min(w, median_w * evidence))
    return out


def radius_scales(weights: Sequence[float]) -> list[float]:
    """How far a clip may let each contribution reach, in units of the group's radius: ``sqrt`` of its weight
    over the median weight, at least 1 (a contribution of k times the median's work is about ``sqrt(k)`` times as
    long; clipping it to the median's length would throw its work away)."""
    median_w = lower_median_of(weights)
    if median_w <= 0:
        return [1.0] * len(weights)
    return [max(1.0, math.sqrt(w / median_w)) for w in weights]


def _points_the_groups_way(parts: Sequence[torch.Tensor], i: int) -> bool:
    """Whether contribution ``i`` has a positive cosine with the coordinate-wise median of the others (for an even
    count the mean of the two middle values: the lower one alone is biased low, and two honest pseudo-gradients'
    minimum points away from both)."""
    others = torch.stack([p for j, p in enumerate(parts) if j != i]).sort(dim=0).values
    m = len(others)
    reference = others[m // 2] if m % 2 else (others[m // 2 - 1] + others[m // 2]) / 2
    return float(torch.dot(parts[i].double().reshape(-1), reference.double().reshape(-1))) > 0.0

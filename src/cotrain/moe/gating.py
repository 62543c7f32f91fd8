"""Which experts a chunk of a sequence goes to, and how their answers are mixed: pure functions, no network.

The experts of a mixture-of-experts layer lie on a grid (Learning@home, Ryabinin and Gusev 2020): an expert is named
by one index a grid dimension, ``grid = (4, 4)`` holds 16. The gate scores each dimension's indices separately
(a linear map to ``sum(grid)`` values, not to ``prod(grid)``), and an expert's score is the sum of its indices'
scores; that is what lets a trainer search a grid of thousands of experts, most of them on other machines, for the
best ``k`` of those that are up (:func:`top_k`).

Routing is per chunk of a sequence (hivemind's ``RemoteMixtureOfExperts`` routes per sequence): each row's chunk of
``chunk`` time steps goes to the same ``k`` experts, so one call to an expert carries many time steps. A chunk's
answer is the softmax-weighted sum of the answers that came, renormalized over them (:func:`mix`); a step goes on
when every chunk has at least ``k_min`` answers (:func:`step_decision`), as a dead expert is simply left out.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import torch


def grid_experts(grid: Sequence[int]) -> list[tuple[int, ...]]:
    """Every expert of ``grid``, as its indices, in order."""
    return list(itertools.product(*[range(g) for g in grid]))


def expert_uid(prefix: str, index: Sequence[int]) -> str:
    """An expert's name on the DHT: ``prefix.i.j`` (hivemind's uid form)."""
    return ".".join([prefix, *map(str, index)])


def split_scores(logits: torch.Tensor, grid: Sequence[int]) -> list[torch.Tensor]:
    """The gate's output (..., sum(grid)) -> one (..., g) score per grid dimension."""
    if logits.shape[-1] != sum(grid):
        raise ValueError(f"gate: {logits.shape[-1]} scores for a grid of {list(grid)} (expected {sum(grid)})")
    return list(torch.split(logits, list(grid), dim=-1))


def top_k(dim_scores: Sequence[torch.Tensor], available: Sequence[tuple[int, ...]],
          k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` best of the ``available`` experts for each row: (rows, g_d) scores per grid dimension ->
    (indices into ``available`` (rows, k'), their scores (rows, k')), best first, k' = min(k, len(available)).
    An expert's score is the sum of its indices' scores, and the scores keep their gradient (the gate learns from
    the mixture)."""
    if not available:
        raise ValueError("available: no expert to route to")
    index = torch.as_tensor(available, dtype=torch.long, device=dim_scores[0].device)  # (E, dims)
    if index.shape[1] != len(dim_scores):
        raise ValueError(f"available: experts of {index.shape[1]} dimensions for a grid of {len(dim_scores)}")
    scores = sum(s[:, index[:, d]] for d, s in enumerate(dim_scores))  # (rows, E)
    best = torch.topk(scores, min(k, len(available)), dim=-1)
    return best.indices, best.values


def mix(answers: torch.Tensor, scores: torch.Tensor, answered: torch.Tensor) -> torch.Tensor:
    """The chunks' mixture: ``answers`` (rows, k, ...) of the experts each row was sent to, ``scores`` (rows, k)
    their gate scores, ``answered`` (rows, k) bool whether each answered (an unanswered one's values are ignored) ->
    (rows, ...): the softmax of the answered experts' scores times their answers. A row with no answer gets zeros."""
    masked = scores.masked_fill(~answered, -math.inf)
    weights = torch.softmax(masked, dim=-1).nan_to_num(0.0)  # a row of no answer: all -inf -> NaN -> 0
    answers = answers.masked_fill(~answered.reshape(*answered.shape, *[1] * (answers.dim() - 2)), 0.0)
    return torch.einsum("rk,rk...->r...", weights.to(answers.dtype), answers)


@dataclass(frozen=True)
class StepDecision:
    go: bool
    reason: str


def step_decision(answered: torch.Tensor, k_min: int) -> StepDecision:
    """Whether a training step goes on with the experts that answered: every chunk (a row of ``answered``, rows x k)
    needs ``k_min`` answers. -> the decision, with the reason in words."""
    counts = answered.sum(dim=-1)
    short = int((counts < k_min).sum())
    if short:
        return StepDecision(False, f"{short} of {counts.numel()} chunks had fewer than k_min = {k_min} experts "
                                   f"answer (the fewest: {int(counts.min())})")
    return StepDecision(True, f"every chunk had at least {k_min} of {answered.shape[-1]} experts answer")

"""A mixture-of-experts layer whose experts may live anywhere: in this process, or on other machines.

The layer owns the gate; the experts are a :class:`Experts` it is given, which answers a batch of requests with an
output for each expert that answered. :class:`LocalExperts` holds them in this process (the reference a
decentralized mixture is measured against); an expert host's client answers for remote ones, leaving out those that
did not answer within their deadline. Routing and mixing are :mod:`cotrain.moe.gating`'s pure functions.
"""

from __future__ import annotations

from typing import Optional, Protocol, Sequence

import torch
from torch import nn

from cotrain.moe.gating import grid_experts, mix, split_scores, step_decision, top_k


class TooFewExperts(RuntimeError):
    """Fewer experts than ``k_min`` answered for some chunk: the training step is to be skipped (the reason says
    which)."""


class Experts(Protocol):
    def available(self) -> list[int]:
        """The experts that may be called now, as indices into the grid's experts (:func:`grid_experts`)."""

    def __call__(self, requests: dict[int, torch.Tensor]) -> dict[int, Optional[torch.Tensor]]:
        """expert -> its inputs (n, chunk, dim) -> expert -> its outputs (n, chunk, dim), None where it did not
        answer."""


class FeedForward(nn.Module):
    """An expert: a position-wise MLP, dim -> hidden -> dim."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


class LocalExperts(nn.Module):
    """Every expert of the grid in this process: each answers, always."""

    def __init__(self, count: int, dim: int, hidden: int):
        super().__init__()
        self.experts = nn.ModuleList(FeedForward(dim, hidden) for _ in range(count))

    def available(self) -> list[int]:
        return list(range(len(self.experts)))

    def __call__(self, requests: dict[int, torch.Tensor]) -> dict[int, Optional[torch.Tensor]]:
        return {e: self.experts[e](x) for e, x in requests.items()}


class MixtureLayer(nn.Module):
    """h + the mixture of the ``k`` best available experts for each chunk of ``chunk`` time steps of each row (the
    chunk's mean, layer-normalized, is what the gate scores). Raises :class:`TooFewExperts` when a chunk got fewer
    than ``k_min`` answers."""

    def __init__(self, dim: int, grid: Sequence[int], k: int, k_min: int, chunk: int, experts: Experts):
        super().__init__()
        self.grid, self.k, self.k_min, self.chunk = tuple(grid), k, k_min, chunk
        self.cells = grid_experts(grid)
        self.norm = nn.LayerNorm(dim)
        self.gate = nn.Linear(dim, sum(grid))
        self.experts = experts

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        batch, time, dim = h.shape
        chunks = -(-time // self.chunk)
        x = nn.functional.pad(self.norm(h), (0, 0, 0, chunks * self.chunk - time))
        x = x.reshape(batch * chunks, self.chunk, dim)
        valid = torch.ones(batch, chunks * self.chunk, 1, dtype=x.dtype, device=x.device)
        valid[:, time:] = 0
        valid = valid.reshape(batch * chunks, self.chunk, 1)
        summary = (x * valid).sum(dim=1) / valid.sum(dim=1)  # each chunk's mean over its real time steps
        available = self.experts.available()
        if len(available) < self.k_min:
            raise TooFewExperts(f"{len(available)} expert(s) of the layer can be called, fewer than k_min = "
                                f"{self.k_min}")
        picked, scores = top_k(split_scores(self.gate(summary), self.grid), [self.cells[e] for e in available], self.k)
        expert_of = torch.as_tensor(available, device=picked.device)[picked]  # (rows, k) grid indices
        answers = x.new_zeros(*expert_of.shape, self.chunk, dim)
        answered = torch.zeros(expert_of.shape, dtype=torch.bool, device=x.device)
        slots = {e: (expert_of == e).nonzero(as_tuple=True) for e in expert_of.unique().tolist()}
        outputs = self.experts({e: x[rows] for e, (rows, _) in slots.items()})
        for e, (rows, ks) in slots.items():
            out = outputs.get(e)
            if out is not None:
                answers[rows, ks] = out.to(answers.dtype)
                answered[rows, ks] = True
        decision = step_decision(answered, min(self.k_min, answered.shape[1]))
        if not decision.go:
            raise TooFewExperts(decision.reason)
        y = mix(answers, scores, answered).reshape(batch, chunks * self.chunk, dim)[:, :time]
        return h + y

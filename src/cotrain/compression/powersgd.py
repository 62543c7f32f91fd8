"""PowerSGD (Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization", NeurIPS 2019): each matrix-shaped update M is sent as two thin factors, with error feedback and
with Q warm-started from the previous round (one power-iteration step per round).

Per round, for every matrix M (a parameter reshaped to rows x rest, after adding the error kept from last round):

1. P = M Q, all-reduced (mean) with the peers; P is orthonormalised;
2. Q' = M^T P, all-reduced (mean); the shared update is P Q'^T, the same on every peer;
3. error = M - P (M^T P)^T (what this peer's own factors missed) is added to next round's M; Q' is next round's Q.

Vectors and matrices too small to gain from a rank-r factorisation are all-reduced as they are. Q is part of the
state a joining peer downloads, so that everyone multiplies by the same Q.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

AllReduce = Callable[[torch.Tensor, str], torch.Tensor]


class PowerSGD:
    def __init__(self, shapes: Sequence[torch.Size], rank: int = 4, seed: int = 0, decay: float = 1.0):
        if rank < 1:
            raise ValueError(f"compression.powersgd_rank: must be >= 1, got {rank}")
        self.rank = rank
        self.shapes = [torch.Size(s) for s in shapes]
        self.matrices = [i for i, s in enumerate(self.shapes)
                         if len(s) >= 2 and min(s[0], math.prod(s[1:])) > rank
                         and rank * (s[0] + math.prod(s[1:])) < s[0] * math.prod(s[1:])]
        self.dense = [i for i in range(len(self.shapes)) if i not in self.matrices]
        self.seed = seed
        #: the error kept from last round is multiplied by this before it is added (DiLoCo's outer error feedback
        #: decays it; 1: classic PowerSGD error feedback)
        self.decay = decay
        self.q: list[torch.Tensor] = []
        self.reset()

    def reset(self) -> None:
        """Q from the seed (the same on every peer) and no error kept: the state of a run's first round."""
        generator = torch.Generator().manual_seed(self.seed)
        fresh = [torch.randn(math.prod(self.shapes[i][1:]), self.rank, generator=generator) for i in self.matrices]
        if self.q:
            for q, f in zip(self.q, fresh):
                q.copy_(f)
        else:
            self.q = fresh
        self.error = [torch.zeros(self.shapes[i]) for i in self.matrices]

    def take_error(self) -> list[torch.Tensor]:
        """What this peer's factors missed last round, one tensor per shape (zeros for those sent densely), and no
        error kept from now on: for a caller that keeps the error itself (in the local model)."""
        out = [torch.zeros(s) for s in self.shapes]
        for i, e in zip(self.matrices, self.error):
            out[i] = e
        self.error = [torch.zeros(self.shapes[i]) for i in self.matrices]
        return out

    def state_tensors(self) -> list[torch.Tensor]:
        """The Q factors every peer must share (downloaded by a joining peer with the rest of the state)."""
        return self.q

    def payload_values(self) -> tuple[int, int]:
        """Values sent per round in phase P and phase Q (the dense tensors go with P)."""
        p = sum(self.shapes[i][0] * self.rank for i in self.matrices) + sum(self.shapes[i].numel() for i in self.dense)
        q = sum(math.prod(self.shapes[i][1:]) * self.rank for i in self.matrices)
        return p, q

    def reduce(self, deltas: Sequence[torch.Tensor], allreduce: AllReduce) -> list[torch.Tensor]:
        """The averaged update of every tensor; ``allreduce(vector, phase)`` averages a flat vector with the group."""
        m = [(deltas[i].detach().float().cpu() + self.decay * e).reshape(self.shapes[i][0], -1)
             for i, e in zip(self.matrices, self.error)]
        p_local = [mi @ qi for mi, qi in zip(m, self.q)]
        dense = [deltas[i].detach().float().cpu().reshape(-1) for i in self.dense]
        averaged = allreduce(torch.cat([p.reshape(-1) for p in p_local] + dense), "p")
        out: list[torch.Tensor] = [torch.empty(0)] * len(self.shapes)
        offset = 0
        p_hat = []
        for i, p in zip(self.matrices, p_local):
            block = averaged[offset: offset + p.numel()].reshape(p.shape)
            offset += p.numel()
            p_hat.append(torch.linalg.qr(block, mode="reduced")[0])
        for i in self.dense:
            n = self.shapes[i].numel()
            out[i] = averaged[offset: offset + n].reshape(self.shapes[i]).clone()
            offset += n
        q_local = [mi.T @ ph for mi, ph in zip(m, p_hat)]
        errors = [(mi - ph @ ql.T).reshape(self.shapes[i]) for i, mi, ph, ql in zip(self.matrices, m, p_hat, q_local)]
        q_avg = allreduce(torch.cat([q.reshape(-1) for q in q_local]), "q") if q_local else torch.empty(0)
        offset = 0
        new_q = []
        for k, (i, ph) in enumerate(zip(self.matrices, p_hat)):
            q = q_avg[offset: offset + self.q[k].numel()].reshape(self.q[k].shape).clone()
            offset += q.numel()
            new_q.append(q)
            out[i] = (ph @ q.T).reshape(self.shapes[i])
        for q, new in zip(self.q, new_q):  # only once both phases went through
            q.copy_(new)
        self.error = errors
        return out

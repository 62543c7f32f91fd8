"""Byte-level language models built on linear recurrences: LRU, HGRN2 and minGRU.

All three keep the recurrence linear in the state, h_t = a_t * h_{t-1} + b_t, with a_t and b_t computed from the
input alone. Training therefore needs no step-by-step loop through a nonlinear cell: the projections run as a few
large matrix products over the whole (batch x time) block, and the recurrence itself is a cheap elementwise scan
(:func:`linear_scan`), or for HGRN2's matrix-valued state, chunked linear attention (:func:`hgrn2_recurrence`).
Generation still steps one byte at a time with the carried state, like an LSTM.

- ``lru``: Linear Recurrent Unit, Orvieto et al. 2023, "Resurrecting Recurrent Neural Networks for Long
  Sequences" (arXiv:2303.06349).
- ``hgrn2``: Qin et al. 2024, "HGRN2: Gated Linear RNNs with State Expansion" (arXiv:2404.07904).
- ``mingru``: Feng et al. 2024, "Were RNNs All We Needed?" (arXiv:2410.01201).

Each core: input projection embed_dim -> hidden_size, ``num_layers`` pre-norm residual blocks (recurrent layer, then
a position-wise MLP when mlp_ratio > 0), a final LayerNorm. All parameters are real (LRU's complex weights are
stored as real/imaginary pairs) so averaging and gradient compression across the swarm see ordinary float tensors;
only LRU's carried state is complex.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from cotrain.models.hgrn2_recurrence import hgrn2_recurrence
from cotrain.models.rnn_lm import VOCAB_SIZE, ByteLanguageModel
from cotrain.models.scan import at_least_float32 as _at_least_float32, linear_scan

KINDS = ("lru", "hgrn2", "mingru")

# ---- dropout ----------------------------------------------------------------------------------------------------

def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout whose mask comes from 16-bit random integers, four to each 64-bit draw of the generator.

    torch's dropout draws one random number per element (bernoulli_), 6 ms for a 32 x 128 x 256 activation on two
    CPU cores: a sixth of a training step of these models, which use five dropouts. This one takes about 2 ms. The
    drop probability is rounded to a multiple of 1/65536 and the kept values are scaled by the exact keep rate."""
    if not training or p == 0.0:
        return x
    threshold = round(p * 65536)
    n = x.numel()
    bits = torch.randint(-2 ** 63, 2 ** 63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=x.device)
    keep = bits.view(torch.int16)[:n].view(x.shape) >= threshold - 32768
    return x * keep * (65536 / (65536 - threshold))


class Dropout(nn.Dropout):
    """nn.Dropout with the cheaper mask of :func:`dropout` (same probability, train/eval switch and repr)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


# ---- the recurrent layers ------------------------------------------------------------------------------------------

class LRULayer(nn.Module):
    """Linear Recurrent Unit (Orvieto et al. 2023): h_t = lambda * h_{t-1} + gamma * (B u_t), y_t = Re(C h_t) + D u_t,
    with a complex diagonal lambda = exp(-exp(nu_log) + i exp(theta_log)) (|lambda| < 1 by construction) and
    gamma = sqrt(1 - |lambda|^2), which keeps the state's scale independent of how close |lambda| is to 1.

    Initialization: |lambda| uniform on the ring [r_min, r_max] (in squared radius, as in the paper), phase uniform
    in [0, max_phase]. For bytes: r_min = 0.5 gives modes that forget within a byte or two (spelling), r_max = 0.99
    reaches ~70 bytes back (a phrase), about the 128-byte window that truncated BPTT can train; the paper's 0.999
    serves 1000s-step tasks a byte model does not see in one window. max_phase = pi: phase theta and -theta give
    conjugate states, the same outputs under Re(C h) with a free complex C, so phases above pi would only repeat."""

    def __init__(self, hidden_size: int, state_size: int, r_min: float = 0.5, r_max: float = 0.99,
                 max_phase: float = math.pi):
        super().__init__()
        n, h = state_size, hidden_size
        u1, u2 = torch.rand(n), torch.rand(n)
        nu = -0.5 * torch.log(u1 * (r_max ** 2 - r_min ** 2) + r_min ** 2)
        self.nu_log = nn.Parameter(torch.log(nu))
        self.theta_log = nn.Parameter(torch.log(max_phase * u2))
        self.gamma_log = nn.Parameter(0.5 * torch.log(1 - torch.exp(-2 * nu)))  # log sqrt(1 - |lambda|^2)
        # complex B (n x h) and C (h x n) as real (.., 2) pairs laid out so that one real matmul yields the
        # interleaved (re, im) pairs of B u (viewed as complex without a copy), and one real matmul of the
        # interleaved state gives Re(C h) = C_re h_re - C_im h_im: no complex matmul anywhere.
        self.B = nn.Parameter(torch.randn(n, 2, h) / math.sqrt(2 * h))  # the paper's Glorot-like init
        c = torch.randn(h, n, 2) / math.sqrt(n)
        c[..., 1].neg_()  # store -C_im, so the output is a plain matmul
        self.C = nn.Parameter(c)
        self.D = nn.Parameter(torch.randn(h))

    def forward(self, u: torch.Tensor, h0):
        n = self.nu_log.shape[0]
        lam = torch.exp(torch.complex(-torch.exp(self.nu_log), torch.exp(self.theta_log)))
        w_in = (self.B * torch.exp(self.gamma_log)[:, None, None]).reshape(2 * n, -1)
        bu = torch.view_as_complex(_at_least_float32(F.linear(u, w_in)).unflatten(-1, (n, 2)))
        h = linear_scan(lam, bu, h0)
        y = F.linear(torch.view_as_real(h).flatten(-2), self.C.reshape(self.C.shape[0], 2 * n))
        return y + self.D * u, h[:, -1]


class HGRN2Layer(nn.Module):
    """HGRN2 token mixer (Qin et al. 2024): per head, a forget gate f_t in [lb, 1) (lb: this layer's lower bound),
    the input gate 1 - f_t used as the key of an outer-product state
    h_t = diag(f_t) h_{t-1} + (1 - f_t) v_t^T  (expand x expand per head), read out with o_t = q_t^T h_t, then
    y = W_o(norm(o) * silu(W_g x)) (the output gate). Tying the input gate to the forget gate is what lets HGRN2
    expand the state without new parameters: a linear-attention-like memory at the cost of a gated RNN.

    The recurrence runs chunkwise (:func:`hgrn2_recurrence`): the expand x expand state is formed only at chunk
    boundaries, never for every step. The carried state is the last h_t, (batch, heads, expand, expand)."""

    def __init__(self, hidden_size: int, expand_ratio: int):
        super().__init__()
        self.heads, self.expand = hidden_size // expand_ratio, expand_ratio
        self.proj = nn.Linear(hidden_size, 4 * hidden_size)  # q, forget, value, output gate in one matmul
        self.norm = nn.LayerNorm(hidden_size)
        self.out = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor, lower_bound: torch.Tensor, h0):
        batch, time, _ = x.shape
        q, f, v, g = self.proj(x).chunk(4, dim=-1)
        f = lower_bound + (1 - lower_bound) * torch.sigmoid(f)
        heads = (batch, time, self.heads, self.expand)
        o, h = hgrn2_recurrence(q.reshape(heads), f.reshape(heads), v.reshape(heads), h0)
        return self.out(self.norm(o.flatten(2)) * F.silu(g)), h


class MinGRULayer(nn.Module):
    """minGRU (Feng et al. 2024): z_t = sigmoid(W_z x_t), h~_t = W_h x_t, h_t = (1 - z_t) h_{t-1} + z_t h~_t.
    The gates depend on x_t only, so the GRU becomes a linear scan. The paper's g() (which keeps h positive for its
    log-space scan) is not needed here: our scan works on signed values directly."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, 2 * hidden_size)

    def forward(self, x: torch.Tensor, h0):
        z, cand = self.proj(x).chunk(2, dim=-1)
        z = torch.sigmoid(z)
        h = linear_scan(1 - z, z * cand, h0)
        return h, h[:, -1]


# ---- the core: blocks around the recurrent layers ------------------------------------------------------------------

class LinearRecurrentCore(nn.Module):
    """(batch, time, embed_dim), state -> (batch, time, hidden_size), state: input projection, ``num_layers``
    pre-norm residual blocks x + mixer(norm(x)), x + mlp(norm(x)), final LayerNorm. The state is a tuple with one
    tensor per layer (its last recurrent state), None for zeros."""

    def __init__(self, kind: str, embed_dim: int, hidden_size: int, num_layers: int, dropout: float,
                 state_size: int = 0, expand_ratio: int = 8, mlp_ratio: int = 2):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"model.kind: expected one of {KINDS}, got {kind!r}")
        if kind == "hgrn2" and hidden_size % expand_ratio:
            raise ValueError(f"expand_ratio ({expand_ratio}) must divide hidden_size ({hidden_size}) for hgrn2")
        self.kind = kind
        self.in_proj = nn.Linear(embed_dim, hidden_size)
        self.norms = nn.ModuleList(nn.LayerNorm(hidden_size) for _ in range(num_layers))
        if kind == "lru":
            self.mixers = nn.ModuleList(LRULayer(hidden_size, state_size or hidden_size) for _ in range(num_layers))
        elif kind == "hgrn2":
            self.mixers = nn.ModuleList(HGRN2Layer(hidden_size, expand_ratio) for _ in range(num_layers))
            # HGRN's learnable lower bounds on the forget gate, increasing with depth: the cumulative softmax over
            # layers (per channel) minus its first term, so layer 0 may forget freely (bound 0), each layer above
            # remembers at least as long as the one below, and every bound stays < 1. Zeros start the bounds
            # evenly spaced: 0, 1/L, 2/L, ...
            self.lower_bounds = nn.Parameter(torch.zeros(num_layers, hidden_size))
        else:
            self.mixers = nn.ModuleList(MinGRULayer(hidden_size) for _ in range(num_layers))
        self.mlps = nn.ModuleList()
        self.mlp_norms = nn.ModuleList()
        if mlp_ratio > 0:
            for _ in range(num_layers):
                self.mlp_norms.append(nn.LayerNorm(hidden_size))
                self.mlps.append(nn.Sequential(nn.Linear(hidden_size, mlp_ratio * hidden_size), nn.GELU(),
                                               nn.Linear(mlp_ratio * hidden_size, hidden_size)))
        self.drop = Dropout(dropout)
        self.norm = nn.LayerNorm(hidden_size)

    def forward(self, x: torch.Tensor, state=None):
        x = self.in_proj(x)
        if self.kind == "hgrn2":
            p = torch.softmax(self.lower_bounds, dim=0)
            bounds = torch.cumsum(p, dim=0) - p[0]
        new_state = []
        for i, mixer in enumerate(self.mixers):
            h0 = None if state is None else state[i]
            y = self.norms[i](x)
            y, h = mixer(y, bounds[i], h0) if self.kind == "hgrn2" else mixer(y, h0)
            x = x + self.drop(y)
            if self.mlps:
                x = x + self.drop(self.mlps[i](self.mlp_norms[i](x)))
            new_state.append(h)
        return self.norm(x), tuple(new_state)


class LinearRecurrentLM(ByteLanguageModel):
    """A byte-level language model around a :class:`LinearRecurrentCore` (kinds ``lru``, ``hgrn2``, ``mingru``)."""

    def __init__(self, kind: str = "mingru", embed_dim: int = 64, hidden_size: int = 256, num_layers: int = 2,
                 dropout: float = 0.1, state_size: int = 0, expand_ratio: int = 8, mlp_ratio: int = 2,
                 vocab_size: int = VOCAB_SIZE):
        core = LinearRecurrentCore(kind, embed_dim, hidden_size, num_layers, dropout, state_size, expand_ratio,
                                   mlp_ratio)
        super().__init__(embed_dim, core, hidden_size, dropout, vocab_size)
        self.drop = Dropout(dropout)  # the head's dropout, with the cheaper mask
        self.kind = kind

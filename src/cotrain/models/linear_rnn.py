"""Byte-level language models built on linear recurrences: LRU, HGRN2 and minGRU.

All three keep the recurrence linear in the state, h_t = a_t * h_{t-1} + b_t, with a_t and b_t computed from the
input alone. Training therefore needs no step-by-step loop through a nonlinear cell: the projections run as a few
large matrix products over the whole (batch x time) block, and the recurrence itself is a cheap elementwise scan
(:func:`linear_scan`). Generation still steps one byte at a time with the carried state, like an LSTM.

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

from cotrain.models.rnn_lm import VOCAB_SIZE, ByteLanguageModel

KINDS = ("lru", "hgrn2", "mingru")

#: time steps per chunk of the scan. The scan walks the CHUNK positions of every chunk at once (one elementwise op
#: per position over batch x chunks x features), then carries the chunk ends across chunks: about CHUNK + T/CHUNK
#: small ops instead of T, and 4-5 passes over memory instead of the 4 log2(T) of a Hillis-Steele scan.
#: At T = 128, 16 and 8 are equally good on 2 CPU cores; 16 keeps fewer ops at longer sequences.
CHUNK = 16


# ---- the scan ------------------------------------------------------------------------------------------------------

def _scan(a: torch.Tensor, b: torch.Tensor, h0, reverse: bool = False) -> torch.Tensor:
    """h_t = a_t h_{t-1} + b_t over dim 1 (reverse: h_t = a_t h_{t+1} + b_t, from the end), without autograd.

    a has b's number of dims and broadcasts to it (size 1 in time: the same at every step); h0 is
    (batch, *features) or None (zeros). Chunked: within each chunk, scan from zero while keeping the running product
    of a; carry the chunk ends across the chunks; add each chunk's incoming state times the running product. Every
    product is of factors with |a| <= 1 in our cores, so nothing overflows and no division is needed."""
    T = b.shape[1]
    dtype = torch.promote_types(a.dtype, b.dtype)
    if h0 is not None:
        dtype = torch.promote_types(dtype, h0.dtype)
    out = torch.empty(b.shape, dtype=dtype, device=b.device)
    a = a.expand((a.shape[0], T) + tuple(a.shape[2:]))  # stride 0 in time when constant: no copy
    n = T // CHUNK
    if n < 2:  # short sequences (and single-step sampling): a plain loop is fewer ops
        return _scan_loop(a, b, h0, out, range(T - 1, -1, -1) if reverse else range(T))
    length = n * CHUNK
    lo = T - length if reverse else 0  # the chunked region; the remainder goes through the loop afterwards
    ac = a[:, lo:lo + length].unflatten(1, (n, CHUNK))  # splitting a dim: always a view
    bc = b[:, lo:lo + length].unflatten(1, (n, CHUNK))
    oc = out[:, lo:lo + length].unflatten(1, (n, CHUNK))
    # product of a from the chunk's start up to t, at a's own (unbroadcast) size: small when a is shared
    prod = torch.empty(ac.shape, dtype=a.dtype, device=b.device)
    order = range(CHUNK - 1, -1, -1) if reverse else range(CHUNK)
    first = order[0]
    oc[:, :, first] = bc[:, :, first]
    prod[:, :, first] = ac[:, :, first]
    prev = first
    for t in order[1:]:
        torch.addcmul(bc[:, :, t], ac[:, :, t], oc[:, :, prev], out=oc[:, :, t])
        torch.mul(prod[:, :, prev], ac[:, :, t], out=prod[:, :, t])
        prev = t
    # the state entering each chunk: a short sequential scan over the chunk ends
    carry = torch.empty((b.shape[0], n) + tuple(b.shape[2:]), dtype=dtype, device=b.device)
    h = h0
    for k in (range(n - 1, -1, -1) if reverse else range(n)):
        if h is None:
            carry[:, k] = 0
            h = oc[:, k, prev].clone()  # oc is updated in place below
        else:
            carry[:, k] = h
            h = torch.addcmul(oc[:, k, prev], prod[:, k, prev], h)
    oc.addcmul_(prod, carry.unsqueeze(2))
    rest = range(lo - 1, -1, -1) if reverse else range(length, T)
    return _scan_loop(a, b, h, out, rest)


def _scan_loop(a, b, h, out, steps) -> torch.Tensor:
    for t in steps:
        if h is None:
            out[:, t] = b[:, t]
        else:
            torch.addcmul(b[:, t], a[:, t], h, out=out[:, t])
        h = out[:, t]
    return out


class _LinearScan(torch.autograd.Function):
    """Autograd for the scan: the backward pass is the same recurrence run backwards in time,
    g_t = dL/dh_t + conj(a_{t+1}) g_{t+1}, so da_t = g_t conj(h_{t-1}), db_t = g_t, dh0 = conj(a_1) g_1.
    One node instead of one per elementwise op, and only the outputs are kept for backward."""

    @staticmethod
    def forward(ctx, a, b, h0):
        out = _scan(a, b, h0)
        ctx.save_for_backward(a, h0, out)
        ctx.b_shape, ctx.b_dtype = b.shape, b.dtype
        return out

    @staticmethod
    def backward(ctx, grad):
        a, h0, out = ctx.saved_tensors
        # coefficient of g_{t+1} in g_t is conj(a_{t+1}); the last step's coefficient meets a zero state
        if a.shape[1] == 1:
            coef = a.conj()
        else:
            coef = torch.cat([a[:, 1:], torch.zeros_like(a[:, :1])], dim=1).conj()
        g = _scan(coef, grad, None, reverse=True)
        grad_a = grad_b = grad_h0 = None
        if ctx.needs_input_grad[0]:
            da = torch.empty_like(g)
            torch.mul(g[:, 1:], out[:, :-1].conj(), out=da[:, 1:])
            if h0 is None:
                da[:, 0] = 0
            else:
                torch.mul(g[:, 0], h0.conj(), out=da[:, 0])
            if not a.is_complex() and da.is_complex():
                da = da.real
            grad_a = da.sum_to_size(a.shape)
        if ctx.needs_input_grad[1]:
            grad_b = g.real if (g.is_complex() and not ctx.b_dtype.is_complex) else g
            grad_b = grad_b.sum_to_size(ctx.b_shape)
        if h0 is not None and ctx.needs_input_grad[2]:
            grad_h0 = g[:, 0] * a[:, 0].conj()
            if not h0.is_complex() and grad_h0.is_complex():
                grad_h0 = grad_h0.real
            grad_h0 = grad_h0.sum_to_size(h0.shape)
        return grad_a, grad_b, grad_h0


def linear_scan(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:
    """All states of h_t = a_t * h_{t-1} + b_t over dim 1 (time): b is (batch, time, *features), a broadcasts to
    b (e.g. (1, 1, features) for a recurrence that is the same at every step), h0 is (batch, *features) or None
    for zeros. Real or complex. Returns h (batch, time, *features); the last state is h[:, -1].

    Computed with a chunked parallel scan (see :data:`CHUNK`) and differentiable through a backward scan. Stable
    for |a| <= 1: it multiplies coefficients together but never divides by their products (as the cumulative
    product / cumulative sum formulation does, which underflows after a few hundred steps of a = 0.9)."""
    if a.dim() < b.dim():
        a = a.reshape((1,) * (b.dim() - a.dim()) + tuple(a.shape))
    if b.dim() < 2:
        raise ValueError(f"linear_scan: b must be (batch, time, ...), got shape {tuple(b.shape)}")
    # under CPU autocast the projections come out in bfloat16: the state accumulates over hundreds of steps, so it
    # is kept in float32 whatever the matmuls use
    a, b = _at_least_float32(a), _at_least_float32(b)
    return _LinearScan.apply(a, b, h0)


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


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


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
    expand the state without new parameters: a linear-attention-like memory at the cost of a gated RNN."""

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
        f, q, v = f.reshape(heads), q.reshape(heads), v.reshape(heads)
        # states (batch, time, heads, key, value); keeping all of them costs batch x time x hidden x expand floats
        # (33 MB a layer at 32 x 128 x 256 x 8), and lets the scan stay elementwise
        h = linear_scan(f.unsqueeze(-1), ((1 - f).unsqueeze(-1) * v.unsqueeze(-2)), h0)
        o = (q.unsqueeze(-2) @ h).flatten(2)  # q_t^T h_t per head, as a batched matmul
        return self.out(self.norm(o) * F.silu(g)), h[:, -1]


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

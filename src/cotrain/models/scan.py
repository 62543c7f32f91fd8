"""The elementwise linear scan h_t = a_t * h_{t-1} + b_t that LRU and minGRU run over time (and HGRN2 over its
chunks), chunked forward and backward, in float32 or wider."""

from __future__ import annotations

import torch

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
    a, b = at_least_float32(a), at_least_float32(b)
    return _LinearScan.apply(a, b, h0)


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """float32 for 16-bit inputs (a scan's products of many gates underflow in 16 bits), the input's dtype otherwise."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x

"""HGRN2's recurrence in its chunkwise form: the matrix-valued state h_t = diag(f_t) h_{t-1} + k_t^T v_t (k = 1 - f),
read out as o_t = q_t h_t, computed a chunk of steps at a time so that the expand x expand state is formed only at
chunk boundaries, never for every step (the chunked algorithm of gated linear attention, as flash-linear-attention
computes it). :func:`hgrn2_recurrence` is what :class:`cotrain.models.linear_rnn.HGRN2Layer` calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cotrain.models.scan import _scan, at_least_float32 as _at_least_float32


#: time steps per chunk of :func:`hgrn2_recurrence`. Inside a chunk the work grows with its length (chunk x chunk
#: scores, built from chunk x chunk / 2 x expand products); between chunks there is one expand x expand state per head
#: and chunk, kept for backward. 8 was the fastest on 2 CPU cores at expand 8 (4 and 12-16 about 1.2-2x slower) and
#: stores a state for one step in 8.
HGRN2_CHUNK = 8


def _in_chunks(x: torch.Tensor, size: int, fill: float = 0.0) -> torch.Tensor:
    """(batch, time, heads, d) -> (batch, chunks, heads, size, d), padded with fill at the end to a whole chunk."""
    batch, time, heads, d = x.shape
    n = -(-time // size)
    if n * size > time:
        x = F.pad(x, (0, 0, 0, 0, 0, n * size - time), value=fill)
    return x.reshape(batch, n, size, heads, d).transpose(2, 3).contiguous()


def _out_of_chunks(x: torch.Tensor, time: int) -> torch.Tensor:
    """The inverse of :func:`_in_chunks`: (batch, chunks, heads, size, d) -> (batch, time, heads, d)."""
    return x.transpose(2, 3).flatten(1, 2)[:, :time]


def _hgrn2_chunks(q, f, v, size):
    """Queries, keys 1 - f, values, forget gates and the cumulative log-decay b_t = sum of log f from the chunk's
    start to t (<= 0), in chunks. Padding steps have q = k = v = 0 and f = 1: they neither read, write nor decay."""
    # f is 0 only where the sigmoid underflows (layer 0 has no lower bound); tiny keeps the log finite there
    log_f = torch.log(f.clamp_min(torch.finfo(f.dtype).tiny))
    q, v, log_f = (_in_chunks(x, size) for x in (q, v, log_f))
    f = _in_chunks(f, size, fill=1.0)
    return q, 1 - f, v, f, log_f.cumsum(-2)


def _intra_scores(q: torch.Tensor, k: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """scores[..., t, s] = sum over d of q_t k_s (f_{s+1} ... f_t) for s <= t, 0 for s > t: how much of step s's
    write step t reads within a chunk. q, k, f are (..., size, d) chunks; returns (..., size, size).

    Built one diagonal (offset t - s) at a time, the decays as running products of f: no (size x size x d) tensor
    is ever formed, and products of gates <= 1 cannot overflow (exp(-cumulative log f) would, in a fast-forgetting
    chunk)."""
    size = q.shape[-2]
    scores = q.new_zeros(q.shape[:-1] + (size,))
    decay = torch.ones_like(q)
    for lag in range(size):
        if lag:  # decay[i]: the product of f over (s, t] for s = i, t = i + lag, from the previous lag's
            decay = decay[..., :-1, :] * f[..., lag:, :]
        torch.diagonal(scores, -lag, -2, -1).copy_((q[..., lag:, :] * k[..., :size - lag, :] * decay).sum(-1))
    return scores


def _intra_scores_backward(q, k, f, d_scores):
    """:func:`_intra_scores` again, and its gradients for q and k given d_scores (f's: see where it is called), in
    one pass over the diagonals. Returns scores, dq, dk."""
    size = q.shape[-2]
    scores = q.new_zeros(q.shape[:-1] + (size,))
    dq, dk = torch.zeros_like(q), torch.zeros_like(k)
    decay = torch.ones_like(q)
    for lag in range(size):
        if lag:
            decay = decay[..., :-1, :] * f[..., lag:, :]
        q_t, k_s = q[..., lag:, :], k[..., :size - lag, :]
        torch.diagonal(scores, -lag, -2, -1).copy_((q_t * k_s * decay).sum(-1))
        w = torch.diagonal(d_scores, -lag, -2, -1).unsqueeze(-1) * decay
        dq[..., lag:, :].addcmul_(w, k_s)
        dk[..., :size - lag, :].addcmul_(w, q_t)
    return scores, dq, dk


def _chunk_states(k, v, b, h0):
    """The states entering every chunk, (batch, chunks, heads, d, d), and the state after the last one.
    A chunk takes the state in decayed by exp(b_last) and adds its keys, each decayed to the chunk's end, times its
    values: S_out = diag(exp(b_last)) S_in + (k * exp(b_last - b))^T v. The chunks are then a short linear scan."""
    last = b[..., -1:, :]
    written = ((k * (last - b).exp()).transpose(-1, -2) @ v)
    states = _scan(last.exp().transpose(-1, -2), written, h0)
    first = torch.zeros_like(states[:, :1]) if h0 is None else h0.unsqueeze(1).to(states.dtype)
    # the last state is carried to the next batch: a copy, not a view that would keep every chunk's state alive
    return torch.cat([first, states[:, :-1]], dim=1), states[:, -1].clone()


class _HGRN2Recurrence(torch.autograd.Function):
    """Autograd for :func:`hgrn2_recurrence` that keeps only its inputs and the chunk-boundary states for backward:
    the intra-chunk scores are recomputed, so the memory a layer holds for backward is about that of q, f and v.
    Both passes run in float32 with autocast off: the states sum over the whole sequence, and backward's matmuls
    would otherwise meet float32 saved states with 16-bit gradients."""

    @staticmethod
    def forward(ctx, q, f, v, h0):
        ctx.device_type = q.device.type
        with torch.autocast(ctx.device_type, enabled=False):
            return _HGRN2Recurrence._forward(ctx, q, f, v, h0)

    @staticmethod
    def backward(ctx, grad_o, grad_last):
        with torch.autocast(ctx.device_type, enabled=False):
            return _HGRN2Recurrence._backward(ctx, grad_o, grad_last)

    @staticmethod
    def _forward(ctx, q, f, v, h0):
        time = q.shape[1]
        size = min(HGRN2_CHUNK, time)
        qc, k, vc, fc, b = _hgrn2_chunks(q, f, v, size)
        s_in, s_last = _chunk_states(k, vc, b, h0)
        # the entering state, decayed from the chunk's start to t, read by q_t; plus this chunk's own writes
        o = (qc * b.exp()) @ s_in + _intra_scores(qc, k, fc) @ vc
        ctx.save_for_backward(q, f, v, h0, s_in)
        ctx.set_materialize_grads(False)
        return _out_of_chunks(o, time), s_last

    @staticmethod
    def _backward(ctx, grad_o, grad_last):
        q, f, v, h0, s_in = ctx.saved_tensors
        time = q.shape[1]
        size = min(HGRN2_CHUNK, time)
        qc, k, vc, fc, b = _hgrn2_chunks(q, f, v, size)
        do = torch.zeros_like(vc) if grad_o is None else _in_chunks(grad_o, size)
        last = b[..., -1:, :]
        q_decayed, to_end = qc * b.exp(), (last - b).exp()
        k_decayed, chunk_decay = k * to_end, last.exp()  # chunk_decay: (..., 1, d)
        # dL/d(state entering chunk j) = q~_j^T do_j + exp(b_last_j) dL/d(state entering chunk j + 1): the chunks'
        # recurrence run backwards from the gradient of the returned last state
        grad_in = _scan(chunk_decay.transpose(-1, -2), q_decayed.transpose(-1, -2) @ do, grad_last, reverse=True)
        tail = torch.zeros_like(grad_in[:, :1]) if grad_last is None else grad_last.unsqueeze(1)
        grad_out = torch.cat([grad_in[:, 1:], tail], dim=1)  # dL/d(state leaving chunk j)
        # o = q~ s_in + scores v;  state out = diag(exp(b_last)) s_in + k~^T v
        d_q_decayed = do @ s_in.transpose(-1, -2)
        d_k_decayed = vc @ grad_out.transpose(-1, -2)
        d_scores = (do @ vc.transpose(-1, -2)).tril_()
        scores, dq_intra, dk_intra = _intra_scores_backward(qc, k, fc, d_scores)
        dv = scores.transpose(-1, -2) @ do + k_decayed @ grad_out
        dq = d_q_decayed * b.exp() + dq_intra
        dk = d_k_decayed * to_end + dk_intra
        # gradient for the cumulative log-decay b_t = log f_1 + ... + log f_t: it enters q~_t as +b_t, the scores
        # (decays exp(b_t - b_s)) as +b_t for the reading step and -b_s for the writing one, the chunk's decay as
        # +b_last; each log f_r then gets the gradient of every b from r to the chunk's end (a reverse cumsum)
        db = d_q_decayed * q_decayed + qc * dq_intra - k * dk_intra
        db[..., -1, :] += (grad_out * s_in).sum(-1) * chunk_decay.squeeze(-2)
        d_log_f = db.flip(-2).cumsum(-2).flip(-2)
        # k~_s = k_s exp(b_last - b_s) depends on log f_r for s < r only: summed directly, not as the difference of
        # two large sums (the state's gradient grows along the sequence, and that difference loses its digits)
        through_keys = (d_k_decayed * k_decayed).cumsum(-2)
        d_log_f[..., 1:, :] += through_keys[..., :-1, :]
        dq, dk, dv, d_log_f = (_out_of_chunks(x, time) for x in (dq, dk, dv, d_log_f))
        # k = 1 - f, log f = log(max(f, tiny))
        df = torch.where(f >= torch.finfo(f.dtype).tiny, d_log_f / f, 0) - dk
        grad_h0 = grad_in[:, 0] if h0 is not None and ctx.needs_input_grad[3] else None
        return dq, df, dv, grad_h0


def hgrn2_recurrence(q: torch.Tensor, f: torch.Tensor, v: torch.Tensor, h0: torch.Tensor | None = None):
    """HGRN2's state-expanded recurrence: h_t = diag(f_t) h_{t-1} + (1 - f_t) v_t^T and o_t = h_t^T q_t per head.

    q, f, v are (batch, time, heads, d) with f in [0, 1]; h0 is (batch, heads, d, d) or None for zeros. Returns
    o (batch, time, heads, d) and the last state h_T (batch, heads, d, d), in float32 (float64 for float64 inputs),
    differentiable in all inputs (h_T too: a state carried to the next call without detaching passes gradients
    back). Where f is below the smallest normal float (a sigmoid that underflowed), f's gradient omits the decay.

    Chunkwise, as gated linear attention (Yang et al. 2024, "Gated Linear Attention Transformers with
    Hardware-Efficient Training", arXiv:2312.06635; flash-linear-attention's chunk_gla): within a chunk of
    :data:`HGRN2_CHUNK` steps the outputs are pairwise scores times values plus the entering state read by the
    decayed queries; only the states at chunk boundaries are formed. Exact up to rounding: the same sums as the
    step-by-step recurrence, regrouped."""
    q, f, v = (_at_least_float32(x) for x in (q, f, v))
    if q.shape[1] == 1:  # one step (generation, a byte at a time): the recurrence itself, a few ops instead of ~40
        return _one_step(q[:, 0], f[:, 0], v[:, 0], h0)
    return _HGRN2Recurrence.apply(q, f, v, h0)


def _one_step(q: torch.Tensor, f: torch.Tensor, v: torch.Tensor, h0: torch.Tensor | None):
    """h = diag(f) h0 + (1 - f) v^T, o = h^T q, for (batch, heads, d) inputs: the same sums, one step."""
    written = (1 - f).unsqueeze(-1) * v.unsqueeze(-2)
    h = written if h0 is None else f.unsqueeze(-1) * h0.to(written.dtype) + written
    return (q.unsqueeze(-2) @ h).squeeze(-2).unsqueeze(1), h

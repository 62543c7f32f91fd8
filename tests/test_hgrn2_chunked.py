"""HGRN2's chunkwise recurrence against the step-by-step one it replaces: outputs, last states and gradients (with
the state carried over two calls), sequence lengths that do and do not divide into chunks, fast-forgetting gates,
the layer around it, and that it stores far less for backward (the expanded state only at chunk boundaries)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cotrain.models.hgrn2_recurrence import HGRN2_CHUNK, hgrn2_recurrence
from cotrain.models.linear_rnn import HGRN2Layer
from cotrain.models.scan import linear_scan


def per_step_recurrence(q, f, v, h0=None):
    """The reference: today's per-step form, which forms the (d x d) state of every head at every step.
    h_t = diag(f_t) h_{t-1} + (1 - f_t) v_t^T, o_t = h_t^T q_t."""
    h = linear_scan(f.unsqueeze(-1), (1 - f).unsqueeze(-1) * v.unsqueeze(-2), h0)
    return (q.unsqueeze(-2) @ h).squeeze(-2), h[:, -1]


def per_step_layer(layer: HGRN2Layer, x, lower_bound, h0):
    """HGRN2Layer.forward as it was before the chunkwise form, on the same parameters."""
    batch, time, _ = x.shape
    q, f, v, g = layer.proj(x).chunk(4, dim=-1)
    f = lower_bound + (1 - lower_bound) * torch.sigmoid(f)
    heads = (batch, time, layer.heads, layer.expand)
    o, h = per_step_recurrence(q.reshape(heads), f.reshape(heads), v.reshape(heads), h0)
    return layer.out(layer.norm(o.flatten(2)) * F.silu(g)), h


def inputs(batch, time, heads=3, d=4, seed=0):
    """q, the forget gates' pre-activations z, v, h0: leaves that require grad."""
    torch.manual_seed(seed)
    q = torch.randn(batch, time, heads, d)
    z = 2 * torch.randn(batch, time, heads, d)
    v = torch.randn(batch, time, heads, d)
    h0 = torch.randn(batch, heads, d, d)
    return [x.requires_grad_() for x in (q, z, v, h0)]


def gates(z, lower=0.1):
    """Forget gates as the layer makes them, lower + (1 - lower) sigmoid(z). The gradients compared are z's, the
    ones that reach the model's parameters: the chunked form gets f's as log f's divided by f, accurate to float32
    relative to the O(1) terms that sum to it; a small f magnifies that error, and the sigmoid's derivative (about
    f there) takes it back out."""
    return lower + (1 - lower) * torch.sigmoid(z)


def two_calls(recurrence, q, z, v, h0, split, lower=0.1):
    """Outputs of two consecutive calls, the state carried (not detached) from the first to the second, and the
    gradients for (q, z, v, h0) of a loss that weighs the outputs and the last state with fixed random weights."""
    f = gates(z, lower)
    o1, h1 = recurrence(q[:, :split], f[:, :split], v[:, :split], h0)
    o2, h2 = recurrence(q[:, split:], f[:, split:], v[:, split:], h1)
    o = torch.cat([o1, o2], dim=1)
    g = torch.Generator().manual_seed(1)
    loss = (o * torch.randn(o.shape, generator=g)).sum() + (h2 * torch.randn(h2.shape, generator=g)).sum()
    return (o, h1, h2) + torch.autograd.grad(loss, (q, z, v, h0))


LENGTHS = [1, 2, HGRN2_CHUNK - 1, HGRN2_CHUNK, 2 * HGRN2_CHUNK, 3 * HGRN2_CHUNK + 5, 67]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("time", LENGTHS)
def test_chunked_equals_per_step(time, batch):
    q, z, v, h0 = inputs(batch, time, seed=time)
    f = gates(z)
    o, h = hgrn2_recurrence(q, f, v, h0)
    o_ref, h_ref = per_step_recurrence(q, f, v, h0)
    assert o.shape == o_ref.shape and h.shape == h_ref.shape
    torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(h, h_ref, rtol=1e-4, atol=1e-5)
    # and with a zero initial state given as None
    torch.testing.assert_close(hgrn2_recurrence(q, f, v)[0], per_step_recurrence(q, f, v)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("time,split", [(2, 1), (HGRN2_CHUNK + 3, 5), (2 * HGRN2_CHUNK, HGRN2_CHUNK), (67, 30)])
@pytest.mark.parametrize("lower", [0.0, 0.5])
def test_gradients_and_carried_state_equal_per_step(time, split, batch, lower):
    q, z, v, h0 = inputs(batch, time, seed=time + split)
    got = two_calls(hgrn2_recurrence, q, z, v, h0, split, lower)
    expected = two_calls(per_step_recurrence, q, z, v, h0, split, lower)
    for name, a, b in zip(("o", "h1", "h2", "dq", "dz", "dv", "dh0"), got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_gradients_in_float64():
    q, z, v, h0 = (x.detach().double().requires_grad_() for x in inputs(2, HGRN2_CHUNK + 3, heads=2, d=3))
    f = gates(z).detach().requires_grad_()
    assert torch.autograd.gradcheck(hgrn2_recurrence, (q, f, v, h0))
    assert torch.autograd.gradcheck(lambda q, f, v: hgrn2_recurrence(q, f, v)[0], (q, f, v))


def test_only_the_state_used():
    """A loss on the returned state alone (no gradient for the outputs reaches backward)."""
    q, z, v, h0 = inputs(2, 2 * HGRN2_CHUNK + 1)
    got = torch.autograd.grad(hgrn2_recurrence(q, gates(z), v, h0)[1].sum(), (q, z, v, h0))
    # the per-step form's last state does not depend on q at all
    expected = torch.autograd.grad(per_step_recurrence(q, gates(z), v, h0)[1].sum(), (q, z, v, h0), allow_unused=True)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, torch.zeros_like(a) if b is None else b, rtol=1e-4, atol=1e-5)


def test_fast_forgetting_stays_finite_and_exact():
    """Gates near 0 (and exactly 0) over many steps, with no lower bound (as in layer 0): a chunk's cumulative
    log-decay falls far below what exp can represent (about -450 a chunk), which a form that divides by the
    cumulative decay, exp(-cumulative log f), would overflow on."""
    q, z, v, h0 = (x.detach() for x in inputs(2, 4 * HGRN2_CHUNK + 3))
    z[:, 5:40] = -57.0  # sigmoid: 1.7e-25
    z[:, 7, 0] = -200.0  # sigmoid: exactly 0 in float32
    assert (torch.sigmoid(z[:, 7, 0]) == 0).all()
    for x in (q, z, v, h0):
        x.requires_grad_()
    got = two_calls(hgrn2_recurrence, q, z, v, h0, 11, lower=0.0)
    expected = two_calls(per_step_recurrence, q, z, v, h0, 11, lower=0.0)
    for name, a, b in zip(("o", "h1", "h2", "dq", "dz", "dv", "dh0"), got, expected):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_layer_equals_todays_layer_and_loads_its_checkpoint():
    torch.manual_seed(0)
    layer = HGRN2Layer(16, 4)
    assert sorted(layer.state_dict()) == sorted(f"{m}.{p}" for m in ("proj", "norm", "out") for p in ("weight", "bias"))
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    fresh = HGRN2Layer(16, 4)
    fresh.load_state_dict(layer.state_dict())  # a checkpoint of today's layer: the same keys and shapes
    x = torch.randn(2, 2 * HGRN2_CHUNK + 3, 16, requires_grad=True)
    bound = torch.tensor(0.25, requires_grad=True)
    h0 = torch.randn(2, 4, 4, 4)
    got, expected = [], []
    for forward, out in ((fresh.forward, got), (lambda *a: per_step_layer(fresh, *a), expected)):
        y, h = forward(x, bound, h0)
        loss = (y * torch.linspace(-1, 1, y.shape[-1])).sum() + h.sum()
        out.extend((y, h) + torch.autograd.grad(loss, [x, bound] + list(fresh.parameters())))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def saved_bytes(fn) -> int:
    """Bytes of the distinct storages that autograd keeps for backward while fn() builds its graph: the activation
    memory of forward + backward, counted deterministically (no allocator, any device)."""
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(storages.values())


def test_chunked_saves_far_less_for_backward():
    """At expand 8 (the default) the per-step form keeps a (d x d) state for every step and head, 64 floats a step
    and head against the 8 of each of q, f and v. The chunked form keeps q, f, v and one state a chunk."""
    batch, time, heads, d = 4, 128, 8, 8
    q, z, v, h0 = inputs(batch, time, heads, d)
    f = gates(z).detach().requires_grad_()
    chunked = saved_bytes(lambda: hgrn2_recurrence(q, f, v, h0))
    per_step = saved_bytes(lambda: per_step_recurrence(q, f, v, h0))
    floats = 4
    step_states = batch * time * heads * d * d * floats
    chunk_states = batch * -(-time // HGRN2_CHUNK) * heads * d * d * floats
    assert per_step > step_states
    assert chunked <= 3 * q.nbytes + chunk_states + h0.nbytes  # q, f, v, the states entering the chunks, h0
    assert chunked < 0.4 * per_step

    # the whole layer, projections and output gate included (about 10 floats a step and channel either way, then the
    # per-step form's 8 for the states against 2 for f and the chunk states)
    torch.manual_seed(0)
    layer = HGRN2Layer(heads * d, d)
    x = torch.randn(batch, time, heads * d, requires_grad=True)
    bound = torch.tensor(0.25)
    chunked = saved_bytes(lambda: layer(x, bound, None))
    per_step = saved_bytes(lambda: per_step_layer(layer, x, bound, None))
    assert chunked < 0.75 * per_step


def test_under_autocast_the_recurrence_stays_float32():
    """16-bit autocast (the node's bf16/fp16 precision): the projections come out 16-bit, the recurrence and its
    carried state stay float32, and backward runs."""
    torch.manual_seed(0)
    layer = HGRN2Layer(16, 4)
    x = torch.randn(2, HGRN2_CHUNK + 3, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, h = layer(x, torch.tensor(0.25), None)
        y2, _ = layer(x, torch.tensor(0.25), h)
    assert h.dtype == torch.float32
    (y.float().sum() + y2.float().sum()).backward()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in layer.parameters())

"""The linear-recurrence language models (lru, hgrn2, mingru) and their scan: the scan against a step-by-step loop
(values and gradients), the state carried across batches and token by token, the run config's model, sampling, and
that training lowers the loss."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from cotrain.config import RunConfig
from cotrain.models import LinearRecurrentLM, build_model, generate
from cotrain.models.scan import CHUNK, linear_scan

KINDS = ("lru", "hgrn2", "mingru")
SMALL = dict(embed_dim=8, hidden_size=16, num_layers=2, dropout=0.0, state_size=12, expand_ratio=4, mlp_ratio=2)


def loop_scan(a, b, h0=None):
    a = a.reshape((1,) * (b.dim() - a.dim()) + tuple(a.shape)).expand(b.shape)
    h = torch.zeros_like(b[:, 0]) if h0 is None else h0
    out = []
    for t in range(b.shape[1]):
        h = a[:, t] * h + b[:, t]
        out.append(h)
    return torch.stack(out, dim=1)


def coefficients(shape, complex_, dtype=torch.float64):
    """|a| <= 1, as in every core."""
    a = torch.rand(shape, dtype=dtype)
    return a * torch.exp(1j * 3 * torch.rand(shape, dtype=dtype)) if complex_ else a


# ---- the scan -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("complex_", [False, True])
@pytest.mark.parametrize("time", [1, 7, 2 * CHUNK, 3 * CHUNK + 5, 130])
def test_scan_equals_the_loop(time, complex_):
    torch.manual_seed(time)
    dtype = torch.complex128 if complex_ else torch.float64
    b = torch.randn(3, time, 2, 5, dtype=dtype)
    h0 = torch.randn(3, 2, 5, dtype=dtype)
    for a in (coefficients((3, time, 2, 5), complex_),  # a per step
              coefficients((1, 1, 2, 5), complex_),  # the same at every step and in every stream (LRU)
              coefficients((3, time, 2, 1), complex_),  # broadcast over the last dim (HGRN2's forget gate)
              coefficients((5,), complex_)):  # fewer dims: broadcast from the right
        for init in (None, h0):
            torch.testing.assert_close(linear_scan(a, b, init), loop_scan(a, b, init))


def test_scan_is_stable_over_long_decays():
    """A division by cumulative products would overflow here (0.5 ** 2000); the scan only multiplies."""
    a = torch.full((2, 2000, 3), 0.5)
    b = torch.randn(2, 2000, 3)
    out = linear_scan(a, b)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, loop_scan(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("complex_", [False, True])
@pytest.mark.parametrize("time", [5, 2 * CHUNK + 3])
def test_scan_gradients(time, complex_):
    torch.manual_seed(0)
    dtype = torch.complex128 if complex_ else torch.float64
    b = torch.randn(2, time, 3, dtype=dtype, requires_grad=True)
    h0 = torch.randn(2, 3, dtype=dtype, requires_grad=True)
    a = coefficients((2, time, 3), complex_).requires_grad_()
    shared = coefficients((1, 1, 3), complex_).requires_grad_()
    # across chunks, the full Jacobian of every element takes seconds; fast mode checks it along random directions
    check = functools.partial(torch.autograd.gradcheck, fast_mode=time > CHUNK)
    assert check(linear_scan, (a, b, h0))
    assert check(linear_scan, (shared, b, h0))
    assert check(lambda a, b: linear_scan(a, b), (a, b))
    if complex_:  # a real decay on a complex state
        real = torch.rand(2, time, 3, dtype=torch.float64, requires_grad=True)
        assert check(linear_scan, (real, b, h0))


def test_scan_gradients_equal_the_loops_in_float32():
    torch.manual_seed(0)
    a = torch.rand(4, 100, 6, requires_grad=True)
    b = torch.randn(4, 100, 6, requires_grad=True)
    h0 = torch.randn(4, 6, requires_grad=True)
    weights = torch.randn(4, 100, 6)
    grads = torch.autograd.grad((linear_scan(a, b, h0) * weights).sum(), (a, b, h0))
    expected = torch.autograd.grad((loop_scan(a, b, h0) * weights).sum(), (a, b, h0))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


# ---- the models ---------------------------------------------------------------------------------------------------

def small_model(kind, seed=0):
    torch.manual_seed(seed)
    model = LinearRecurrentLM(kind, **SMALL).eval()
    with torch.no_grad():  # random output weights and biases, so the carried state shows in every output
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("kind", KINDS)
def test_state_carried_across_batches_equals_one_pass(kind):
    model = small_model(kind)
    tokens = torch.randint(0, 256, (3, 2 * CHUNK + 9))
    split = CHUNK + 3
    with torch.no_grad():
        whole, whole_state = model(tokens)
        first, state = model(tokens[:, :split])
        second, carried = model(tokens[:, split:], model.detach_state(state))
    assert whole.shape == (3, tokens.shape[1], 256)
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole, rtol=1e-4, atol=1e-4)
    assert len(carried) == SMALL["num_layers"]
    for a, b in zip(carried, whole_state):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_token_by_token_equals_one_pass(kind):
    """What sampling does: one byte at a time with the carried state."""
    model = small_model(kind)
    tokens = torch.randint(0, 256, (2, CHUNK + 5))
    with torch.no_grad():
        whole, _ = model(tokens)
        state, steps = None, []
        for t in range(tokens.shape[1]):
            logits, state = model(tokens[:, t:t + 1], state)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=1e-4, atol=1e-4)


def test_lru_state_is_complex_and_survives_detach():
    model = small_model("lru")
    _, state = model(torch.randint(0, 256, (2, 4)))
    detached = model.detach_state(state)
    assert all(s.is_complex() and s.shape == (2, SMALL["state_size"]) for s in detached)
    assert not any(s.requires_grad for s in detached)
    assert all(not p.is_complex() for p in model.parameters())  # averaged and compressed as plain floats


def test_hgrn2_lower_bounds_increase_with_depth():
    model = LinearRecurrentLM("hgrn2", **{**SMALL, "num_layers": 3})
    p = torch.softmax(model.rnn.lower_bounds, dim=0)
    bounds = torch.cumsum(p, dim=0) - p[0]
    assert (bounds[0] == 0).all() and (bounds[1:] > bounds[:-1]).all() and (bounds < 1).all()


def test_hgrn2_needs_expand_ratio_to_divide_hidden_size():
    with pytest.raises(ValueError, match="expand_ratio"):
        LinearRecurrentLM("hgrn2", hidden_size=18, expand_ratio=4)


def run_config(kind, seed=0):
    return RunConfig.from_dict({"run": {"seed": seed},
                                "model": {"kind": kind, "embed_dim": 8, "hidden_size": 16, "num_layers": 2,
                                          "state_size": 8, "expand_ratio": 4, "mlp_ratio": 1}})


@pytest.mark.parametrize("kind", KINDS)
def test_build_model_from_the_run_config(kind):
    model = build_model(run_config(kind))
    assert isinstance(model, LinearRecurrentLM) and model.kind == kind
    same = build_model(run_config(kind)).state_dict()
    other = build_model(run_config(kind, seed=1)).state_dict()
    assert all(torch.equal(v, same[k]) for k, v in model.state_dict().items())
    assert not all(torch.equal(v, other[k]) for k, v in model.state_dict().items())
    out = generate(model, b"hello", 20, temperature=1.0, seed=0)
    assert isinstance(out, bytes) and len(out) == 20
    assert generate(model, b"hello", 20, temperature=1.0, seed=0) == out


def test_dropout_only_in_training():
    torch.manual_seed(0)
    model = LinearRecurrentLM("mingru", **{**SMALL, "dropout": 0.5})
    tokens = torch.randint(0, 256, (2, 10))
    model.eval()
    assert torch.equal(model(tokens)[0], model(tokens)[0])
    model.train()
    assert not torch.equal(model(tokens)[0], model(tokens)[0])


@pytest.mark.parametrize("kind", KINDS)
def test_training_lowers_the_loss(kind):
    torch.manual_seed(0)
    model = LinearRecurrentLM(kind, **{**SMALL, "dropout": 0.1})
    text = torch.tensor(list(b"the quick brown fox jumps over the lazy dog. " * 8 + b"t"))
    x, y = text[:-1].view(4, -1), text[1:].view(4, -1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(25):
        logits, _ = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.6 * losses[0]

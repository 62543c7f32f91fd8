"""The inner optimizers (cotrain.optim): param groups, the update each one makes, state for sync, config."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cotrain.config import ConfigError, OptimizerConfig, RunConfig
from cotrain.models import RNNLanguageModel
from cotrain.optim import (MUON_COEFFICIENTS, Lamb, Lars, Muon, Root, TVLars, build_optimizer, fit_ns_coefficients,
                           init_state, newton_schulz, remove_outliers, soft_threshold, state_tensors, tvlars_factor)

KINDS = ("adamw", "muon", "root", "lamb", "lars", "tvlars")
#: learning rates at which each kind trains the tiny LM below
TINY_LR = {"adamw": 1e-2, "muon": 1e-2, "root": 1e-2, "lamb": 3e-2, "lars": 2.0, "tvlars": 2.0}


def tiny_model(seed: int = 0) -> RNNLanguageModel:
    torch.manual_seed(seed)
    return RNNLanguageModel("lstm", 16, 32, 2, 0.0)


def cfg(kind: str, **fields) -> OptimizerConfig:
    return OptimizerConfig(kind=kind, **fields)


def lm_loss(model, tokens):
    logits, _ = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


# ---- groups ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_every_param_is_in_exactly_one_group(kind):
    model = tiny_model()
    opt = build_optimizer(model, cfg(kind))
    grouped = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())
    assert all("lr" in g for g in opt.param_groups)


@pytest.mark.parametrize("kind", ["muon", "root"])
def test_orthogonal_groups_hold_the_hidden_matrices(kind):
    model = tiny_model()
    opt = build_optimizer(model, cfg(kind))
    ortho = {id(p): g["blocks"] for g in opt.param_groups if g["algorithm"] == "orthogonal" for p in g["params"]}
    adamw = {id(p) for g in opt.param_groups if g["algorithm"] == "adamw" for p in g["params"]}
    for name, p in model.rnn.named_parameters():
        if name.startswith("weight"):
            assert ortho.get(id(p)) == 4, name  # the LSTM's 4 stacked gates, orthogonalized per block
        else:
            assert id(p) in adamw, name
    for p in (model.embed.weight, model.head.weight, model.head.bias):
        assert id(p) in adamw
    unsplit = build_optimizer(model, cfg(kind, split_gates=False))
    assert {g["blocks"] for g in unsplit.param_groups if g["algorithm"] == "orthogonal"} == {1}


def test_gru_gates_are_three_blocks():
    torch.manual_seed(0)
    model = RNNLanguageModel("gru", 16, 32, 1, 0.0)
    opt = build_optimizer(model, cfg("muon"))
    assert {g["blocks"] for g in opt.param_groups if g["algorithm"] == "orthogonal"} == {3}


def test_adamw_is_torch_adamw_as_before():
    model = tiny_model()
    opt = build_optimizer(model, cfg("adamw", lr=2e-3, betas=(0.8, 0.95), weight_decay=0.01))
    assert type(opt) is torch.optim.AdamW
    (group,) = opt.param_groups
    assert group["lr"] == 2e-3 and tuple(group["betas"]) == (0.8, 0.95) and group["weight_decay"] == 0.01
    assert [id(p) for p in group["params"]] == [id(p) for p in model.parameters()]


@pytest.mark.parametrize("kind", ["lamb", "lars", "tvlars"])
def test_layerwise_trust_ratio_excludes_1d_params(kind):
    model = tiny_model()
    opt = build_optimizer(model, cfg(kind))
    for g in opt.param_groups:
        assert all((p.dim() >= 2) == g["trust"] for p in g["params"])


# ---- the updates -----------------------------------------------------------------------------------------------
def singular_value_spread(update):
    s = torch.linalg.svdvals(update.double())
    return float(s.max() / s.min())


def graded_gradient(rows, cols, seed=0):
    """A gradient whose singular values span a factor of 100."""
    gen = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(rows, rows, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(cols, cols, generator=gen))
    k = min(rows, cols)
    s = torch.logspace(0, -2, k)
    return u[:, :k] @ torch.diag(s) @ v[:, :k].T


@pytest.mark.parametrize("cls", [Muon, Root])
def test_orthogonal_update_has_near_equal_singular_values(cls):
    w = nn.Parameter(torch.randn(24, 16))
    opt = cls([{"params": [w], "algorithm": "orthogonal"}], lr=0.1, momentum=0.0, nesterov=False, weight_decay=0.0,
              **({"outlier_quantile": 1.0} if cls is Root else {}))
    w.grad = graded_gradient(24, 16)
    before = w.detach().clone()
    opt.step()
    update = before - w.detach()
    assert singular_value_spread(w.grad) > 50
    assert singular_value_spread(update) < 2.0
    # the step's RMS matches AdamW's (torch.optim.Muon's match_rms_adamw): 0.2 * lr
    assert float(update.pow(2).mean().sqrt()) == pytest.approx(0.2 * 0.1, rel=0.35)


def test_gate_blocks_are_orthogonalized_separately():
    w = nn.Parameter(torch.zeros(4 * 8, 8))
    opt = Muon([{"params": [w], "algorithm": "orthogonal", "blocks": 4}], lr=0.1, momentum=0.0, nesterov=False)
    grad = torch.cat([graded_gradient(8, 8, seed=i) * scale for i, scale in enumerate((1.0, 100.0, 0.01, 1.0))])
    w.grad = grad
    opt.step()
    for block in (-w.detach()).chunk(4):
        assert singular_value_spread(block) < 2.0  # even the gate with a 100x smaller gradient gets a full step
    norms = [float(b.norm()) for b in w.detach().chunk(4)]
    assert max(norms) / min(norms) < 1.5


def test_newton_schulz_batches_match_single_matrices():
    x = torch.randn(3, 8, 5)
    batched = newton_schulz(x)
    for i in range(3):
        assert torch.allclose(batched[i], newton_schulz(x[i]), atol=1e-5)


def test_root_soft_threshold_removes_planted_outliers():
    gen = torch.Generator().manual_seed(0)
    m = torch.randn(32, 32, generator=gen)
    planted = [(0, 0), (5, 7), (31, 2)]
    spiked = m.clone()
    for i, j in planted:
        spiked[i, j] = 1000.0
    threshold = float(spiked.abs().flatten().kthvalue(int(0.9 * 1024) + 1).values)
    robust = remove_outliers(spiked, 0.9)
    assert float(robust.abs().max()) <= threshold + 1e-6
    for i, j in planted:
        assert float(robust[i, j]) == pytest.approx(threshold)
    small = spiked.abs() <= threshold
    assert torch.equal(robust[small], spiked[small])  # entries below the threshold are untouched
    assert torch.equal(remove_outliers(spiked, 1.0), spiked)
    assert torch.allclose(robust, spiked - soft_threshold(spiked, threshold))
    # per gate block: each block gets its own threshold
    blocks = torch.stack([m, 100 * m])
    assert torch.allclose(remove_outliers(blocks, 0.9)[1], 100 * remove_outliers(m, 0.9), rtol=1e-5)


def test_root_step_ignores_a_gradient_spike_that_captures_muon():
    gen = torch.Generator().manual_seed(1)
    grad = torch.randn(32, 32, generator=gen)
    spiked = grad.clone()
    spiked[3, 4] = 1e4

    def direction(cls, g, **kw):
        w = nn.Parameter(torch.zeros(32, 32))
        opt = cls([{"params": [w], "algorithm": "orthogonal"}], lr=1.0, momentum=0.0, nesterov=False, **kw)
        w.grad = g
        opt.step()
        return -w.detach().flatten()

    def cosine(a, b):
        return float(a @ b / (a.norm() * b.norm()))

    root_shift = cosine(direction(Root, spiked), direction(Root, grad))
    muon_shift = cosine(direction(Muon, spiked), direction(Muon, grad))
    assert root_shift > 0.99
    assert muon_shift < 0.9


def test_root_coefficients_fit_the_shape():
    coefficients = fit_ns_coefficients(64, 16)
    assert coefficients != MUON_COEFFICIENTS
    assert fit_ns_coefficients(16, 64) == coefficients  # the shape, not the orientation
    errors = {}
    for name, c in (("muon", MUON_COEFFICIENTS), ("root", coefficients)):
        errors[name] = sum(float((torch.linalg.svdvals(newton_schulz(graded_gradient(64, 16, seed), c).double())
                                  - 1.0).pow(2).mean()) for seed in range(3))
    assert errors["root"] < errors["muon"]


def test_lamb_step_is_lr_times_the_param_norm():
    w = nn.Parameter(torch.randn(16, 8) * 3)
    b = nn.Parameter(torch.randn(8))
    opt = Lamb([{"params": [w], "trust": True}, {"params": [b], "trust": False}], lr=0.01)
    w0, b0 = w.detach().clone(), b.detach().clone()
    w.grad = torch.randn(16, 8) * 1e-4
    b.grad = torch.randn(8).sign() * 1e-2
    opt.step()
    assert float((w.detach() - w0).norm()) == pytest.approx(0.01 * float(w0.norm()), rel=1e-3)
    # excluded: a plain Adam first step, about lr per entry whatever the gradient's scale
    assert torch.allclose((b.detach() - b0).abs(), torch.full((8,), 0.01), rtol=1e-2)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_lars_step_is_scaled_to_the_param_norm(scale):
    w = nn.Parameter(torch.randn(16, 8))
    opt = Lars([w], lr=2.0, trust_coefficient=1e-3, momentum=0.9)
    w0 = w.detach().clone()
    w.grad = torch.randn(16, 8, generator=torch.Generator().manual_seed(0)) * scale
    opt.step()
    assert float((w.detach() - w0).norm()) == pytest.approx(2.0 * 1e-3 * float(w0.norm()), rel=1e-4)


def test_tvlars_factor_follows_its_schedule():
    phi = [tvlars_factor(t, alpha=1.0, decay=0.01, delay=200, floor=0.1) for t in range(0, 2001, 50)]
    assert phi[0] == pytest.approx(1 / (1 + torch.e ** -2) + 0.1)
    assert tvlars_factor(200, 1.0, 0.01, 200, 0.1) == pytest.approx(0.6)
    assert all(a > b for a, b in zip(phi, phi[1:]))
    assert phi[-1] == pytest.approx(0.1, abs=1e-6)
    assert tvlars_factor(10**9, 1.0, 0.01, 200, 0.1) == 0.1
    # the optimizer applies it to the trust ratio at the param's step count
    w = nn.Parameter(torch.randn(16, 8))
    opt = TVLars([w], lr=1.0, momentum=0.0, alpha=1.0, decay=0.01, delay=200, floor=0.1)
    init_state(opt)
    for t in (0, 200, 1000):
        opt.state[w]["step"].fill_(t)
        w0 = w.detach().clone()
        w.grad = torch.randn(16, 8)
        opt.state[w]["momentum_buffer"].zero_()
        opt.step()
        expected = 1e-3 * tvlars_factor(t, 1.0, 0.01, 200, 0.1) * float(w0.norm())
        assert float((w.detach() - w0).norm()) == pytest.approx(expected, rel=1e-4)


# ---- state for sync ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_state_exists_up_front_and_is_updated_in_place(kind):
    model = tiny_model()
    params = list(model.parameters())
    opt = build_optimizer(model, cfg(kind))
    init_state(opt)
    before = state_tensors(opt, params)
    assert before and all(isinstance(t, torch.Tensor) for t in before)
    assert all(len(opt.state[p]) > 0 for p in params)
    snapshot = [t.clone() for t in before]
    tokens = torch.randint(0, 256, (2, 9))
    lm_loss(model, tokens).backward()
    opt.step()
    after = state_tensors(opt, params)
    assert len(after) == len(before) and all(a is b for a, b in zip(after, before))
    assert any(not torch.equal(a, s) for a, s in zip(after, snapshot))
    assert all(isinstance(v, torch.Tensor) for p in params for v in opt.state[p].values())
    other_model = tiny_model(seed=1)
    other = build_optimizer(other_model, cfg(kind))
    init_state(other)
    assert [t.shape for t in state_tensors(other, list(other_model.parameters()))] == [t.shape for t in before]


def test_adamw_state_tensors_are_syncs_order():
    model = tiny_model()
    params = list(model.parameters())
    opt = build_optimizer(model, cfg("adamw"))
    init_state(opt)
    states = [opt.state[p] for p in params]
    expected = [s["exp_avg"] for s in states] + [s["exp_avg_sq"] for s in states] + [s["step"] for s in states]
    got = state_tensors(opt, params)
    assert len(got) == len(expected) and all(a is b for a, b in zip(got, expected))
    assert all(s["step"].dim() == 0 and s["step"].dtype == torch.float32 for s in states)


@pytest.mark.parametrize("kind", KINDS)
def test_identical_peers_stay_identical(kind):
    """Two peers with the same model and state, stepping on the same gradient, end equal; averaging their state
    (as sync does) changes nothing, step counters included."""
    peers = []
    for _ in range(2):
        model = tiny_model()
        opt = build_optimizer(model, cfg(kind))
        init_state(opt)
        peers.append((model, opt))
    tokens = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    for model, opt in peers:
        for _ in range(2):
            opt.zero_grad()
            lm_loss(model, tokens).backward()
            opt.step()
    (m1, o1), (m2, o2) = peers
    s1, s2 = state_tensors(o1, list(m1.parameters())), state_tensors(o2, list(m2.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(s1, s2))
    for a, b in zip(s1, s2):
        a.copy_((a + b) / 2)
    assert all(torch.equal(a, b) for a, b in zip(s1, s2))


# ---- training --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_few_steps_lower_the_loss(kind):
    model = tiny_model()
    opt = build_optimizer(model, cfg(kind, lr=TINY_LR[kind]))
    text = torch.tensor(list(b"the cat sat on the mat. " * 8), dtype=torch.long)
    tokens = text[: 4 * 40].view(4, 40)
    with torch.no_grad():
        start = float(lm_loss(model, tokens))
    for _ in range(25):
        opt.zero_grad()
        loss = lm_loss(model, tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    with torch.no_grad():
        end = float(lm_loss(model, tokens))
    assert end < 0.8 * start, (start, end)


# ---- config ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [("momentum", -0.5), ("momentum", 1.0), ("lars_momentum", -1.0),
                                         ("ns_steps", 0), ("outlier_quantile", 0.0), ("trust_coefficient", 0.0),
                                         ("tvlars_alpha", 0.0), ("tvlars_decay", -1.0), ("tvlars_delay", -1),
                                         ("betas", [0.9, 1.5])])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({"optimizer": {"kind": "muon", field: value}})
    assert f"optimizer.{field}" in str(err.value) or (field == "betas" and "betas" in str(err.value))


def test_config_round_trips_with_the_new_fields():
    config = RunConfig.from_dict({"optimizer": {"kind": "tvlars", "lr": 2.0, "tvlars_delay": 50}})
    again = RunConfig.from_toml(config.to_toml())
    assert again.optimizer == config.optimizer
    assert isinstance(build_optimizer(tiny_model(), again.optimizer), TVLars)

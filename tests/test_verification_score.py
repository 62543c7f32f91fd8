"""The loss score on a tiny synthetic problem: a linear regression whose work units are data sets drawn around one
set of weights (each unit a little off it, as shards of real data are). A member trains H steps of SGD on its own unit
from the round's global parameters; its contribution is global minus local. Each attack gets its verdict, an honest
contribution passes, and the thresholds decide exactly where they say."""

import math

import pytest
import torch

from cotrain.verification.score import (BLOWS_UP, HARM, MALFORMED, NO_GAIN, NOT_OWN_DATA, ZERO, loss_score,
                                        relative_gain)

D = 8


def units(seed: int, spread: float = 0.3, n: int = 64, noise: float = 0.3) -> dict:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(D, generator=g)
    out = {}
    for name in ("own", "random", "other"):
        w_unit = w + spread * torch.randn(D, generator=g)
        x = torch.randn(n, D, generator=g)
        out[name] = (x, x @ w_unit + noise * torch.randn(n, generator=g))
    return out


def loss_on_units(data: dict):
    def loss_on(params, which):
        x, y = data[which]
        return float(((x @ params[0] + params[1] - y) ** 2).mean())
    return loss_on


def train(data: dict, params, which: str, steps: int = 20, lr: float = 0.05) -> list[torch.Tensor]:
    """The pseudo-gradient (global minus local) of ``steps`` SGD steps on unit ``which``."""
    w, b = (p.clone().requires_grad_() for p in params)
    x, y = data[which]
    for _ in range(steps):
        gw, gb = torch.autograd.grad(((x @ w + b - y) ** 2).mean(), [w, b])
        with torch.no_grad():
            w -= lr * gw
            b -= lr * gb
    return [p - q.detach() for p, q in zip(params, (w, b))]


def global_params():
    return [torch.zeros(D), torch.zeros(1)]


def noise_like(update, seed=1):
    g = torch.Generator().manual_seed(seed)
    z = [torch.randn(u.shape, generator=g) for u in update]
    scale = math.sqrt(sum(float(u.square().sum()) for u in update) / sum(float(v.square().sum()) for v in z))
    return [v * scale for v in z]


def alie_like(update, fraction=0.2):
    """The honest update plus a fixed direction of ``fraction`` of its norm: the same shift for every attacker."""
    norm = math.sqrt(sum(float(u.square().sum()) for u in update))
    direction = [torch.ones_like(u) for u in update]
    dnorm = math.sqrt(sum(float(d.square().sum()) for d in direction))
    return [u + fraction * norm / dnorm * d for u, d in zip(update, direction)]


DATA = units(seed=0)
HONEST = train(DATA, global_params(), "own")

ATTACKS = [
    ("honest", HONEST, "pass", ""),
    ("free rider: zeros", [torch.zeros_like(u) for u in HONEST], "fail", ZERO),
    ("free rider: almost zeros", [torch.full_like(u, 1e-30) for u in HONEST], "fail", NO_GAIN),
    ("noise of the honest norm", noise_like(HONEST), "fail", NO_GAIN),
    ("scaled x10", [10 * u for u in HONEST], "fail", NO_GAIN),
    ("sign flipped", [-u for u in HONEST], "fail", NO_GAIN),
    ("huge", [torch.full_like(u, 1e38) for u in HONEST], "fail", BLOWS_UP),
    # a small shift still lowers both losses: the loss score passes it, the replay comparison does not
    ("a little is enough: 20% shift", alie_like(HONEST), "pass", ""),
    ("nan", [torch.full_like(u, math.nan) for u in HONEST], "fail", MALFORMED),
    ("wrong shape", [HONEST[0][:4], HONEST[1]], "fail", MALFORMED),
    ("one tensor missing", HONEST[:1], "fail", MALFORMED),
    ("integers", [u.to(torch.int64) for u in HONEST], "fail", MALFORMED),
]


@pytest.mark.parametrize("what, contribution, verdict, failed", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_each_contribution_gets_its_verdict(what, contribution, verdict, failed):
    params = global_params()
    score = loss_score(loss_on_units(DATA), params, contribution, step=1.0)
    assert (score.verdict, score.failed) == (verdict, failed), score.reason
    assert score.reason
    assert all(not p.any() for p in params)  # the global parameters are left as they were


def test_training_on_other_data_shows_as_no_advantage_on_the_own_unit():
    """Over many draws of units, an honest contribution always passes; one trained on a third unit lowers its own
    unit's loss no more than a random unit's about half the time: weak evidence each round, strong over rounds."""
    honest_failed, other_failed = 0, 0
    draws = 30
    for seed in range(draws):
        data = units(seed)
        honest = loss_score(loss_on_units(data), global_params(), train(data, global_params(), "own"), 1.0)
        other = loss_score(loss_on_units(data), global_params(), train(data, global_params(), "other"), 1.0)
        honest_failed += not honest.passed
        other_failed += other.failed == NOT_OWN_DATA
        assert honest.advantage > 0
    assert honest_failed == 0
    assert other_failed >= draws // 3


def fake_loss(table: dict):
    """A loss_on whose values come from ``table[(which, "before" or "after")]``: the contribution is -1 on a zero
    parameter, so the parameter is 1 after it is applied."""
    def loss_on(params, which):
        return table[(which, "after" if float(params[0]) else "before")]
    return loss_on


def table(own_before, own_after, random_before, random_after):
    return {("own", "before"): own_before, ("own", "after"): own_after,
            ("random", "before"): random_before, ("random", "after"): random_after}


THRESHOLDS = [
    ("gains 0.05% on its own unit", table(1.0, 0.9995, 1.0, 0.9995), {}, NO_GAIN),
    ("gains 0.2% on its own unit", table(1.0, 0.998, 1.0, 0.999), {}, ""),
    ("gains 0.2%, 0.5% required", table(1.0, 0.998, 1.0, 0.999), dict(min_own_gain=0.005), NO_GAIN),
    ("raises the random unit's loss by 11%", table(2.0, 1.0, 1.0, 1.11), {}, HARM),
    ("raises the random unit's loss by 9%", table(2.0, 1.0, 1.0, 1.09), {}, ""),
    ("9% allowed up to 5%", table(2.0, 1.0, 1.0, 1.09), dict(max_random_harm=0.05), HARM),
    ("gains 20% own, 30% random", table(1.0, 0.8, 1.0, 0.7), {}, NOT_OWN_DATA),
    ("gains 30% own, 20% random", table(1.0, 0.7, 1.0, 0.8), {}, ""),
    ("gains 30% own, 20% random, advantage 0.2 required", table(1.0, 0.7, 1.0, 0.8),
     dict(min_own_advantage=0.2), NOT_OWN_DATA),
    ("own loss becomes inf", table(1.0, math.inf, 1.0, 1.0), {}, BLOWS_UP),
    ("random loss becomes nan", table(1.0, 0.5, 1.0, math.nan), {}, BLOWS_UP),
    ("a loss of 0 before: no division by 0", table(0.0, -1.0, 0.0, -0.5), {}, ""),
]


@pytest.mark.parametrize("what, losses, kwargs, failed", THRESHOLDS, ids=[t[0] for t in THRESHOLDS])
def test_the_thresholds_decide_where_they_say(what, losses, kwargs, failed):
    score = loss_score(fake_loss(losses), [torch.zeros(1)], [-torch.ones(1)], step=1.0, **kwargs)
    assert score.failed == failed, score.reason
    assert score.passed == (failed == "")


def test_the_figures_come_with_the_score():
    score = loss_score(fake_loss(table(2.0, 1.0, 4.0, 3.0)), [torch.zeros(1)], [-torch.ones(1)], step=1.0)
    assert (score.own_gain, score.random_gain, score.advantage) == (0.5, 0.25, 0.25)
    assert "50.00%" in score.reason and "25.00%" in score.reason
    assert relative_gain(2.0, 3.0) == -0.5


@pytest.mark.parametrize("step", [0.0, -1.0, math.nan, math.inf])
def test_a_bad_step_is_the_callers_error(step):
    with pytest.raises(ValueError, match="step"):
        loss_score(fake_loss(table(1, 1, 1, 1)), [torch.zeros(1)], [torch.ones(1)], step=step)


def test_a_non_finite_loss_of_the_global_parameters_is_the_validators_error():
    with pytest.raises(ValueError, match="loss_on"):
        loss_score(fake_loss(table(math.nan, 1, 1, 1)), [torch.zeros(1)], [-torch.ones(1)], step=1.0)

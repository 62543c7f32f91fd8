"""Comparing a claimed contribution with its replay: direction (cosine) and norm (ratio), zeros handled, hostile
claims answered with a failing verdict and a reason, never an exception."""

import math

import pytest
import torch

from cotrain.verification.replay import MIN_COSINE, compare


def _replay():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(16, 8, generator=g), torch.randn(8, generator=g)]


REPLAY = _replay()


def norm(ts):
    return math.sqrt(sum(float(t.double().square().sum()) for t in ts))


def orthogonal_shift(ts, fraction):
    """``ts`` plus a vector orthogonal to it of ``fraction`` of its norm: cosine 1 / sqrt(1 + fraction^2)."""
    g = torch.Generator().manual_seed(1)
    z = [torch.randn(t.shape, generator=g) for t in ts]
    along = sum(float((a * b).sum()) for a, b in zip(z, ts)) / norm(ts) ** 2
    z = [a - along * b for a, b in zip(z, ts)]
    return [t + fraction * norm(ts) / norm(z) * a for t, a in zip(ts, z)]


def noise(ts, seed=2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(t.shape, generator=g) for t in ts]


CASES = [
    ("the replay itself", REPLAY, REPLAY, "pass", ""),
    ("rounding: 1e-6 relative", [t * (1 + 1e-6) + 1e-7 for t in REPLAY], REPLAY, "pass", ""),
    ("float16 on the wire", [t.half() for t in REPLAY], REPLAY, "pass", ""),
    ("a little is enough: 20% shift", orthogonal_shift(REPLAY, 0.2), REPLAY, "fail", "cosine"),
    ("a 5% shift stays below the threshold", orthogonal_shift(REPLAY, 0.05), REPLAY, "pass", ""),
    ("noise", noise(REPLAY), REPLAY, "fail", "cosine"),
    ("sign flipped", [-t for t in REPLAY], REPLAY, "fail", "cosine"),
    ("scaled x10", [10 * t for t in REPLAY], REPLAY, "fail", "times the replay's norm"),
    ("scaled x1.2", [1.2 * t for t in REPLAY], REPLAY, "fail", "times the replay's norm"),
    ("scaled x0.5", [0.5 * t for t in REPLAY], REPLAY, "fail", "times the replay's norm"),
    ("free rider", [torch.zeros_like(t) for t in REPLAY], REPLAY, "fail", "all-zero"),
    ("nothing to train on, nothing claimed", [torch.zeros(3)], [torch.zeros(3)], "pass", ""),
    ("claims where the replay moved nothing", REPLAY, [torch.zeros_like(t) for t in REPLAY], "fail", "moved nothing"),
    ("a tensor missing", REPLAY[:1], REPLAY, "fail", "1 tensors"),
    ("wrong shape", [REPLAY[0].T, REPLAY[1]], REPLAY, "fail", "claimed[0]: shape"),
    ("nan", [REPLAY[0], torch.full_like(REPLAY[1], math.nan)], REPLAY, "fail", "claimed[1]: non-finite"),
    ("integers", [t.long() for t in REPLAY], REPLAY, "fail", "claimed[0]: not a floating-point"),
    ("not tensors", [[1.0], [2.0]], REPLAY, "fail", "claimed[0]"),
]


@pytest.mark.parametrize("what, claimed, replayed, verdict, reason", CASES, ids=[c[0] for c in CASES])
def test_each_claim_gets_its_verdict(what, claimed, replayed, verdict, reason):
    result = compare(claimed, replayed)
    assert result.verdict == verdict, result.reason
    assert reason in result.reason


def test_the_figures_are_those_of_the_flattened_vectors():
    shifted = orthogonal_shift(REPLAY, 0.2)
    result = compare(shifted, REPLAY)
    assert result.cosine == pytest.approx(1 / math.sqrt(1.04), abs=1e-6)
    assert result.norm_ratio == pytest.approx(math.sqrt(1.04), abs=1e-6)
    assert result.claimed_norm == pytest.approx(norm(shifted))
    assert result.replayed_norm == pytest.approx(norm(REPLAY))
    assert 1 / math.sqrt(1.04) < MIN_COSINE  # the 20% shift fails for the reason the default says


def test_the_thresholds_are_arguments():
    shifted = orthogonal_shift(REPLAY, 0.2)  # cosine 0.981, ratio 1.02
    assert compare(shifted, REPLAY, min_cosine=0.95).passed
    assert not compare(shifted, REPLAY, min_cosine=0.95, norm_ratio_bounds=(0.99, 1.01)).passed
    assert compare([1.5 * t for t in REPLAY], REPLAY, norm_ratio_bounds=(0.5, 2.0)).passed


def test_a_contribution_trained_on_other_data_points_elsewhere():
    """Least squares on two data sets drawn around the same weights: 20 SGD steps on each from the same start."""
    g = torch.Generator().manual_seed(3)
    w_true = torch.randn(8, generator=g)

    def trained(seed):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(32, 8, generator=gen)
        y = x @ (w_true + 0.3 * torch.randn(8, generator=gen)) + 0.3 * torch.randn(32, generator=gen)
        w = torch.zeros(8, requires_grad=True)
        for _ in range(20):
            (grad,) = torch.autograd.grad(((x @ w - y) ** 2).mean(), [w])
            w = (w - 0.05 * grad).detach().requires_grad_()
        return [-w.detach()]

    assert compare(trained(10), trained(10)).passed
    assert not compare(trained(11), trained(10)).passed


@pytest.mark.parametrize("kwargs", [dict(min_cosine=1.5), dict(norm_ratio_bounds=(0.0, 1.1)),
                                    dict(norm_ratio_bounds=(1.1, 1.2)), dict(norm_ratio_bounds=(0.9, math.inf))])
def test_bad_thresholds_are_the_callers_error(kwargs):
    with pytest.raises(ValueError):
        compare(REPLAY, REPLAY, **kwargs)


def test_a_non_finite_replay_is_the_validators_error():
    with pytest.raises(ValueError, match="replayed"):
        compare(REPLAY, [torch.full_like(t, math.inf) for t in REPLAY])

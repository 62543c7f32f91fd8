"""Weights by work (cotrain.averaging.work) and the aggregators that use them: a fast node counts for its samples,
a lie about them for the median peer, as tables of pure functions."""

import pytest
import torch

from cotrain.averaging.allreduce import weighted_mean
from cotrain.averaging.robust import centered_clip, clipped_mean
from cotrain.averaging.work import MAX_SPEEDUP, credited_weights, radius_scales


def walk(steps: int, seed: int, drift: torch.Tensor, noise: float = 1.0) -> torch.Tensor:
    """A pseudo-gradient as a sum of ``steps`` noisy steps along ``drift`` (honest local training, in miniature)."""
    g = torch.Generator().manual_seed(seed)
    return sum(drift + noise * torch.randn(drift.shape, generator=g) for _ in range(steps))


DRIFT = torch.full((4000,), 0.15)  # honest pseudo-gradients' cosine about 0.2, as measured on the LSTM


def group(fast_steps: int = 10, claim: float = 10.0, slow: int = 2):
    parts = [walk(10, seed, DRIFT) for seed in range(slow)] + [walk(fast_steps, 99, DRIFT)]
    return parts, [160.0] * slow + [160.0 * claim]


@pytest.mark.parametrize("speedup", [3, 20])
def test_a_fast_node_is_credited_for_the_work_it_did(speedup):
    parts, weights = group(fast_steps=10 * speedup, claim=speedup)
    credited = credited_weights(parts, weights)
    assert credited[:2] == weights[:2]
    assert credited[2] == pytest.approx(weights[2], rel=1e-9)  # its norm shows it: about sqrt(k) times the median's


@pytest.mark.parametrize("claim", [3.0, 1000.0, 1e9])
def test_a_claim_its_pseudo_gradient_does_not_show_counts_as_the_median(claim):
    parts, weights = group(fast_steps=10, claim=claim)  # an ordinary node that says it did more
    credited = credited_weights(parts, weights)
    assert credited[2] <= 1.5 * 160.0  # its norm is about the median's: at most a little above the median
    assert credited[:2] == weights[:2]
    parts[2] = parts[2] * (parts[1].norm() / parts[2].norm())  # exactly as long as the median: exactly the median
    assert credited_weights(parts, weights)[2] == pytest.approx(160.0, rel=1e-6)


@pytest.mark.parametrize("attack", ["sign_flip", "noise"])
def test_a_long_contribution_that_points_away_counts_as_the_median(attack):
    parts, weights = group(fast_steps=10, claim=100.0)
    honest = parts[2]
    if attack == "sign_flip":
        parts[2] = -10.0 * honest
    else:  # noise of ten times the norm, orthogonalised against the groupmates' median so it cannot point their way
        z = torch.randn(honest.shape, generator=torch.Generator().manual_seed(5))
        reference = (parts[0] + parts[1]) / 2
        z = z - (z @ reference) / (reference @ reference) * reference - 1e-3 * reference
        parts[2] = z * (10.0 * honest.norm() / z.norm())
    assert credited_weights(parts, weights)[2] == 160.0


def test_no_contribution_counts_for_more_than_the_bound():
    parts, weights = group(fast_steps=10, claim=1e9)
    parts[2] = parts[2] * 1000.0  # shows a million times the work
    assert credited_weights(parts, weights)[2] == 160.0 * MAX_SPEEDUP


def test_crediting_is_idempotent_and_keeps_small_weights():
    parts, weights = group(fast_steps=200, claim=50.0)
    once = credited_weights(parts, weights)
    assert credited_weights(parts, once) == once
    assert credited_weights(parts[:1], [7.0]) == [7.0]
    assert credited_weights(parts, [1.0, 2.0, 3.0])[:2] == [1.0, 2.0]


def test_radius_scales_grow_with_the_square_root_of_the_credit():
    assert radius_scales([100.0, 100.0, 400.0]) == [1.0, 1.0, 2.0]
    assert radius_scales([100.0, 50.0, 100.0]) == [1.0, 1.0, 1.0]  # never below 1
    assert radius_scales([0.0, 0.0]) == [1.0, 1.0]


@pytest.mark.parametrize("aggregate", [centered_clip, lambda p, w: clipped_mean(p, w, 2.0)],
                         ids=["centered_clip", "clipped_mean"])
def test_the_aggregators_follow_a_fast_nodes_work(aggregate):
    parts, weights = group(fast_steps=200, claim=20.0)
    mean = weighted_mean(parts, weights)
    result = aggregate(parts, weights)
    capped = weighted_mean(parts, [160.0] * 3)  # what counting it as the median peer would give
    assert (result - mean).norm() < 0.2 * (capped - mean).norm()


@pytest.mark.parametrize("aggregate", [centered_clip, lambda p, w: clipped_mean(p, w, 2.0)],
                         ids=["centered_clip", "clipped_mean"])
def test_the_aggregators_give_a_liar_nothing(aggregate):
    parts, weights = group(fast_steps=10, claim=1000.0)
    honest_weights = [160.0] * 3
    result = aggregate(parts, weights)
    assert (result - aggregate(parts, honest_weights)).norm() < 0.35 * (parts[2] - weighted_mean(parts, honest_weights)).norm()

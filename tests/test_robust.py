import pytest
import torch

from cotrain.averaging.allreduce import weighted_mean
from cotrain.averaging.work import credited_weights
from cotrain.averaging.robust import (build_aggregator, centered_clip, clipped_mean, lower_median,
                                      trimmed_mean)


def honest_and_attacker(attack: str, n_honest: int = 4, dim: int = 1000):
    torch.manual_seed(0)
    truth = torch.randn(dim)
    honest = [truth + 0.1 * torch.randn(dim) for _ in range(n_honest)]
    bad = {"scaled": 100.0 * truth, "sign_flip": -10.0 * truth, "random": 50.0 * torch.randn(dim)}[attack]
    return truth, honest + [bad]


@pytest.mark.parametrize("attack", ["scaled", "sign_flip", "random"])
@pytest.mark.parametrize("aggregate", [trimmed_mean, centered_clip], ids=["trimmed_mean", "centered_clip"])
def test_one_attacker_in_five_barely_moves_a_robust_aggregate(attack, aggregate):
    truth, parts = honest_and_attacker(attack)
    weights = [1.0] * len(parts)
    plain = (weighted_mean(parts, weights) - truth).norm()
    robust = (aggregate(parts, weights) - truth).norm()
    assert robust < 0.2 * truth.norm()  # close to the honest answer
    assert robust < 0.1 * plain  # where the plain mean is far off


def test_without_an_attacker_robust_aggregates_stay_close_to_the_mean():
    torch.manual_seed(1)
    parts = [torch.randn(500) for _ in range(5)]
    mean = weighted_mean(parts, [1.0] * 5)
    for kind in ("trimmed_mean", "centered_clip", "clipped_mean"):
        assert (build_aggregator(kind)(parts, [1.0] * 5) - mean).norm() < 0.5 * mean.norm() + 1.0


def test_unknown_aggregation_is_named():
    with pytest.raises(ValueError, match="averaging.aggregation"):
        build_aggregator("median_of_means")


def test_clipped_mean_of_honest_contributions_of_similar_norms_is_the_weighted_mean():
    torch.manual_seed(2)
    truth = torch.randn(300)
    parts = [truth + 0.3 * torch.randn(300) for _ in range(5)]
    weights = [640.0, 512.0, 640.0, 600.0, 640.0]  # at most the median weight: none is capped
    assert torch.equal(clipped_mean(parts, weights), weighted_mean(parts, weights))
    assert torch.equal(build_aggregator("clipped_mean")(parts, weights), weighted_mean(parts, weights))
    # weights above the median that the parts' norms do not back count for little more than the median one
    heavy = [640.0, 512.0, 7000.0, 600.0, 66000.0]
    credited = credited_weights(parts, heavy)
    assert max(credited) < 2 * 640.0
    assert torch.allclose(clipped_mean(parts, heavy), weighted_mean(parts, credited))


@pytest.mark.parametrize("n", [5, 4, 3])
@pytest.mark.parametrize("factor", [10.0, -10.0, 1000.0, -1000.0])
def test_clipped_mean_bounds_a_scaled_contribution_by_its_share_of_the_clip(n, factor):
    torch.manual_seed(3)
    truth = torch.randn(400)
    honest = [truth + 0.2 * torch.randn(400) for _ in range(n - 1)]
    parts, weights = honest + [factor * honest[0]], [1.0] * n
    multiple = 2.0
    norms = sorted(float(p.norm()) for p in parts)
    bound = multiple * norms[(n - 1) // 2]
    assert bound <= multiple * max(norms[:-1]) + 1e-4  # the attacker cannot raise the median above the honest ones
    result = clipped_mean(parts, weights, multiple)
    without = weighted_mean(honest + [torch.zeros(400)], weights)  # the honest parts are not clipped
    assert (result - without).norm() <= bound / n * (1 + 1e-5)
    # however large, the scaled contribution is clipped to the same vector: x10 and x1000 agree
    same_sign = clipped_mean(honest + [(1000.0 if factor > 0 else -1000.0) * honest[0]], weights, multiple)
    assert torch.allclose(result, same_sign, atol=1e-6)
    assert (result - truth).norm() < (weighted_mean(parts, weights) - truth).norm()


@pytest.mark.parametrize("aggregate", [centered_clip, clipped_mean], ids=["centered_clip", "clipped_mean"])
def test_a_claimed_huge_weight_does_not_take_over(aggregate):
    torch.manual_seed(4)
    truth = torch.randn(200)
    honest = [truth + 0.5 * torch.randn(200) for _ in range(4)]
    for bad in (-10.0 * truth, -1000.0 * truth):
        result = aggregate(honest + [bad], [100.0] * 4 + [1e11])
        assert float(result @ truth) > 0.3 * float(truth @ truth)  # uncapped, CenteredClip ends at -0.6


def test_clipped_mean_caps_a_claimed_weight():
    torch.manual_seed(4)
    truth = torch.randn(200)
    honest = [truth + 0.1 * torch.randn(200) for _ in range(4)]
    parts, weights = honest + [-1000.0 * truth], [100.0] * 4 + [1e9]
    result = clipped_mean(parts, weights, 2.0)
    # the attacker counts as the median weight, 100 of 500, times its part clipped to 2 x the median norm
    bound = 2.0 * sorted(float(p.norm()) for p in parts)[2]
    assert (result - weighted_mean(honest, [1.0] * 4) * 4 / 5).norm() <= bound / 5 * (1 + 1e-5)
    assert float(result @ truth) > 0.3 * float(truth @ truth)  # still well in the honest direction


def test_clipped_mean_with_two_peers_uses_the_smaller_norm():
    h = torch.tensor([3.0, 4.0])  # norm 5
    for bad in (10.0 * h, 1e6 * h):
        assert torch.allclose(clipped_mean([h, bad], [1.0, 1.0], 2.0), 1.5 * h)  # (1 + multiple) / 2, not 5.5x
    assert torch.allclose(clipped_mean([h, -10.0 * h], [1.0, 1.0], 1.0), torch.zeros(2), atol=1e-6)
    assert torch.equal(clipped_mean([h, 1.5 * h], [1.0, 1.0], 2.0), weighted_mean([h, 1.5 * h], [1.0, 1.0]))


def test_clipped_mean_of_one_peer_is_its_part():
    h = torch.tensor([1.0, -2.0, 3.0])
    out = clipped_mean([h], [7.0])
    assert torch.equal(out, h) and out is not h


def test_clipped_mean_with_ties_and_zero_norms():
    h = torch.tensor([1.0, 2.0, 2.0])  # norm 3
    # equal norms: nothing is clipped
    assert torch.equal(clipped_mean([h, h, h], [2.0, 1.0, 2.0]), weighted_mean([h, h, h], [2.0, 1.0, 2.0]))
    # ties at exactly the bound pass through
    parts = [h, h, 2.0 * h]
    assert torch.equal(clipped_mean(parts, [1.0] * 3, 2.0), weighted_mean(parts, [1.0] * 3))
    # zero contributions (a part nobody's training touched): no division by zero
    z = torch.zeros(3)
    assert torch.equal(clipped_mean([z, z, z], [1.0] * 3), z)
    out = clipped_mean([z, z, 5.0 * h], [1.0] * 3)  # a majority of zeros: the median is 0, the outlier is cut to 0
    assert torch.isfinite(out).all() and torch.equal(out, z)
    out = clipped_mean([z, h, h, 100.0 * h], [1.0] * 4)  # lower median of 0, 3, 3, 300 is 3: bound 6
    assert torch.allclose(out, (h + h + 2.0 * h) / 4)


def test_clipped_mean_is_pure():
    torch.manual_seed(5)
    parts = [torch.randn(50) for _ in range(4)] + [torch.randn(50) * 100]
    copies = [p.clone() for p in parts]
    first = clipped_mean(parts, [1.0, 2.0, 3.0, 4.0, 5.0])
    assert all(torch.equal(p, c) for p, c in zip(parts, copies))
    assert torch.equal(first, clipped_mean(copies, [1.0, 2.0, 3.0, 4.0, 5.0]))


@pytest.mark.parametrize("rows", [2, 3, 4, 5, 8, 9])
def test_lower_median_is_torchs_median_across_rows(rows):
    torch.manual_seed(rows)
    stacked = torch.randn(rows, 1000)
    stacked[:, :100] = stacked[0, :100]  # ties
    stacked[:, 100:200] = torch.randint(-2, 3, (rows, 100)).float()
    assert torch.equal(lower_median(stacked), stacked.median(dim=0).values)

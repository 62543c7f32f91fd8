import pytest
import torch

from cotrain.averaging.allreduce import weighted_mean
from cotrain.averaging.robust import build_aggregator, centered_clip, trimmed_mean


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
    for kind in ("trimmed_mean", "centered_clip"):
        assert (build_aggregator(kind)(parts, [1.0] * 5) - mean).norm() < 0.5 * mean.norm() + 1.0


def test_unknown_aggregation_is_named():
    with pytest.raises(ValueError, match="averaging.aggregation"):
        build_aggregator("median_of_means")

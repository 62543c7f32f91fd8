"""A round's reduction as values (cotrain.averaging.reduction): error feedback kept where the strategy says, the
hosted all-reduce of a group of one, and each strategy's choice of feedback. No network: a hosted reduction is
pure functions, and the exchange is only for the butterfly."""

import pytest
import torch

from cotrain.averaging.diloco import DiLoCo
from cotrain.averaging.reduction import Feedback, Reduction
from cotrain.averaging.sync import SyncAveraging
from cotrain.config import AveragingConfig, CompressionConfig

SHAPES = [torch.Size([300]), torch.Size([40, 50])]


def reduction(feedback: Feedback, kind: str = "int8") -> Reduction:
    return Reduction(None, AveragingConfig(min_part_values=1 << 20), CompressionConfig(kind=kind), SHAPES, feedback)


def contribution(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in SHAPES]


def hosted_round(r: Reduction, c: list[torch.Tensor]):
    hosting = r.hosting(c, 16.0)
    assert hosting is not None  # a small vector rides with the meeting
    result = hosting.reduce({"me": hosting.piece})
    return hosting.average(result, ["me"])


def test_a_lossy_codecs_error_goes_to_the_next_contribution_by_default():
    r = reduction(Feedback())
    c = contribution(0)
    reduced = hosted_round(r, c)
    assert reduced.complete and reduced.credits == {"me": 16.0} and not reduced.dropped
    sent = torch.cat([a.reshape(-1) for a in reduced.average])
    flat = torch.cat([a.reshape(-1) for a in c])
    assert torch.allclose(r.error, flat - sent) and r.error.abs().sum() > 0  # int8 left something out
    assert r.take_residual() is None
    flat2, _, use = r.prepared(contribution(1))
    assert use and torch.allclose(flat2, torch.cat([a.reshape(-1) for a in contribution(1)]) + r.error)


def test_in_params_the_error_is_handed_to_the_strategy_once():
    r = reduction(Feedback(in_params=True))
    c = contribution(0)
    reduced = hosted_round(r, c)
    residual = r.take_residual()
    assert [t.shape for t in residual] == SHAPES and r.error is None
    for kept, sent, mine in zip(residual, reduced.average, c):
        assert torch.allclose(kept + sent, mine, atol=1e-6)
    assert r.take_residual() is None


def test_a_lossless_codec_keeps_no_error_unless_it_is_the_outer_memory():
    plain = reduction(Feedback(), kind="none")
    hosted_round(plain, contribution(0))
    assert plain.error is None or plain.error.abs().sum() == 0
    outer = reduction(Feedback(outer=True, decay=0.5), kind="none")
    _, _, use = outer.prepared(contribution(0))
    assert use


@pytest.mark.parametrize("strategy, averaging, expected", [
    (DiLoCo, {}, Feedback(in_params=True)),
    (DiLoCo, {"outer": "error_feedback", "error_decay": 0.9, "error_buffer": "separate"},
     Feedback(in_params=False, outer=True, decay=0.9)),
    (DiLoCo, {"outer": "error_feedback", "error_decay": 0.9, "error_buffer": "model"},
     Feedback(in_params=True, outer=True, decay=0.9)),
    (SyncAveraging, {}, Feedback()),
])
def test_each_strategy_says_where_its_feedback_goes(strategy, averaging, expected):
    assert strategy.feedback_of(AveragingConfig(**averaging)) == expected


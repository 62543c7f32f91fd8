"""The byzantine contributions of the benches: each does what its name says, round after round."""

import torch

from cotrain.averaging.attacks import ALIE_Z, make_attack


def test_zero_sends_nothing():
    assert torch.equal(make_attack("zero")(torch.randn(10)), torch.zeros(10))


def test_stale_sends_the_previous_rounds_contribution():
    stale = make_attack("stale")
    a, b, c = torch.randn(10), torch.randn(10), torch.randn(10)
    assert torch.equal(stale(a), a)  # nothing earlier: its first round is honest
    assert torch.equal(stale(b), a)
    assert torch.equal(stale(c), b)


def test_alie_shifts_every_value_a_little_in_one_fixed_direction():
    alie = make_attack("alie", seed=3)
    v = torch.randn(10_000)
    shifted = alie(v)
    assert torch.allclose((shifted - v).abs(), ALIE_Z * v.abs())
    assert 1.05 < float(shifted.norm() / v.norm()) < 1.2  # inside any clipping radius
    direction = torch.sign(shifted - v)
    w = torch.randn(10_000)
    assert torch.equal(torch.sign(alie(w) - w)[w != 0], direction[w != 0])  # the same signs every round


def test_other_data_is_the_same_text_in_another_alphabet_every_time():
    from cotrain.averaging.attacks import other_data

    x = torch.arange(256).view(4, 64)
    a, b = other_data((x, x + 0))[0], other_data((x,))[0]
    assert torch.equal(a, b) and not torch.equal(a, x)
    assert sorted(a.flatten().tolist()) == list(range(256))  # a bijection of the bytes
    assert torch.equal(make_attack("other_data")(x.float()), x.float())  # its contribution is its training's

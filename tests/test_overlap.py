"""A round's outcome and the overlap's bookkeeping as pure logic (cotrain.averaging.outcome, .overlap)."""


import pytest
import torch

from cotrain.averaging.diloco import outer_step
from cotrain.averaging.outcome import Kind, credited_samples, majority_holders, round_outcome
from cotrain.averaging.overlap import PendingRound, carry_local_progress


def info(**hashes):
    return {peer: {"hash": h, "samples": 10} for peer, h in hashes.items()}


def test_a_complete_round_of_everyone_seen_applies():
    assert round_outcome("me", "x", info(me="x", a="x", b="x"), complete=True, seen=3)[:2] == (Kind.APPLY, False)


def test_a_round_is_partial_when_a_contribution_or_a_peer_seen_is_missing():
    kind, partial, reason = round_outcome("me", "x", info(me="x", a="x"), complete=True, seen=3)
    assert (kind, partial) == (Kind.APPLY, True) and "2 of the 3" in reason
    assert round_outcome("me", "x", info(me="x", a="x"), complete=False, seen=2)[:2] == (Kind.APPLY, True)


def test_a_peer_whose_state_is_not_the_groups_majority_resyncs_and_ties_pick_the_same_state_everywhere():
    assert round_outcome("me", "y", info(me="y", a="x", b="x"), True, 3)[0] is Kind.RESYNC
    assert round_outcome("a", "x", info(me="y", a="x", b="x"), True, 3)[0] is Kind.APPLY
    # two against two: every member picks the same side (the larger hash), so exactly one side resyncs
    tie = info(a="1", b="1", c="2", d="2")
    kinds = {p: round_outcome(p, h["hash"], tie, True, 4)[0] for p, h in tie.items()}
    assert kinds == {"a": Kind.RESYNC, "b": Kind.RESYNC, "c": Kind.APPLY, "d": Kind.APPLY}
    # those that resync download the group's state from the side that applies, never from their own side
    assert majority_holders(tie) == ["c", "d"]
    assert majority_holders(info(me="y", a="x", b="x")) == ["a", "b"]


def test_the_members_samples_are_counted_bounded_and_at_most_their_credit():
    said = {"me": {"samples": 5}, "a": {"samples": 7}, "b": {"samples": -3}, "c": {"samples": "x"}, "d": {},
            "liar": {"samples": 10**15}}
    assert credited_samples(said) == {"me": 5, "a": 7, "b": 0, "c": 0, "d": 0, "liar": 1 << 40}
    credited = credited_samples(said, {"me": 5.0, "a": 9.0, "liar": 6.0, "d": 3.0})
    assert credited == {"me": 5, "a": 7, "b": 0, "c": 0, "d": 0, "liar": 6}  # never more than claimed


def test_a_round_that_did_not_happen_gives_the_node_back_its_counters():
    pending = PendingRound(round=3, steps=10, samples=80, reached_h_at=100.0, contribution=[], early=True, seen=3)
    assert pending.give_back(steps=4, samples=32, reached_h_at=None) == (14, 112, 100.0)


def test_overlap_keeps_the_local_steps_taken_since_the_round_was_launched():
    torch.manual_seed(0)
    start = [torch.randn(4, 3), torch.randn(5)]  # where the local model went on from (DiLoCo: the eager guess)
    since = [0.01 * torch.randn_like(t) for t in start]  # what the node learned while the round ran
    local = [s + d for s, d in zip(start, since)]
    new_global = [torch.randn_like(t) for t in start]
    carry_local_progress(local, start, new_global)
    assert all(torch.allclose(p, g + d, atol=1e-6) for p, g, d in zip(local, new_global, since))
    # nothing learned since: the local model restarts from the new global parameters, as without overlap
    local = [s.clone() for s in start]
    carry_local_progress(local, start, new_global)
    assert all(torch.allclose(p, g, atol=1e-6) for p, g in zip(local, new_global))


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_diloco_guesses_the_outer_step_its_own_pseudo_gradient_would_take(momentum):
    # the eager guess must be exactly the outer step of an average equal to this peer's own contribution
    torch.manual_seed(1)
    params = [torch.randn(4, 3), torch.randn(5)]
    buffers = [torch.randn_like(g) for g in params]
    outer = torch.optim.SGD(params, lr=0.7, momentum=momentum, nesterov=momentum > 0)
    if momentum:
        for g, m in zip(params, buffers):
            outer.state[g]["momentum_buffer"] = m
    delta = [torch.randn_like(g) for g in params]
    before = [g.clone() for g in params]
    guess = outer_step(params, buffers, delta, 0.7, momentum)
    assert all(torch.equal(g, b) for g, b in zip(params, before))  # nothing moved yet
    for g, d in zip(params, delta):
        g.grad = d.clone()
    outer.step()
    assert all(torch.allclose(x, g, atol=1e-6) for x, g in zip(guess, params))

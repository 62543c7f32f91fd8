"""Routing over a grid of experts and mixing their answers (cotrain.moe.gating): pure functions, as tables."""

import math

import pytest
import torch

from cotrain.moe.gating import expert_uid, grid_experts, mix, split_scores, step_decision, top_k


def test_a_grid_names_every_expert_once_in_order():
    assert grid_experts([2, 3]) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert expert_uid("ffn", (1, 2)) == "ffn.1.2"


def test_the_gate_scores_each_dimension_apart():
    a, b = split_scores(torch.arange(5.0).reshape(1, 5), [2, 3])
    assert a.tolist() == [[0.0, 1.0]] and b.tolist() == [[2.0, 3.0, 4.0]]
    with pytest.raises(ValueError, match="gate: 4 scores for a grid of \\[2, 3\\]"):
        split_scores(torch.zeros(1, 4), [2, 3])


@pytest.mark.parametrize("available, k, expected", [
    ([(0, 0), (0, 1), (1, 0), (1, 1)], 2, [(1, 1), (1, 0)]),  # 10+5 = 15, 10+1 = 11 beat 2+5 = 7, 2+1 = 3
    ([(0, 0), (0, 1), (1, 0)], 2, [(1, 0), (0, 1)]),  # (1, 1) is down: the next best
    ([(0, 0)], 3, [(0, 0)]),  # fewer up than k: all of them
])
def test_the_best_k_of_the_experts_that_are_up(available, k, expected):
    dims = [torch.tensor([[2.0, 10.0]]), torch.tensor([[1.0, 5.0]])]
    picked, scores = top_k(dims, available, k)
    assert [available[i] for i in picked[0].tolist()] == expected
    assert scores[0].tolist() == [sum(float(d[0, j]) for d, j in zip(dims, cell)) for cell in expected]


def test_routing_needs_an_expert_and_the_grids_dimensions():
    with pytest.raises(ValueError, match="available: no expert"):
        top_k([torch.zeros(1, 2)], [], 1)
    with pytest.raises(ValueError, match="available: experts of 2 dimensions for a grid of 1"):
        top_k([torch.zeros(1, 2)], [(0, 0)], 1)


def test_the_mixture_is_renormalized_over_the_answers_that_came():
    answers = torch.tensor([[[1.0], [3.0], [100.0]]])  # one row, k = 3, dim 1
    scores = torch.tensor([[0.0, 0.0, 5.0]])
    both = mix(answers, scores, torch.tensor([[True, True, False]]))
    assert both.tolist() == [[2.0]]  # equal scores, the third left out whatever it holds
    assert mix(answers, scores, torch.tensor([[False, False, False]])).tolist() == [[0.0]]
    full = mix(answers, scores, torch.ones(1, 3, dtype=torch.bool))
    w = torch.softmax(scores[0], 0)
    assert math.isclose(float(full), float((w * answers[0, :, 0]).sum()), rel_tol=1e-6)


def test_the_gate_learns_from_the_mixture():
    scores = torch.tensor([[0.0, 1.0]], requires_grad=True)
    mix(torch.tensor([[[1.0], [2.0]]]), scores, torch.ones(1, 2, dtype=torch.bool)).sum().backward()
    assert scores.grad is not None and scores.grad[0, 1] > 0  # more weight on the larger answer raises the output


@pytest.mark.parametrize("answered, k_min, go", [
    ([[True, True], [True, False]], 1, True),
    ([[True, True], [False, False]], 1, False),
    ([[True, True], [True, False]], 2, False),
])
def test_a_step_goes_on_when_every_chunk_has_k_min_answers(answered, k_min, go):
    decision = step_decision(torch.tensor(answered), k_min)
    assert decision.go == go and decision.reason

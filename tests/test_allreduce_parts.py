"""Who reduces which part of an all-reduce: pure functions, every member computes the same."""

import pytest

from cotrain.averaging.allreduce import choose_reducers, part_bounds


def test_without_a_minimum_every_dialable_peer_reduces():
    assert choose_reducers(4, None, 10, 0, "t") == [True] * 4
    assert choose_reducers(4, [True, False, True, False], 10, 0, "t") == [True, False, True, False]


@pytest.mark.parametrize("numel, expected", [(10, 1), (65_535, 1), (131_072, 2), (200_000, 3), (10**9, 4)])
def test_parts_hold_the_minimum_and_at_least_one_peer_reduces(numel, expected):
    flags = choose_reducers(4, None, numel, 65_536, "r7-abc")
    assert sum(flags) == expected
    bounds = part_bounds(numel, 4, flags)
    sizes = [b - a for a, b in bounds]
    assert sum(sizes) == numel
    assert all(size == 0 for size, f in zip(sizes, flags) if not f)
    if expected > 1:
        assert min(size for size, f in zip(sizes, flags) if f) >= 65_536


def test_only_dialable_peers_reduce_and_the_choice_moves_with_the_tag():
    dialable = [True, False, True, True, False]
    chosen = {tuple(choose_reducers(5, dialable, 1000, 65_536, f"r{r}-x")) for r in range(40)}
    assert all(sum(c) == 1 for c in chosen)
    assert all(not c[1] and not c[4] for c in chosen)
    assert len(chosen) == 3  # each of the three dialable peers in turn
    # the same tag: the same choice (every member computes it for itself)
    assert choose_reducers(5, dialable, 1000, 65_536, "r1-x") == choose_reducers(5, dialable, 1000, 65_536, "r1-x")


def test_nobody_dialable_means_everyone_may_reduce():
    assert sum(choose_reducers(3, [False] * 3, 10, 65_536, "t")) == 1
    assert choose_reducers(3, [False] * 3, 10, 0, "t") == [True] * 3

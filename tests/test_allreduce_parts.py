"""Who reduces which part of an all-reduce, and a host's reduction at its meeting: pure functions, every member
computes the same."""

import struct

import pytest
import torch

from cotrain.averaging.work import credited_weights
from cotrain.averaging.allreduce import (AllReduceFailed, choose_reducers, contribution_piece, hosted, hosted_average,
                                         hosted_reduce, part_bounds, weighted_mean)
from cotrain.compression import Int8Blockwise, NoCompression
from hivemind.utils.crypto import RSAPrivateKey

from cotrain.verification.witness import PartSigning, part_digest


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


# ---- the all-reduce a board group's host does at its meeting (allreduce.hosted) -----------------------------------

@pytest.mark.parametrize("numel", [10, 65_535, 131_071, 131_072, 10**6])
def test_a_vector_is_hosted_exactly_when_the_butterfly_would_give_it_one_reducer(numel):
    assert hosted(numel, 65_536) == (sum(choose_reducers(4, None, numel, 65_536, "t")) == 1)
    assert not hosted(numel, 0)  # min_part_values = 0: every member reduces a part, always


def test_the_hosts_result_is_the_weighted_mean_and_a_bad_contribution_is_left_out_by_name():
    torch.manual_seed(0)
    common = torch.randn(100)
    vectors = {"a": common + torch.randn(100), "b": 1.2 * (common + torch.randn(100)), "c": common + torch.randn(100)}
    pieces = {peer: contribution_piece(v, w, NoCompression())[0]
              for (peer, v), w in zip(vectors.items(), [1.0, 2.0, 1.0])}
    dropped: dict = {}
    count, average, credits = hosted_average(hosted_reduce(pieces, 100, NoCompression(), weighted_mean, dropped),
                                             "cba", 100, NoCompression())
    assert count == 3 and not dropped
    # b claims twice the others' weight; a vector 1.2x their norm shows about 1 + SLACK x 0.44 of it
    expected = credited_weights(list(vectors.values()), [1.0, 2.0, 1.0])
    assert credits == dict(zip("abc", expected)) and 1.0 < credits["b"] < 2.0
    assert torch.allclose(average, weighted_mean(list(vectors.values()), expected), atol=1e-6)

    nan = contribution_piece(torch.full((100,), float("nan")), 1.0, NoCompression())[0]
    bad = dict(pieces, b=nan, c=pieces["c"][:-4], d=b"")  # d: nothing came with its meeting
    count, average, credits = hosted_average(hosted_reduce(bad, 100, NoCompression(), weighted_mean, dropped),
                                             "abcd", 100, NoCompression())
    assert count == 1 and torch.equal(average, vectors["a"])
    assert credits == {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0}  # those left out are credited nothing
    assert set(dropped) == {"b", "c", "d"}
    assert "non-finite" in dropped["b"] and "malformed" in dropped["c"] and "did not arrive" in dropped["d"]


def test_a_member_takes_only_a_result_that_is_one():
    good = hosted_reduce({"a": contribution_piece(torch.ones(10), 1.0, NoCompression())[0]}, 10, NoCompression(),
                         weighted_mean, {})
    assert hosted_average(good, "a", 10, NoCompression())[0] == 1
    wrong_credits = good[:6] + struct.pack("<d", float("inf")) + good[14:]
    for result in (b"", b"\x03\x00", b"\x02\x00\x00\x00" + b"\x00" * 7, good[:-4], wrong_credits,
                   struct.pack("<IH", 1, 3) + good[6:]):  # credits for a group of 3
        with pytest.raises(AllReduceFailed):
            hosted_average(result, "a", 10, NoCompression())


def test_what_a_member_sends_is_what_the_host_decodes():
    vector = torch.randn(1000)
    piece, decoded = contribution_piece(vector, 3.0, Int8Blockwise())
    assert struct.unpack("<d", piece[:8]) == (3.0,)
    assert torch.equal(decoded, Int8Blockwise().decode(piece[8:], 1000))
    assert not torch.equal(decoded, vector)  # lossy: error feedback keeps the difference


def test_a_members_reputation_scales_what_its_work_is_credited_with():
    torch.manual_seed(0)
    common = torch.randn(100)
    vectors = {p: common + torch.randn(100) for p in "abc"}
    pieces = {p: contribution_piece(v, 1.0, NoCompression())[0] for p, v in vectors.items()}
    reputation = {"a": 1.0, "b": 0.25, "c": 1.0}.get
    count, average, credits = hosted_average(
        hosted_reduce(pieces, 100, NoCompression(), weighted_mean, {}, reputation), "abc", 100, NoCompression())
    plain = credited_weights(list(vectors.values()), [1.0, 1.0, 1.0])
    assert credits == {"a": plain[0], "b": plain[1] * 0.25, "c": plain[2]}
    assert torch.allclose(average, weighted_mean(list(vectors.values()), list(credits.values())), atol=1e-6)


def test_the_host_witnesses_each_signed_contribution_as_its_member_decodes_it():
    torch.manual_seed(3)
    codec = Int8Blockwise(64)
    keys = {peer: RSAPrivateKey() for peer in "abcd"}
    public = {peer: key.get_public_key().to_bytes() for peer, key in keys.items()}
    pieces, decoded = {}, {}
    for peer in "abc":
        pieces[peer], decoded[peer] = contribution_piece(torch.randn(500), 1.0, codec,
                                                         PartSigning("run", 4, peer, keys[peer], public.get))
    pieces["d"] = contribution_piece(torch.randn(500), 1.0, codec,  # signed with a key its credential does not name
                                     PartSigning("run", 4, "d", RSAPrivateKey(), public.get))[0]
    pieces["e"] = b"\x00" * 3  # malformed
    took, dropped = [], {}
    host = PartSigning("run", 4, "a", keys["a"], public.get)
    hosted_reduce(pieces, 500, codec, weighted_mean, dropped, signing=host, took=took)
    assert {part.member: part.digest for part in took} == {p: part_digest(decoded[p]) for p in "abc"}
    assert all(part.contribution == part.digest for part in took)  # the whole contribution is the host's one part
    assert set(dropped) == {"d", "e"}
    assert all((part.start, part.end, part.round) == (0, 500, 4) for part in took)

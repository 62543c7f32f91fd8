"""Table-driven tests of the pure round decision."""

import pytest

from cotrain.averaging.progress import (Action, PeerProgress, RoundRules, board_steady, progress_schema, round_decision,
                                        round_peers, shard_key, shard_of)

RULES = RoundRules(inner_steps=10, round_wait=30.0, stale_after=4.0)
NOW = 1000.0


def peer(name, round_, steps, phase="train", mid=False, age=0.0):
    return PeerProgress(name, round_, steps, steps * 8, phase, mid, NOW - age)


CASES = [
    # (why, me, peers, reached_h_at, expected action)
    ("below H trains on", peer("me", 3, 4), [peer("a", 3, 4)], None, Action.TRAIN),
    ("alone at H averages", peer("me", 3, 10), [], NOW, Action.AVERAGE),
    ("stale peers do not count", peer("me", 3, 10), [peer("a", 3, 2, age=9.0)], NOW, Action.AVERAGE),
    ("all peers at H average", peer("me", 3, 10), [peer("a", 3, 11), peer("b", 3, 10)], NOW, Action.AVERAGE),
    ("a slow peer is waited for", peer("me", 3, 10), [peer("a", 3, 5)], NOW - 5, Action.TRAIN),
    ("a slow peer is waited for at most round_wait", peer("me", 3, 12), [peer("a", 3, 5)], NOW - 31, Action.AVERAGE),
    ("a mid-round joiner is not waited for", peer("me", 3, 10), [peer("a", 3, 2, mid=True)], NOW, Action.AVERAGE),
    ("a peer ahead means resync", peer("me", 3, 4), [peer("a", 4, 1)], None, Action.RESYNC),
    ("resync wins over averaging", peer("me", 3, 10), [peer("a", 5, 1), peer("b", 3, 10)], NOW, Action.RESYNC),
    ("follow a peer that began averaging", peer("me", 3, 6), [peer("a", 3, 10, phase="average")], None,
     Action.AVERAGE),
    ("no step yet: do not follow", peer("me", 3, 0), [peer("a", 3, 10, phase="average")], None, Action.TRAIN),
    ("a peer behind is waited for (it resyncs)", peer("me", 3, 10), [peer("a", 2, 10)], NOW, Action.TRAIN),
    ("a peer that left does not count", peer("me", 3, 10), [peer("a", 3, 2, phase="left")], NOW, Action.AVERAGE),
    ("ourselves in the records are ignored", peer("me", 3, 10), [peer("me", 3, 10)], NOW, Action.AVERAGE),
]


@pytest.mark.parametrize("why, me, peers, reached, expected", CASES, ids=[c[0] for c in CASES])
def test_round_decision(why, me, peers, reached, expected):
    decision = round_decision(NOW, me, peers, RULES, reached)
    assert decision.action is expected, decision.reason
    assert decision.reason


SPLIT_CASES = [
    # (why, me, peers, reached_h_at, expected action) with the round's peers in several groups
    ("a group one round ahead: finish this round with the peers still at it", peer("me", 3, 6),
     [peer("a", 4, 1), peer("b", 3, 5)], None, Action.TRAIN),
    ("... and average with them", peer("me", 3, 10), [peer("a", 4, 1), peer("b", 3, 10)], NOW, Action.AVERAGE),
    ("one round ahead and nobody left at ours: resync", peer("me", 3, 6), [peer("a", 4, 1)], None, Action.RESYNC),
    ("two rounds ahead: resync", peer("me", 3, 6), [peer("a", 5, 1), peer("b", 3, 5)], None, Action.RESYNC),
    ("a peer one round behind finishes with its own group: not waited for", peer("me", 3, 10),
     [peer("a", 2, 10), peer("b", 3, 10)], NOW, Action.AVERAGE),
    ("a peer two rounds behind resyncs to us: waited for", peer("me", 3, 10), [peer("a", 1, 10)], NOW, Action.TRAIN),
    ("a paused peer at our round does not hold us at it", peer("me", 3, 6), [peer("a", 4, 1), peer("b", 3, 5, "paused")],
     None, Action.RESYNC),
]


@pytest.mark.parametrize("why, me, peers, reached, expected", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_round_decision_with_several_groups_a_round(why, me, peers, reached, expected):
    decision = round_decision(NOW, me, peers, RULES, reached, split=True)
    assert decision.action is expected, decision.reason


def test_with_several_groups_a_round_only_the_planned_group_is_waited_for():
    me, shard = peer("me", 3, 10), [peer("a", 3, 4), peer("b", 3, 10)]
    ours = round_decision(NOW, me, shard, RULES, NOW, split=True, group=["me", "b"])
    assert ours.action is Action.AVERAGE, ours.reason  # a is of the shard's other group
    assert round_decision(NOW, me, shard, RULES, NOW, split=True, group=["me", "a"]).action is Action.TRAIN
    assert round_decision(NOW, me, shard, RULES, NOW, split=True).action is Action.TRAIN  # no plan: everyone
    # one group a round: the group is everyone on the board, and a slower peer is waited for whatever the plan
    assert round_decision(NOW, me, shard, RULES, NOW, group=["me", "b"]).action is Action.TRAIN


def test_malformed_records_are_ignored():
    assert PeerProgress.from_record("x", {"round": "not a number"}) is None
    assert PeerProgress.from_record("x", {"steps": 1}) is None
    ok = PeerProgress.from_record("x", {"round": 2, "steps": 3, "samples": 24, "time": 5.0})
    assert ok is not None and ok.round == 2


def test_round_peers_are_those_of_this_round_and_last_rounds_groupmates_still_shown_behind():
    me = peer("me", 5, 10)
    board = [peer("here", 5, 3), peer("groupmate", 4, 10), peer("behind", 4, 10), peer("paused", 5, 2, "paused"),
             peer("gone", 5, 10, age=60.0), peer("left", 5, 10, "left"), peer("ahead", 6, 1), peer("me", 5, 10)]
    assert sorted(round_peers(NOW, me, board, RULES, last_group={"groupmate"})) == ["groupmate", "here"]
    assert round_peers(NOW, me, board, RULES) == ["here"]  # without a last group, only the board's round
    # rounds faster than the board's records: last round's groupmate still shows an older round
    fast = [peer("here", 5, 3), peer("groupmate", 2, 1), peer("behind", 3, 10)]
    assert sorted(round_peers(NOW, me, fast, RULES, last_group={"groupmate"})) == ["groupmate", "here"]


def test_alone_in_a_shard_waits_for_shardmates_before_averaging_alone():
    me = peer("me", 3, 10)
    waiting = round_decision(NOW, me, [], RULES, NOW - 5, alone_waits=True)
    assert waiting.action is Action.TRAIN, waiting.reason
    assert round_decision(NOW, me, [], RULES, NOW - 31, alone_waits=True).action is Action.AVERAGE
    assert round_decision(NOW, me, [peer("a", 3, 10)], RULES, NOW, alone_waits=True).action is Action.AVERAGE
    assert round_decision(NOW, me, [], RULES, NOW - 5).action is Action.AVERAGE  # one key: alone is alone


def test_shards_are_dealt_afresh_every_round_and_evenly():
    peers = [f"peer{i}" for i in range(400)]
    assert {shard_of("run", 7, p, 1) for p in peers} == {0}
    first = [shard_of("run", 7, p, 8) for p in peers]
    assert first == [shard_of("run", 7, p, 8) for p in peers]  # every peer computes every other's shard alike
    counts = [first.count(s) for s in range(8)]
    assert min(counts) >= 25 and max(counts) <= 80, counts  # 50 expected in each
    again = [shard_of("run", 8, p, 8) for p in peers]
    assert sum(a == b for a, b in zip(first, again)) < 100  # next round mixes (1 in 8 expected to stay)
    assert shard_of("other-run", 7, "peer0", 1 << 20) != shard_of("run", 7, "peer0", 1 << 20)
    # a deal that lasts 4 rounds (averaging.board_shard_rounds): rounds 8 to 11 keep every peer's shard, 12 deals anew
    dealt = [shard_of("run", 8, p, 8, 4) for p in peers]
    assert all(dealt == [shard_of("run", r, p, 8, 4) for p in peers] for r in (9, 10, 11))
    assert sum(a == b for a, b in zip(dealt, [shard_of("run", 12, p, 8, 4) for p in peers])) < 100


def test_a_sharded_board_has_one_schema_field_per_shard_key():
    fields = set(progress_schema(4).__fields__)
    assert {f"run_{f}" for f in fields} == {shard_key("run", s) for s in range(4)}
    assert shard_key("run", 0) == "run_progress"  # one shard: the board's key as it always was


def test_the_board_is_steady_when_three_reads_show_exactly_the_last_rounds_group():
    group, live = ["b", "c"], {"a", "b", "c"}
    assert board_steady(False, 2, live, "a", group)
    assert not board_steady(False, 1, live, "a", group)  # two reads the same are not yet three
    assert not board_steady(True, 5, live, "a", group)  # a sharded board is read afresh at every round
    assert not board_steady(False, 5, live | {"d"}, "a", group)  # a newcomer the group has not taken in
    assert not board_steady(False, 5, {"a", "b"}, "a", group)  # a groupmate gone from the board
    assert not board_steady(False, 5, {"a"}, "a", [])  # alone: nothing to average with, nothing steady

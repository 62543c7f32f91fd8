"""Table tests of what a round concludes from its view of the progress board (cotrain.averaging.board_view)."""

import pytest

from cotrain.averaging.board_view import (BoardView, awaiting_read, board_group, board_time, board_unknown,
                                          fresh_view_due, kept_roster, next_view, peers_behind, round_split,
                                          view_stale, view_steady)
from cotrain.averaging.progress import PeerProgress, RoundRules

RULES = RoundRules(inner_steps=10, round_wait=30.0, stale_after=4.0)
NOW = 1000.0


def peer(name, round_=3, phase="train", age=0.0, reducer=True, since=0.0):
    return PeerProgress(name, round_, 5, 40, phase, time=NOW - age, reducer=reducer, since=since)


def view(*peers, read_at=NOW, view_round=3, same_reads=0):
    return BoardView(tuple(peers), read_at, view_round, same_reads,
                     frozenset(p.peer_id for p in peers if p.phase != "left"))


def test_a_read_that_shows_the_same_live_peers_counts_one_more_read_the_same():
    first = next_view(BoardView(), [peer("a"), peer("b")], 10.0, 3)
    assert (first.peers, first.read_at, first.view_round) == ((peer("a"), peer("b")), 10.0, 3)
    assert first.last_live == {"a", "b"} and first.same_reads == 0
    again = next_view(first, [peer("b", round_=4), peer("a"), peer("c", phase="left")], 11.0, 4)
    assert again.same_reads == 1  # who is there did not change: a peer's round, a record that left do not count
    assert next_view(again, [peer("a")], 12.0, 4).same_reads == 0


@pytest.mark.parametrize("read_at, unknown", [(NOW - 5.0, True), (NOW - 4.0, False), (NOW - 1.0, False),
                                              (0.0, True)])
def test_the_board_is_unknown_once_no_read_came_in_for_a_records_life(read_at, unknown):
    assert board_unknown(view(read_at=read_at), NOW, RULES) is unknown


@pytest.mark.parametrize("sharded, view_round, round_number, stale", [
    (True, 3, 3, False), (True, 2, 3, True), (True, -1, 0, True),
    (False, 2, 3, False),  # one key: the view of the round before still shows the round's peers
])
def test_a_sharded_view_of_another_round_is_stale(sharded, view_round, round_number, stale):
    assert view_stale(view(view_round=view_round), sharded, round_number) is stale


@pytest.mark.parametrize("read_at, now, awaiting", [
    (989.0, 991.0, True),  # the read came before the failed meeting: the same view would fail again
    (990.0, 991.0, True),
    (990.5, 991.0, False),  # a read begun since came in
    (989.0, 994.5, False),  # reads failed for a record's life: try again anyway
])
def test_a_disagreed_meeting_waits_for_a_read_begun_since(read_at, now, awaiting):
    assert awaiting_read(view(read_at=read_at), now, reread_after=990.0, rules=RULES) is awaiting


@pytest.mark.parametrize("read_at, judged_at", [(998.0, 998.0), (990.0, 996.0), (1005.0, NOW)])
def test_records_are_judged_when_the_read_began_for_a_records_life_at_most(read_at, judged_at):
    assert board_time(view(read_at=read_at), NOW, RULES) == judged_at


@pytest.mark.parametrize("peers, sharded, target, split", [
    ((peer("a"), peer("b")), True, 0, True),  # a sharded board's peers are cut into groups
    ((peer("a"), peer("b")), False, 0, False),  # target 0: one group
    ((peer("a"), peer("b")), False, 2, True),  # three peers, groups of two
    ((peer("a"), peer("b")), False, 3, False),
    ((peer("a"), peer("b", age=9.0)), False, 2, False),  # a stale record is a peer gone
    ((peer("a"), peer("b", phase="left")), False, 2, False),
])
def test_a_round_splits_when_its_live_peers_are_more_than_a_group(peers, sharded, target, split):
    assert round_split(view(*peers), NOW, peer("me"), RULES, sharded, target) is split


@pytest.mark.parametrize("other, split, last_group, behind", [
    (peer("a", round_=2), False, (), True),
    (peer("a", round_=2), True, (), False),  # split: one round behind finishes it with its own group
    (peer("a", round_=1), True, (), True),
    (peer("a", round_=2, phase="paused"), False, (), False),  # its owner uses the machine: not waited for
    (peer("a", round_=2), False, ("a",), False),  # last round's groupmate: coming, its record is behind
    (peer("a", round_=2, age=9.0), False, (), False),
    (peer("a", round_=3), False, (), False),
])
def test_peers_behind(other, split, last_group, behind):
    assert peers_behind(view(other), NOW, peer("me"), RULES, split, last_group) is behind


@pytest.mark.parametrize("kept, round_number, peers, roster", [
    ((4, ("a", "me")), 5, (peer("a"),), ["a", "me"]),
    ((4, ("a", "me")), 5, (peer("a", age=60.0),), ["a", "me"]),  # not judged by age: its reads pause
    ((4, ("a", "me")), 5, (peer("a", phase="left"),), None),  # its other member said it left
    ((4, ("a", "me")), 5, (), None),  # nobody else of it on the board
    ((4, ("a", "me")), 8, (peer("a"),), None),  # round 8 deals anew
    ((3, ("a", "me")), 5, (peer("a"),), None),  # it did not meet at round 4
    (None, 5, (peer("a"),), None),
])
def test_a_kept_group_is_its_roster_while_another_member_is_on_the_board(kept, round_number, peers, roster):
    assert kept_roster(view(*peers), kept, round_number, group_rounds=4, me="me") == roster


@pytest.mark.parametrize("sharded, reached_h_at, read_at, kept, due", [
    (True, 999.0, 998.0, False, True),  # the view came before this peer's H steps: read the shard again
    (True, 999.0, 999.5, False, False),
    (True, None, 998.0, False, False),
    (True, 999.0, 998.0, True, False),  # a kept group meets from its roster
    (False, 999.0, 998.0, False, False),
])
def test_a_fresh_view_is_due_on_a_sharded_board_once_this_peer_took_its_steps(sharded, reached_h_at, read_at, kept,
                                                                               due):
    assert fresh_view_due(view(read_at=read_at), sharded, reached_h_at, kept) is due


def plan(me, *others, kept=None, last_group=(), sharded=False, target=0):
    return board_group(view(*others), NOW, me, RULES, kept=kept, last_group=last_group, sharded=sharded,
                       target_group_size=target, run_id="run")


def test_every_member_of_a_board_group_plans_the_same_group_and_host():
    names = ["a", "b", "c", "d"]
    plans = {name: plan(peer(name), *(peer(n) for n in names if n != name)) for name in names}
    assert all(p == (names, plans["a"][1]) for p in plans.values())
    halves = {name: plan(peer(name), *(peer(n) for n in names if n != name), target=2) for name in names}
    assert all(len(halves[name][0]) == 2 and name in halves[name][0] for name in names)
    assert all(halves[m] == halves[name] for name in names for m in halves[name][0])


@pytest.mark.parametrize("me, others, kw, expected", [
    (peer("me"), (), {}, None),  # nobody else there
    (peer("me"), (peer("a", round_=4), peer("b", age=9.0)), {}, None),  # another round; a stale record
    (peer("me"), (peer("a", phase="paused"),), {}, None),  # a paused peer does not come to the meeting
    (peer("me"), (peer("a", round_=2),), {"last_group": ("a",)}, (["a", "me"], None)),  # last round's groupmate
    (peer("me"), (peer("a", round_=2),), {"last_group": ("a",), "sharded": True}, None),  # in another shard now
    (peer("me"), (peer("a", reducer=False),), {}, (["a", "me"], "me")),  # the host is one that can be dialled
    (peer("me", reducer=False), (peer("a"),), {}, (["a", "me"], "a")),
    (peer("me", reducer=False), (peer("a", reducer=False),), {}, None),  # nobody can be dialled: no meeting
    # a sharded round's groups are cut in the order its peers came; the last, alone, walks into the group before,
    # whose first arrival hosts it
    (peer("me", since=5.0), (peer("a", since=3.0), peer("b", since=1.0)), {"sharded": True, "target": 2},
     (["b", "a", "me"], "b")),
    (peer("me", since=2.0), (peer("a", since=3.0), peer("b", since=1.0)), {"sharded": True, "target": 2},
     (["b", "me"], "b")),
    # the kept group's roster is the plan, whoever the board shows at this round, less the members that left
    (peer("me"), (peer("a", round_=9), peer("c", phase="left"), peer("d")), {"kept": ["a", "c", "me"]},
     (["a", "me"], None)),
    (peer("me"), (peer("a", phase="left"),), {"kept": ["a", "me"]}, None),
    (peer("me", reducer=False), (peer("a", reducer=False),), {"kept": ["a", "me"]}, None),
])
def test_board_group(me, others, kw, expected):
    planned = plan(me, *others, **kw)
    if expected is None:
        assert planned is None
        return
    members, host = planned
    assert members == expected[0]
    assert host in members and (expected[1] is None or host == expected[1])


@pytest.mark.parametrize("same_reads, live, sharded, steady", [
    (2, ("me", "a"), False, True),
    (1, ("me", "a"), False, False),  # two reads the same are not yet three
    (2, ("me", "a"), True, False),  # a sharded board is read afresh at every round
    (2, ("me", "a", "b"), False, False),  # a newcomer the group has not taken in
])
def test_a_view_is_steady_when_three_reads_show_exactly_the_last_rounds_group(same_reads, live, sharded, steady):
    steady_view = BoardView((), NOW, 3, same_reads, frozenset(live))
    assert view_steady(steady_view, sharded, "me", last_group=["a"]) is steady

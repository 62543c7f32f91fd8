"""Group formation from the progress board as pure logic: the plan every peer computes, the meeting message, and
whether a planned group met."""

import itertools
import threading
import time

import pytest

from cotrain.averaging.groups import (MAX_MEETING_BYTES, NO_GO, Meeting, group_key, group_of, hold_meeting,
                                      meeting_outcome, plan_groups)

PEERS = [f"Qm{i:02d}" for i in range(10)]


def test_every_peer_computes_the_same_plan_whatever_order_it_saw_the_board_in():
    plans = {tuple(map(tuple, plan_groups(7, order, 4, "run"))) for order in itertools.islice(
        itertools.permutations(PEERS), 0, 50)}
    assert len(plans) == 1


@pytest.mark.parametrize("n, target", [(1, 0), (2, 0), (5, 0), (5, 2), (3, 2), (8, 4), (9, 4), (10, 3), (3, 8)])
def test_a_plan_puts_every_peer_in_one_group_of_at_most_the_target_size(n, target):
    groups = plan_groups(3, PEERS[:n], target, "run")
    members = [p for g in groups for p in g]
    assert sorted(members) == sorted(PEERS[:n])  # each exactly once
    if n >= 2:  # nobody is planned alone: a group of one cannot average (target 2, odd n: one group of three)
        assert min(map(len, groups)) >= 2, groups
    assert all(len(g) <= (target or n) + (target == 2 and n % 2) for g in groups)
    assert max(map(len, groups)) - min(map(len, groups)) <= 1  # near-equal
    assert all(group_of(p, groups) in groups for p in PEERS[:n])


def test_groupmates_change_from_round_to_round_and_with_the_run():
    by_round = {tuple(map(tuple, plan_groups(r, PEERS, 2, "run"))) for r in range(10)}
    assert len(by_round) > 1
    assert plan_groups(1, PEERS, 2, "run") != plan_groups(1, PEERS, 2, "other-run")


def test_group_key_names_the_round_and_the_members():
    assert group_key(1, ["a", "b"]) == group_key(1, ["b", "a"])
    assert len({group_key(1, ["a", "b"]), group_key(2, ["a", "b"]), group_key(1, ["a", "c"])}) == 3


def meeting(round_number=4, group="g", cred=b"ok", **kw):
    return Meeting(round_number, group, kw.get("samples", 32), kw.get("hash", "h"), kw.get("reducer", True), cred,
                   kw.get("attempt", 0))


def test_a_meeting_survives_the_wire_and_bad_bytes_name_the_field():
    m = meeting(samples=96, reducer=False, cred=bytes(range(40)), attempt=3)
    assert Meeting.decode(m.encode()) == m
    for data, field in [(b"\xff", "JSON"), (b"[1]", "object"), (b'{"round": "4"}', "round"),
                        (m.encode().replace(b'"samples": 96', b'"samples": true'), "samples"),
                        (m.encode().replace(b'"cred": "', b'"cred": "zz'), "cred"),
                        (m.encode().replace(b'"attempt": 3', b'"attempt": -1'), "attempt"),
                        (b"x" * (MAX_MEETING_BYTES + 1), "bytes")]:
        with pytest.raises(ValueError, match=field):
            Meeting.decode(data)


def admit_ok(peer, cred):
    return cred == b"ok"


def test_a_group_meets_only_when_every_planned_peer_agrees():
    members = ["me", "a", "b"]
    key = group_key(4, members)
    mine = meeting(group=key)
    good = {"a": meeting(group=key).encode(), "b": meeting(group=key, samples=7).encode()}
    outcome = meeting_outcome("me", mine, members, good, admit_ok)
    assert outcome.ok and set(outcome.meetings) == {"me", "a", "b"} and outcome.meetings["b"].samples == 7

    cases = {
        "did not come": dict(good, b=None),
        "another group": dict(good, b=meeting(group=group_key(4, ["me", "b"])).encode()),
        "round 5": dict(good, b=meeting(round_number=5, group=key).encode()),
        "credential": dict(good, b=meeting(group=key, cred=b"forged").encode()),
        "no meeting": dict(good, b=b"garbage"),
    }
    for why, received in cases.items():
        outcome = meeting_outcome("me", mine, members, received, admit_ok)
        assert not outcome.ok and not outcome.meetings, why
        assert "b" in outcome.reason or why in outcome.reason
        # only a groupmate with another plan is a disagreement (wait for a fresh board read, not for matchmaking)
        assert outcome.disagreed == (why in ("another group", "round 5")), why


class Board:
    """An in-memory network for hold_meeting: every peer's published pieces, fetched by key."""

    def __init__(self):
        self.pieces: dict[tuple[str, str], bytes] = {}
        self.asked: list[tuple[str, str]] = []  # (peer, key) of every fetch
        self.lock = threading.Condition()

    def transport(self, owner: str) -> "FakeTransport":
        return FakeTransport(self, owner)


class FakeTransport:
    def __init__(self, board: Board, owner: str):
        self.board, self.owner = board, owner

    def publish(self, tag, key, data):
        with self.board.lock:
            self.board.pieces[(self.owner, key)] = data
            self.board.lock.notify_all()

    def fetch_many(self, requests, wait_s):
        deadline = time.monotonic() + wait_s
        with self.board.lock:
            self.board.asked.extend(requests)
            while True:
                got = [self.board.pieces.get((peer, key)) for peer, key in requests]
                left = deadline - time.monotonic()
                if all(g is not None for g in got) or left <= 0:
                    return got
                self.board.lock.wait(left)


def meet_all(plans: dict[str, list[str]], wait_s: float = 2.0, absent=(), subset: bool = False, gone=(),
             board=None) -> dict:
    """Every peer of ``plans`` (peer -> the group it planned) holds its meeting on one board, in its own thread;
    the peers in ``gone`` left the swarm (as the progress board would tell the others)."""
    board, outcomes = board or Board(), {}

    def one(me, members):
        mine = meeting(group=group_key(4, members))
        peers = {m: m for m in members if m != me}
        outcomes[me] = hold_meeting(board.transport(me), me, mine, peers, wait_s, wait_s, admit_ok, subset=subset,
                                    gone=lambda peer: peer in gone)

    threads = [threading.Thread(target=one, args=item) for item in plans.items() if item[0] not in absent]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return outcomes


def test_peers_that_planned_the_same_group_meet_and_go_together():
    outcomes = meet_all({p: ["a", "b", "c"] for p in "abc"})
    assert all(o.ok for o in outcomes.values()), outcomes
    assert all(set(o.meetings) == {"a", "b", "c"} for o in outcomes.values())


def test_a_peer_that_saw_another_board_does_not_meet_and_the_others_go_without_it():
    # c's board showed it a peer the others had not seen yet: a and b planned {a, b}, c planned {a, b, c}
    outcomes = meet_all({"a": ["a", "b"], "b": ["a", "b"], "c": ["a", "b", "c"]})
    assert outcomes["a"].ok and outcomes["b"].ok and set(outcomes["a"].meetings) == {"a", "b"}
    assert not outcomes["c"].ok and "planned another group" in outcomes["c"].reason


def test_nobody_goes_when_a_planned_peer_does_not_come():
    outcomes = meet_all({p: ["a", "b", "c"] for p in "abc"}, wait_s=0.5, absent={"c"})
    assert set(outcomes) == {"a", "b"} and not any(o.ok for o in outcomes.values())
    assert all("did not come" in o.reason for o in outcomes.values())


def test_a_groupmate_whose_meeting_failed_stops_the_others():
    # a's and b's meetings agree, but c reached them planning another group and says so: nobody of {a,b,c} goes
    outcomes = meet_all({"a": ["a", "b", "c"], "b": ["a", "b", "c"], "c": ["a", "b", "c", "d"]}, wait_s=0.5)
    assert not any(o.ok for o in outcomes.values()), outcomes


def test_a_peer_that_read_an_earlier_meeting_of_a_groupmate_does_not_go_with_it():
    # a's first meeting of the round did not fill; b read it in the moment before a withdrew it. With one answer
    # a round, a meeting again would go (b said "yes") while b stayed (a's first answer was "no"). Each meeting is
    # answered apart, with which meetings the peer met, and a failed one is withdrawn: neither goes, both meet again
    board = Board()
    key = group_key(4, ["a", "b"])
    a_transport = board.transport("a")
    a_transport.publish("meet-r4", "meet-r4/meeting", meeting(group=key).encode())  # a's first meeting, failing
    a_transport.publish("meet-r4", "meet-r4/go/0", NO_GO)
    b = hold_meeting(board.transport("b"), "b", meeting(group=key), {"a": "a"}, 1.0, 1.0, admit_ok)
    assert not b.ok and "its meeting failed" in b.reason
    a = hold_meeting(a_transport, "a", meeting(group=key, attempt=1), {"b": "b"}, 0.3, 0.3, admit_ok)
    assert not a.ok and "did not come" in a.reason  # b's failed meeting was withdrawn: a does not meet it
    # their next meetings agree: both go, whoever publishes first
    outcomes = {}
    threads = [threading.Thread(target=lambda me, other, n: outcomes.__setitem__(me, hold_meeting(
        board.transport(me), me, meeting(group=key, attempt=n), {other: other}, 2.0, 2.0, admit_ok)),
        args=args) for args in (("a", "b", 2), ("b", "a", 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes["a"].ok and outcomes["b"].ok, outcomes


def test_with_subset_the_planned_peers_that_came_and_agree_meet_without_the_others():
    members = ["me", "a", "b", "c"]
    key = group_key(4, members)
    mine = meeting(group=key)
    received = {"a": meeting(group=key).encode(), "b": None,
                "c": meeting(group=group_key(4, ["me", "c"])).encode()}
    outcome = meeting_outcome("me", mine, members, received, admit_ok, subset=True)
    assert outcome.ok and set(outcome.meetings) == {"me", "a"}, outcome
    assert "2 of the 4" in outcome.reason
    assert not meeting_outcome("me", mine, members, received, admit_ok).ok  # all or nothing without it
    # alone is no group, and a forged credential is no member
    lonely = dict(received, a=meeting(group=key, cred=b"forged").encode())
    outcome = meeting_outcome("me", mine, members, lonely, admit_ok, subset=True)
    assert not outcome.ok and not outcome.meetings


def test_with_subset_peers_go_without_a_planned_peer_that_does_not_come():
    outcomes = meet_all({p: ["a", "b", "c"] for p in "abc"}, wait_s=0.5, absent={"c"}, subset=True)
    assert set(outcomes) == {"a", "b"} and all(o.ok for o in outcomes.values()), outcomes
    assert all(set(o.meetings) == {"a", "b"} for o in outcomes.values())


def test_a_planned_peer_that_left_is_not_waited_for():
    # c was planned, then left (its record on the board says "left"): a and b never ask it for its meeting, and
    # with subset go without it at once instead of after the meeting's wait (30 s here: the test would time out)
    board = Board()
    outcomes = meet_all({p: ["a", "b", "c"] for p in "abc"}, wait_s=30.0, absent={"c"}, gone={"c"}, subset=True,
                        board=board)
    assert set(outcomes) == {"a", "b"} and all(o.ok for o in outcomes.values()), outcomes
    assert all(set(o.meetings) == {"a", "b"} for o in outcomes.values())
    assert not [key for peer, key in board.asked if peer == "c"], board.asked


def test_with_subset_the_agreeing_peers_go_and_the_one_with_another_plan_does_not():
    # the case where, all or nothing, nobody of {a, b, c} went
    outcomes = meet_all({"a": ["a", "b", "c"], "b": ["a", "b", "c"], "c": ["a", "b", "c", "d"]}, wait_s=0.5,
                        subset=True)
    assert outcomes["a"].ok and outcomes["b"].ok, outcomes
    assert set(outcomes["a"].meetings) == set(outcomes["b"].meetings) == {"a", "b"}
    assert not outcomes["c"].ok

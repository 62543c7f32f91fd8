"""Group formation from the progress board as pure logic: the plan every peer computes, the meeting message, and
whether a planned group met."""

import itertools
import threading
import time

import pytest

from cotrain.averaging.groups import group_of, host_of, kept_group, plan_arrival_groups, plan_groups
from cotrain.averaging.meet import hold_meeting
from cotrain.averaging.meeting import (MAX_MEETING_BYTES, MAX_ROSTER_BYTES, Meeting, Roster, decode_answer, host_key,
                                       join_piece, max_group_size, meeting_outcome, split_piece)

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


def test_a_sharded_round_is_cut_into_groups_in_the_order_its_peers_came():
    came = [(10.0, "e"), (3.0, "b"), (1.0, "d"), (3.0, "a"), (7.0, "c")]  # a and b came together: by id
    assert plan_arrival_groups(came, 2) == [["d", "a"], ["b", "c"], ["e"]]  # the last one waits for a next peer
    assert plan_arrival_groups(came, 0) == [["d", "a", "b", "c", "e"]]
    assert plan_arrival_groups([], 4) == []
    # a view that holds a peer twice (two records of it) places it once, where it came first
    assert plan_arrival_groups([(5.0, "a"), (1.0, "b"), (2.0, "a")], 4) == [["b", "a"]]


def test_a_newcomer_changes_no_arrival_group_but_the_last():
    """Peers of a shard read the board at different moments: a view that saw more of the round's newcomers must
    agree with one that saw fewer on every group that view had filled (plan_groups' shuffle changes them all)."""
    came = [(float(t), peer) for t, peer in zip([4, 9, 1, 7, 3, 8, 2, 6, 5, 0], PEERS)]
    order = sorted(came)
    for seen in range(1, len(order)):
        fewer, more = plan_arrival_groups(order[:seen], 3), plan_arrival_groups(order[:seen + 1], 3)
        full = [g for g in fewer if len(g) == 3]
        assert more[:len(full)] == full, (seen, fewer, more)
    shuffled = [plan_groups(1, [p for _, p in order[:seen]], 3, "run") for seen in (6, 7)]
    assert shuffled[0][0] not in shuffled[1]  # what the arrival order is for: one newcomer reshuffles the plan


def test_a_group_is_kept_until_a_round_that_is_a_multiple_of_group_rounds():
    kept = (4, ("b", "a"))  # met at round 4
    assert kept_group(kept, 5, 4) == ["b", "a"] and kept_group(kept, 5, 8) == ["b", "a"]
    assert kept_group(kept, 5, 1) is None  # planned afresh every round
    assert kept_group(kept, 6, 4) is None  # it did not meet at round 5: this peer moved on without it
    assert kept_group((7, ("a", "b")), 8, 4) is None  # round 8 deals anew
    assert kept_group(None, 5, 4) is None


def test_a_kept_groups_member_reads_no_board_until_its_meeting_failed():
    from cotrain.averaging.scheduler import reads_paused

    def paused(kept, round_number, met_round, group_rounds=4):
        return reads_paused(kept_group(kept, round_number, group_rounds) is not None, met_round == round_number)

    assert paused((4, ("a", "b")), 5, met_round=4)  # round 5 meets round 4's group from its roster
    assert not paused((4, ("a", "b")), 5, met_round=5)  # its meeting of round 5 failed (or runs): read again
    assert not paused((7, ("a", "b")), 8, met_round=7)  # a deal's first round plans from its new shard
    assert not paused((4, ("a", "b")), 5, met_round=4, group_rounds=1)  # groups planned every round
    assert not paused(None, 5, met_round=4)  # no group of the round before


def test_a_kept_group_none_of_whose_other_members_is_on_the_board_is_no_group():
    # a and c went ahead, took their last round and left; b, late, would have waited for them at every round
    assert kept_group((4, ("a", "b", "c")), 5, 4, present=lambda peer: peer == "c", me="b") == ["a", "b", "c"]
    assert kept_group((4, ("a", "b", "c")), 5, 4, present=lambda peer: peer == "b", me="b") is None
    assert kept_group((4, ("a", "b", "c")), 5, 4, present=lambda peer: False, me="b") is None


def test_host_key_names_the_round_and_the_host():
    assert host_key(1, "a") == host_key(1, "a")
    assert len({host_key(1, "a"), host_key(2, "a"), host_key(1, "b")}) == 3


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
    key = host_key(4, "me")
    mine = meeting(group=key)
    good = {"a": meeting(group=key).encode(), "b": meeting(group=key, samples=7).encode()}
    outcome = meeting_outcome("me", mine, members, good, admit_ok)
    assert outcome.ok and set(outcome.meetings) == {"me", "a", "b"} and outcome.meetings["b"].samples == 7

    cases = {
        "did not come": dict(good, b=None),
        "another group": dict(good, b=meeting(group=host_key(4, "b")).encode()),
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
    """An in-memory network for hold_meeting: every peer's published pieces, and the joins that wait on them (each
    with its deposit), as the exchange keeps them."""

    def __init__(self):
        self.pieces: dict[tuple[str, str], tuple[bytes, int, bool]] = {}  # (owner, key) -> (piece, version, settled)
        self.versions: dict[tuple[str, str], int] = {}
        self.deposits: dict[tuple[str, str], dict[str, bytes]] = {}  # (whose, key) -> joiner -> its deposit
        self.changes = 0  # deposits filed or dropped
        self.asked: list[tuple[str, str]] = []  # (peer, key) of every join
        self.askers: dict[tuple[str, str], set[str]] = {}  # (whose piece, key) -> who joined it
        self.dialled: set[tuple[str, str]] = set()  # (who joined, whom)
        self.lock = threading.Condition()

    def transport(self, owner: str) -> "FakeTransport":
        return FakeTransport(self, owner)


class FakeTransport:
    def __init__(self, board: Board, owner: str):
        self.board, self.owner = board, owner

    def publish(self, tag, key, data, readers=0, settled=True):
        with self.board.lock:
            version = self.board.versions.get((self.owner, key), 0) + 1
            self.board.versions[(self.owner, key)] = version
            self.board.pieces[(self.owner, key)] = (data, version, settled)
            self.board.lock.notify_all()

    def fetch_many(self, requests, wait_s, max_bytes=None):
        with self.board.lock:
            self.board.asked.extend(requests)
            self.board.dialled.update((self.owner, peer) for peer, _ in requests)
            self.board.lock.wait_for(lambda: all((p, k) in self.board.pieces for p, k in requests), wait_s)
            got = [self.board.pieces.get((peer, key), (None,))[0] for peer, key in requests]
            return [None if g is not None and max_bytes is not None and len(g) > max_bytes else g for g in got]

    def withdraw(self, key):
        with self.board.lock:
            self.board.pieces.pop((self.owner, key), None)

    def join(self, peer, key, deposit, wait_s, max_bytes=None):
        b, deadline = self.board, time.monotonic() + wait_s
        with b.lock:
            b.asked.append((peer, key))
            b.askers.setdefault((peer, key), set()).add(self.owner)
            b.dialled.add((self.owner, peer))
            box = b.deposits.setdefault((peer, key), {})
            box[self.owner] = deposit
            b.changes += 1
            after = b.versions.get((peer, key), 0)
            b.lock.notify_all()
            try:
                while True:
                    data, version, settled = b.pieces.get((peer, key), (None, 0, True))
                    if data is not None and (settled or version > after):
                        return None if max_bytes is not None and len(data) > max_bytes else data
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    b.lock.wait(left)
            finally:
                if box.get(self.owner) is deposit:
                    del box[self.owner]
                    b.changes += 1
                    b.lock.notify_all()

    def deposits(self, key):
        with self.board.lock:
            return dict(self.board.deposits.get((self.owner, key), {}))

    def wait_deposits(self, seen, timeout):
        with self.board.lock:
            self.board.lock.wait_for(lambda: self.board.changes > seen, timeout)
            return self.board.changes


def meet_all(plans: dict[str, list[str]], wait_s: float = 2.0, absent=(), subset: bool = False, gone=(),
             board=None, dial_out_only=(), walk_ins: bool = False, target: int = 0, waits=None,
             reduced=None, payloads=None, max_rest: int = 0) -> dict:
    """Every peer of ``plans`` (peer -> the group it planned) holds its meeting on one board, in its own thread, at
    the host of its plan (its first member not in ``dial_out_only``); the peers in ``gone`` left the swarm (as the
    progress board would tell the others). ``walk_ins``: hosts take the peers that joined them unplanned, and a
    member follows its host to the host it names (every peer of ``plans`` is in each view). ``waits``: peer -> the
    (host, peer) joins it waits for before it comes (so that they walk in before it does).
    ``reduced``: a dict: the meetings carry an all-reduce (each peer's payload is its name), and each host's reduce
    records there what it was given and returns the payloads joined; ``payloads``: peer -> its payload instead,
    ``max_rest``: the most a piece may carry."""
    board, outcomes = board or Board(), {}

    def one(me, members):
        with board.lock:
            assert board.lock.wait_for(lambda: all(
                p in board.askers.get((h, "meet-r4/meeting"), ()) for h, p in (waits or {}).get(me, ())), 10)
        host = host_of(members, lambda peer: peer not in dial_out_only)
        mine = meeting(group=host_key(4, host))
        peers = {m: m for m in members if m != me}
        follow = lambda group: next(((p, p) for p in plans if walk_ins and host_key(4, p) == group), None)
        def reduce(payloads):
            reduced[me] = dict(payloads)
            return b"+".join(payload for _, payload in sorted(payloads.items()))

        outcomes[me] = hold_meeting(board.transport(me), me, mine, host, peers, wait_s, wait_s, admit_ok,
                                    subset=subset, gone=lambda peer: peer in gone, walk_ins=walk_ins, target=target,
                                    follow=follow, reduce=reduce if reduced is not None else None,
                                    payload=(payloads or {}).get(me, me.encode()) if reduced is not None else b"",
                                    max_rest=max_rest)

    # daemons: a meeting that waits out a long wait_s it should not have waited leaves no outcome (the test fails on
    # it), and no thread holding the test run open
    threads = [threading.Thread(target=one, args=item, daemon=True) for item in plans.items() if item[0] not in absent]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return outcomes


def test_peers_that_planned_the_same_group_meet_and_go_together():
    outcomes = meet_all({p: ["a", "b", "c"] for p in "abc"})
    assert all(o.ok for o in outcomes.values()), outcomes
    assert all(set(o.meetings) == {"a", "b", "c"} for o in outcomes.values())


def test_a_hosted_all_reduce_rides_with_the_meeting_there_and_back():
    """Each member's contribution goes with its meeting; the host reduces those of the peers that go (its own
    included) and its result comes back with the roster: the same bytes for every member."""
    reduced: dict = {}
    outcomes = meet_all({p: ["a", "b", "c"] for p in "abc"}, reduced=reduced)
    assert all(o.ok for o in outcomes.values()), outcomes
    assert reduced == {"a": {"a": b"a", "b": b"b", "c": b"c"}}  # a hosts: the first of the plan
    assert {o.result for o in outcomes.values()} == {b"a+b+c"}


def test_a_host_reduces_only_the_contributions_of_the_peers_that_go():
    # c saw itself in a and b's group; they had not seen c yet, and went without it (and without its contribution)
    reduced: dict = {}
    outcomes = meet_all({"a": ["a", "b"], "b": ["a", "b"], "c": ["a", "b", "c"]}, reduced=reduced)
    assert outcomes["a"].ok and outcomes["b"].ok and not outcomes["c"].ok
    assert reduced == {"a": {"a": b"a", "b": b"b"}}
    assert outcomes["a"].result == outcomes["b"].result == b"a+b" and outcomes["c"].result == b""


def test_the_host_of_a_shuffled_plan_takes_turns_and_a_newcomer_moves_it_only_when_drawn():
    members = ["a", "b", "c", "d"]
    dialable = lambda peer: peer != "b"  # noqa: E731
    hosts = [host_of(members, dialable, f"run/{r}") for r in range(60)]
    assert set(hosts) == {"a", "c", "d"}  # every member others can dial hosts in turn; b, behind NAT, never
    assert host_of(members, dialable, "run/7") == host_of(list(reversed(members)), dialable, "run/7")
    for r in range(60):  # e joins: the host stays unless e is drawn
        assert host_of(members + ["e"], dialable, f"run/{r}") in (hosts[r], "e")
    assert host_of(members, dialable) == "a"  # no turn: the first of the order (an arrival order keeps its first)


def test_a_member_whose_contribution_is_larger_than_one_can_be_is_not_taken_in():
    reduced: dict = {}
    outcomes = meet_all({p: ["a", "b", "c"] for p in "abc"}, reduced=reduced, subset=True,
                        payloads={"c": b"x" * 10_000}, max_rest=100)
    assert outcomes["a"].ok and outcomes["b"].ok and not outcomes["c"].ok
    assert reduced == {"a": {"a": b"a", "b": b"b"}}
    reduced.clear()  # a bound that holds it: c goes
    outcomes = meet_all({p: ["a", "b", "c"] for p in "abc"}, reduced=reduced, payloads={"c": b"x" * 10_000},
                        max_rest=10_000)
    assert all(o.ok for o in outcomes.values()) and set(reduced["a"]) == {"a", "b", "c"}


def test_a_member_whose_host_is_a_member_elsewhere_learns_that_it_planned_another_group():
    # c's view made b the host of {b, c}; b went to a's meeting as a member, its contribution with its meeting
    reduced: dict = {}
    payloads = {p: p.encode() * 5_000 for p in "abc"}
    outcomes = meet_all({"a": ["a", "b"], "b": ["a", "b"], "c": ["b", "c"]}, reduced=reduced, payloads=payloads,
                        max_rest=10_000, wait_s=1.0)
    assert outcomes["a"].ok and outcomes["b"].ok
    assert not outcomes["c"].ok and outcomes["c"].disagreed, outcomes["c"]


def test_a_piece_carries_a_rest_that_its_head_does_not_see():
    head = meeting(group=host_key(4, "a")).encode()
    assert join_piece(head) == head and split_piece(head) == (head, b"")  # nothing riding: the meeting as it is
    assert split_piece(join_piece(head, b"\x00" * 100)) == (head, b"\x00" * 100)
    outcome = meeting_outcome("a", meeting(group=host_key(4, "a")), ["a", "b"],
                              {"b": join_piece(head, b"contribution")}, admit_ok)
    assert outcome.ok and outcome.meetings["b"] == meeting(group=host_key(4, "a"))
    for bad in (b"\x01\x05", b"\x01" + (10**6).to_bytes(4, "little") + head):  # truncated; a head past the end
        with pytest.raises(ValueError, match="piece"):
            split_piece(bad)
        assert "sent no meeting (piece" in meeting_outcome("a", meeting(group=host_key(4, "a")), ["a", "b"],
                                                           {"b": bad}, admit_ok).reason


def test_a_member_makes_one_request_to_its_host_and_the_host_none():
    """A round's meeting is one join a member: its meeting goes with it and the roster comes back on it. Members never
    dial each other, nor does the host dial anybody: two peers behind NAT, who cannot be dialled, meet through a host
    they can dial."""
    board = Board()
    outcomes = meet_all({p: ["a", "b", "c"] for p in "abc"}, board=board, dial_out_only={"a", "b"})
    assert all(o.ok and set(o.meetings) == {"a", "b", "c"} for o in outcomes.values()), outcomes
    assert board.dialled == {("a", "c"), ("b", "c")}, board.dialled
    assert sorted(board.asked) == [("c", "meet-r4/meeting")] * 2, board.asked
    assert host_of(["a", "b"], lambda peer: False) is None  # nobody to dial: no meeting


def test_a_member_that_planned_more_peers_goes_with_the_hosts_plan():
    # c's board showed it a peer the others had not seen yet (d, not at the meeting): c planned {a, b, c, d}, the
    # others {a, b, c}. All name the host a, whose plan decides: a, b and c go
    outcomes = meet_all({"a": ["a", "b", "c"], "b": ["a", "b", "c"], "c": ["a", "b", "c", "d"]})
    assert all(o.ok and set(o.meetings) == {"a", "b", "c"} for o in outcomes.values()), outcomes


def test_a_peer_the_host_did_not_plan_does_not_go_and_rereads_the_board():
    # c saw itself in a and b's group; they had not seen c yet, and went without it
    outcomes = meet_all({"a": ["a", "b"], "b": ["a", "b"], "c": ["a", "b", "c"]})
    assert outcomes["a"].ok and outcomes["b"].ok and set(outcomes["a"].meetings) == {"a", "b"}
    assert not outcomes["c"].ok and outcomes["c"].disagreed, outcomes["c"]


def test_a_host_takes_in_a_peer_whose_view_showed_it_in_the_group():
    # c's view showed it in a and b's group; theirs had not shown c yet. c asks a (its host) for its meeting, and a
    # takes it in: all three go, with the same group
    outcomes = meet_all({"a": ["a", "b"], "b": ["a", "b"], "c": ["a", "b", "c"]}, walk_ins=True, target=4,
                        waits={"b": [("a", "c")]})
    assert all(o.ok and set(o.meetings) == {"a", "b", "c"} for o in outcomes.values()), outcomes
    # a plan's lone last peer walks into the group before it; its host takes walk-ins up to 2 target - 1
    plans = {**{p: ["a", "b", "c", "d"] for p in "abcd"}, **{p: ["a", "b", "c", "d", p] for p in "xyz"}}
    waits = {"b": [("a", p) for p in "xyz"]}
    outcomes = meet_all(plans, walk_ins=True, target=4, wait_s=5.0, waits=waits)
    went = {p for p, o in outcomes.items() if o.ok}
    assert max_group_size(4) == 7 and went == set("abcdxyz"), outcomes
    assert len({frozenset(o.meetings) for o in outcomes.values()}) == 1
    outcomes = meet_all(plans, walk_ins=True, target=3, wait_s=5.0, waits=waits)  # bound 5: two of x, y, z stay out
    assert {p for p, o in outcomes.items() if o.ok} == set("abcdx"), outcomes
    assert all(not o.ok and "went without us" in o.reason for p, o in outcomes.items() if p in "yz")


def test_a_full_group_of_walk_ins_goes_without_a_planned_peer_that_does_not_come():
    # all or nothing (the early meeting): a waits for b, who planned it but does not come; c, d and e walked in, and
    # with them the group holds its target of four: they go without b, long before the meeting's wait is over
    plans = {"a": ["a", "b"], **{p: ["a", p] for p in "cde"}}
    outcomes = meet_all(plans, walk_ins=True, target=4, wait_s=600.0)
    assert set(outcomes) == set("acde"), outcomes  # every meeting ended (meet_all waits 30 s for them)
    assert all(o.ok and set(o.meetings) == set("acde") for o in outcomes.values()), outcomes
    assert "3 more" in outcomes["a"].reason
    # without walk-ins to fill it, the same meeting does not fill
    outcomes = meet_all({"a": ["a", "b"], "c": ["a", "c"]}, walk_ins=True, target=4, wait_s=0.5)
    assert not any(o.ok for o in outcomes.values()), outcomes


def test_a_walk_in_that_gave_up_is_not_taken_in():
    # x joined a, then gave up (its join timed out: it went back to training): its meeting left with its request, so a
    # goes with b, its plan, without x
    board = Board()
    assert board.transport("x").join("a", "meet-r4/meeting", meeting(group=host_key(4, "a")).encode(), 0.05) is None
    outcomes = meet_all({"a": ["a", "b"], "b": ["a", "b"]}, walk_ins=True, target=4, wait_s=600.0, board=board)
    assert set(outcomes) == {"a", "b"} and all(o.ok and set(o.meetings) == {"a", "b"} for o in outcomes.values())


def test_a_member_follows_its_host_to_the_host_that_one_names():
    # c saw b come first and planned {b, c}; b had seen a before it and planned {a, b} (a hosts). b's meeting names a:
    # c follows it there, and a takes c in
    outcomes = meet_all({"a": ["a", "b"], "b": ["a", "b"], "c": ["b", "c"]}, walk_ins=True, target=4,
                        waits={"a": [("a", "c")]})
    assert all(o.ok and set(o.meetings) == {"a", "b", "c"} for o in outcomes.values()), outcomes
    assert outcomes["c"].meetings["c"].group == host_key(4, "a")  # it went with a meeting naming its new host
    # a host its view does not know is no one to follow
    outcomes = meet_all({"a": ["a", "b"], "b": ["a", "b"], "c": ["b", "c"]}, wait_s=0.5)
    assert not outcomes["c"].ok and outcomes["c"].disagreed


def test_a_peer_that_planned_another_host_does_not_meet_and_the_others_go_without_it():
    # c planned a group hosted by "0", a peer a and b did not see: its meeting names another host
    outcomes = meet_all({"a": ["a", "b", "c"], "b": ["a", "b", "c"], "c": ["0", "a", "b", "c"]}, wait_s=0.5,
                        subset=True)
    assert outcomes["a"].ok and outcomes["b"].ok, outcomes
    assert set(outcomes["a"].meetings) == set(outcomes["b"].meetings) == {"a", "b"}
    assert not outcomes["c"].ok
    # all or nothing (the early meeting), the host's plan fails on c, and says so to b
    outcomes = meet_all({"a": ["a", "b", "c"], "b": ["a", "b", "c"], "c": ["0", "a", "b", "c"]}, wait_s=0.5)
    assert not any(o.ok for o in outcomes.values()), outcomes
    assert outcomes["a"].disagreed


def test_nobody_goes_when_a_planned_peer_does_not_come():
    board = Board()
    outcomes = meet_all({p: ["a", "b", "c"] for p in "abc"}, wait_s=0.5, absent={"c"}, board=board)
    assert set(outcomes) == {"a", "b"} and not any(o.ok for o in outcomes.values())
    assert all("did not come" in o.reason for o in outcomes.values())
    # b's join, and the host asking c what it does, twice a second; nobody asks b or the host anything else
    assert board.asked[0] == ("a", "meet-r4/meeting") and set(board.asked[1:]) == {("c", "meet-r4/meeting")}
    assert 1 <= len(board.asked[1:]) <= 2, board.asked
    outcomes = meet_all({p: ["a", "b", "c"] for p in "abc"}, wait_s=0.5, absent={"a"})  # the host did not come
    assert set(outcomes) == {"b", "c"} and not any(o.ok for o in outcomes.values())


def test_a_member_does_not_go_with_a_hosts_earlier_meeting_that_did_not_fill():
    # a (the host) held a meeting of the round that did not fill: its roster says so, and answers no join that comes
    # after it. b, coming now, waits for a's next meeting and goes with it
    board = Board()
    key = host_key(4, "a")
    a_transport = board.transport("a")
    a_transport.publish("meet-r4", "meet-r4/meeting", Roster(4, 0, {}, {}, "peer b did not come").encode(),
                        settled=False)
    outcomes = {}
    b = threading.Thread(target=lambda: outcomes.__setitem__("b", hold_meeting(
        board.transport("b"), "b", meeting(group=key), "a", {"a": "a"}, 2.0, 2.0, admit_ok)))
    b.start()
    outcomes["a"] = hold_meeting(a_transport, "a", meeting(group=key, attempt=1), "a", {"b": "b"}, 2.0, 2.0, admit_ok)
    b.join(30)
    assert outcomes["a"].ok and outcomes["b"].ok, outcomes
    # a meeting that went is settled: a member that comes after it learns at once that it went without it
    late = hold_meeting(board.transport("c"), "c", meeting(group=key), "a", {"a": "a"}, 600.0, 600.0, admit_ok)
    assert not late.ok and "went without us" in late.reason and late.disagreed, late
    # a roster that lists a member this meeting did not plan, or one with a forged credential: nobody goes with it
    for members in ({"a": meeting(group=key, attempt=2).encode(), "b": meeting(group=key).encode(),
                     "x": meeting(group=host_key(4, "x")).encode()},
                    {"a": meeting(group=key, attempt=2).encode(), "b": meeting(group=key).encode(),
                     "x": meeting(group=key, cred=b"forged").encode()}):
        a_transport.publish("meet-r4", "meet-r4/meeting", Roster(4, 2, members, {"b": 0}, "").encode())
        b = hold_meeting(board.transport("b"), "b", meeting(group=key), "a", {"a": "a"}, 1.0, 1.0, admit_ok)
        assert not b.ok and "x" in b.reason, b


def test_an_answer_is_a_roster_or_the_meeting_of_a_peer_that_meets_elsewhere():
    roster = Roster(4, 1, {"a": b"{}"}, {}, "")
    assert decode_answer(join_piece(roster.encode(), b"result")) == (roster, b"result")
    assert decode_answer(meeting(group="x").encode()) == (meeting(group="x"), b"")
    with pytest.raises(ValueError, match="roster"):
        decode_answer(b'{"round": 4}')


def test_a_roster_survives_the_wire_and_bad_bytes_name_the_field():
    r = Roster(4, 1, {"a": b"\x01\x02", "b": b""}, {"b": 0}, "all 2 planned peers met")
    assert Roster.decode(r.encode()) == r
    for data, field in [(b"\xff", "JSON"), (b"[1]", "object"), (b'{"round": "4"}', "round"),
                        (r.encode().replace(b'"members": {"a": "0102"', b'"members": {"a": "zz"'), "members"),
                        (r.encode().replace(b'"seen": {"b": 0}', b'"seen": {"b": "0"}'), "seen"),
                        (b"x" * (MAX_ROSTER_BYTES + 1), "bytes")]:
        with pytest.raises(ValueError, match=field):
            Roster.decode(data)


def test_with_subset_the_planned_peers_that_came_and_agree_meet_without_the_others():
    members = ["me", "a", "b", "c"]
    key = host_key(4, "me")
    mine = meeting(group=key)
    received = {"a": meeting(group=key).encode(), "b": None,
                "c": meeting(group=host_key(4, "c")).encode()}
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

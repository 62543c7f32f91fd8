"""Group formation from the progress board as pure logic: the plan every peer computes, the meeting message, and
whether a planned group met."""

import itertools

import pytest

from cotrain.averaging.groups import (MAX_MEETING_BYTES, Meeting, group_key, group_of, meeting_outcome,
                                      plan_groups)

PEERS = [f"Qm{i:02d}" for i in range(10)]


def test_every_peer_computes_the_same_plan_whatever_order_it_saw_the_board_in():
    plans = {tuple(map(tuple, plan_groups(7, order, 4, "run"))) for order in itertools.islice(
        itertools.permutations(PEERS), 0, 50)}
    assert len(plans) == 1


@pytest.mark.parametrize("n, target", [(1, 0), (2, 0), (5, 0), (5, 2), (8, 4), (9, 4), (10, 3), (3, 8)])
def test_a_plan_puts_every_peer_in_one_group_of_at_most_the_target_size(n, target):
    groups = plan_groups(3, PEERS[:n], target, "run")
    members = [p for g in groups for p in g]
    assert sorted(members) == sorted(PEERS[:n])  # each exactly once
    assert all(len(g) <= (target or n) for g in groups)
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
    return Meeting(round_number, group, kw.get("samples", 32), kw.get("hash", "h"), kw.get("reducer", True), cred)


def test_a_meeting_survives_the_wire_and_bad_bytes_name_the_field():
    m = meeting(samples=96, reducer=False, cred=bytes(range(40)))
    assert Meeting.decode(m.encode()) == m
    for data, field in [(b"\xff", "JSON"), (b"[1]", "object"), (b'{"round": "4"}', "round"),
                        (m.encode().replace(b'"samples": 96', b'"samples": true'), "samples"),
                        (m.encode().replace(b'"cred": "', b'"cred": "zz'), "cred"),
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

"""Reputation with an injected clock: decays, suspends after repeated failures (a burst, or a slow burn once there
is evidence), recovers weight slowly, counts a node's checks for its token too, and refuses a malformed dict naming
the field."""

import json
import math

import pytest

from cotrain.verification.reputation import (HALF_LIFE_S, MAX_RECENT_FAILS, Book, Policy, Reputation, ReputationError,
                                             decayed, from_dict, recorded, score, suspension, to_dict,
                                             weight_multiplier)

HOUR = 3600.0
T0 = 1_000_000.0


def checks(rep, outcomes, start=T0, every=HOUR, weight=1.0, policy=Policy()):
    """``rep`` after one check per ``every`` seconds from ``start``, True for a pass."""
    for i, passed in enumerate(outcomes):
        rep = recorded(rep, passed=passed, weight=weight, now=start + i * every,
                       reason="" if passed else f"check {i} failed", policy=policy)
    return rep


def test_a_node_never_checked_counts_fully():
    rep = Reputation(at=T0)
    assert score(rep, T0) == 1.0 and weight_multiplier(rep, T0) == 1.0
    s = suspension(rep, T0)
    assert not s.suspend and "no failed check" in s.reason


def test_one_failure_costs_a_third_and_says_why():
    rep = recorded(Reputation(at=T0), passed=False, weight=1.0, now=T0, reason="replay: cosine 0.31")
    assert score(rep, T0) == pytest.approx(2 / 3)
    assert weight_multiplier(rep, T0) == pytest.approx(2 / 3)
    s = suspension(rep, T0)
    assert not s.suspend and "replay: cosine 0.31" in s.reason


def test_evidence_halves_every_half_life():
    rep = checks(Reputation(at=T0), [False, False], every=0.0)
    assert score(rep, T0) == pytest.approx(0.5)
    later = decayed(rep, T0 + HALF_LIFE_S)
    assert later.fails == pytest.approx(1.0) and later.at == T0 + HALF_LIFE_S
    assert score(rep, T0 + HALF_LIFE_S) == pytest.approx(2 / 3)
    assert score(rep, T0 + 20 * HALF_LIFE_S) == pytest.approx(1.0, abs=1e-5)


def test_three_failures_within_the_window_suspend():
    rep = checks(Reputation(at=T0), [False, False])
    assert not suspension(rep, T0 + HOUR).suspend
    rep = checks(rep, [False], start=T0 + 2 * HOUR)
    s = suspension(rep, T0 + 2 * HOUR)
    assert s.suspend and "within 6 h" in s.reason and "check 0 failed" in s.reason
    assert weight_multiplier(rep, T0 + 2 * HOUR) == 0.0


def test_failures_spread_wider_than_the_window_do_not_burst():
    rep = checks(Reputation(at=T0), [False, False, False], every=7 * HOUR)
    assert not suspension(rep, T0 + 14 * HOUR).suspend


def test_light_failures_weigh_less():
    rep = checks(Reputation(at=T0), [False] * 5, weight=0.5)
    assert not suspension(rep, T0 + 4 * HOUR).suspend
    rep = checks(rep, [False], start=T0 + 5 * HOUR, weight=0.5)
    assert suspension(rep, T0 + 5 * HOUR).suspend


def test_a_slow_burn_is_suspended_once_there_is_evidence():
    policy = Policy(suspend_fails=100.0)  # the burst rule out of the way
    rep = checks(Reputation(at=T0), [False] * 4, every=0.0, policy=policy)
    assert score(rep, T0, policy) < 0.5
    assert not suspension(rep, T0, policy).suspend  # 4 checks' weight: not yet evidence
    rep = checks(rep, [False], policy=policy)
    s = suspension(rep, T0, policy)
    assert s.suspend and "below 0.50" in s.reason


def test_weight_recovers_slowly_with_passes():
    rep = checks(Reputation(at=T0), [False, False], every=0.0)
    weights = []
    for i in range(12):
        rep = recorded(rep, passed=True, weight=1.0, now=T0, reason="")
        weights.append(weight_multiplier(rep, T0))
    assert weights == sorted(weights) and weights[0] == pytest.approx(0.6)
    assert weights[2] < 0.8 < weights[7]  # 6 passes to reach 0.8 after 2 failures
    assert weights[-1] < 1.0


def test_a_clock_stepping_back_neither_decays_nor_raises():
    rep = checks(Reputation(at=T0), [False])
    back = recorded(rep, passed=False, weight=1.0, now=T0 - HOUR, reason="x")
    assert back.fails == 2.0 and back.at == T0
    assert score(back, T0 - HOUR) == score(back, T0)


@pytest.mark.parametrize("weight", [0.0, -1.0, 11.0, math.nan, math.inf])
def test_a_check_weight_out_of_bounds_is_refused(weight):
    with pytest.raises(ValueError, match="weight"):
        recorded(Reputation(), passed=True, weight=weight, now=T0)


@pytest.mark.parametrize("kwargs, field", [(dict(half_life_s=0.0), "half_life_s"), (dict(floor=1.0), "floor"),
                                           (dict(min_evidence=-1.0), "min_evidence"),
                                           (dict(suspend_fails=math.nan), "suspend_fails")])
def test_a_bad_policy_is_refused(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Policy(**kwargs)


def test_a_reputation_survives_a_plain_dict_and_json():
    rep = checks(Reputation(at=T0), [True, False, True, False])
    assert from_dict(json.loads(json.dumps(to_dict(rep)))) == rep


def test_recent_failures_are_bounded():
    rep = checks(Reputation(at=T0), [False] * (MAX_RECENT_FAILS + 10), every=1.0)
    assert len(rep.recent_fails) == MAX_RECENT_FAILS
    assert from_dict(to_dict(rep)) == rep


GOOD = dict(passes=3.0, fails=1.0, at=T0, recent_fails=[[T0 - 10, 1.0]], reason="replay: cosine 0.31")

MALFORMED = [
    ("not a dict", [1, 2], "reputation: expected a dict"),
    ("a field missing", {k: v for k, v in GOOD.items() if k != "passes"}, "reputation.passes: missing"),
    ("an unknown field", GOOD | {"trusted": True}, "reputation.trusted: unknown"),
    ("negative passes", GOOD | {"passes": -1.0}, "reputation.passes"),
    ("nan fails", GOOD | {"fails": math.nan}, "reputation.fails"),
    ("passes as text", GOOD | {"passes": "3"}, "reputation.passes: expected a number"),
    ("passes as a bool", GOOD | {"passes": True}, "reputation.passes: expected a number"),
    ("fails past the bound", GOOD | {"fails": 1e12}, "reputation.fails"),
    ("time infinite", GOOD | {"at": math.inf}, "reputation.at"),
    ("recent failures not a list", GOOD | {"recent_fails": "x"}, "reputation.recent_fails"),
    ("too many recent failures", GOOD | {"recent_fails": [[T0, 1.0]] * (MAX_RECENT_FAILS + 1)},
     "reputation.recent_fails"),
    ("a recent failure not a pair", GOOD | {"recent_fails": [[T0]]}, "reputation.recent_fails[0]"),
    ("a failure after the reputation's time", GOOD | {"recent_fails": [[T0 + 1, 1.0]]},
     "reputation.recent_fails[0].time"),
    ("failures out of order", GOOD | {"recent_fails": [[T0, 1.0], [T0 - 5, 1.0]]},
     "reputation.recent_fails[1].time"),
    ("a failure of weight 0", GOOD | {"recent_fails": [[T0, 0.0]]}, "reputation.recent_fails[0].weight"),
    ("a reason too long", GOOD | {"reason": "x" * 201}, "reputation.reason"),
    ("a reason not text", GOOD | {"reason": 5}, "reputation.reason"),
]


@pytest.mark.parametrize("what, data, field", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_dict_is_refused_naming_the_field(what, data, field):
    with pytest.raises(ReputationError) as e:
        from_dict(data)
    assert field in str(e.value)


def test_a_tokens_nodes_failing_together_suspend_the_token():
    book = Book()
    for i, node in enumerate(("node-a", "node-b", "node-c")):
        book.record(node, "token-1", passed=False, weight=1.0, now=T0 + i, reason=f"{node}: no gain")
    book.record("node-d", "token-2", passed=True, weight=1.0, now=T0)
    for node in ("node-a", "node-b", "node-c"):
        s = book.suspension(node, "token-1", T0 + 3)
        assert s.suspend and s.reason.startswith("token token-1")
        assert book.weight(node, "token-1", T0 + 3) == 0.0
        assert not suspension(book.nodes[node], T0 + 3).suspend  # one failure each
    fresh = book.suspension("node-new", "token-1", T0 + 3)  # a fresh node of that token is suspended too
    assert fresh.suspend
    assert not book.suspension("node-d", "token-2", T0 + 3).suspend
    assert book.weight("node-d", "token-2", T0 + 3) == 1.0


def test_a_token_policy_gives_tokens_more_room():
    book = Book(token_policy=Policy(suspend_fails=10.0))
    for i, node in enumerate(("node-a", "node-b", "node-c")):
        book.record(node, "token-1", passed=False, weight=1.0, now=T0 + i)
    assert not book.suspension("node-a", "token-1", T0 + 3).suspend


def test_a_book_survives_a_plain_dict_and_json():
    book = Book()
    book.record("node-a", "token-1", passed=False, weight=2.0, now=T0, reason="replay: x10 norm")
    book.record("node-b", "token-1", passed=True, weight=1.0, now=T0 + 1)
    again = Book.from_dict(json.loads(json.dumps(book.to_dict())))
    assert (again.nodes, again.tokens) == (book.nodes, book.tokens)


@pytest.mark.parametrize("data, field", [
    ({"nodes": {}}, "book: expected"),
    ({"nodes": [], "tokens": {}}, "book.nodes"),
    ({"nodes": {"x" * 129: to_dict(Reputation())}, "tokens": {}}, "book.nodes: key"),
    ({"nodes": {"": to_dict(Reputation())}, "tokens": {}}, "book.nodes: key"),
    ({"nodes": {}, "tokens": {"token-1": GOOD | {"fails": -1}}}, "book.tokens[token-1].fails"),
])
def test_a_malformed_book_is_refused_naming_the_field(data, field):
    with pytest.raises(ReputationError) as e:
        Book.from_dict(data)
    assert field in str(e.value)

"""The swarm's count over every group (cotrain.averaging.ledger): pure functions, tested as tables."""

import pytest

from cotrain.averaging.meeting import Meeting
from cotrain.averaging.ledger import (MAX_COUNT, MAX_ENTRIES, Ledger, agreed_count, checked_count, said_counts)


@pytest.mark.parametrize("previous, round_number, claimed, count, cut", [
    (None, 0, 0, 0, False),  # a new peer
    (None, 4, 500, 500, False),  # 5 rounds of up to 100
    (None, 4, 501, 500, True),
    ((10, 2000), 12, 2300, 2300, False),  # 3 rounds (the one under way too) since the last claim
    ((10, 2000), 12, 2301, 2300, True),
    ((10, 2000), 10, 10**9, 2100, True),  # a peer that claims 10^9 gains one round's bound
    ((10, 2000), 5, 1000, 1000, False),  # less than before: the ledger keeps the higher one (Ledger.observe)
    (None, 0, -7, 0, False),
])
def test_a_claimed_count_is_bounded_by_what_the_peer_could_have_done(previous, round_number, claimed, count, cut):
    kept, reason = checked_count(previous, round_number, claimed, round_cap=100)
    assert kept == count
    assert bool(reason) == cut


@pytest.mark.parametrize("views, agreed", [
    ({}, 0),
    ({"a": 500}, 500),
    ({"a": 500, "b": 700}, 500),  # two: the lower
    ({"a": 500, "b": 700, "liar": 10**15}, 700),  # a liar cannot raise it
    ({"a": 500, "b": 700, "c": 650, "liar": 0}, 500),
    ({"a": 500, "b": 700, "c": 650, "d": 640}, 640),
])
def test_a_group_agrees_on_the_lower_median_of_its_members_views(views, agreed):
    assert agreed_count(views) == agreed


def test_what_members_said_is_read_as_counts_and_garbage_as_zero():
    info = {"a": {"swarm": 900, "contributed": 300, "samples": 80},
            "b": {"swarm": "lots", "contributed": True, "samples": None},
            "c": {"swarm": 2**80, "contributed": -5, "samples": 8}}
    views, after = said_counts(info, {"a": 80, "b": 0, "c": 8})
    assert views == {"a": 900, "b": 0, "c": MAX_COUNT}
    assert after == {"a": 380, "b": 0, "c": 8}
    assert said_counts(info, {"a": 20})[1] == {"a": 320, "b": 0, "c": 0}  # the round's samples as credited


def test_the_ledger_counts_every_peer_once_and_never_goes_back():
    ledger = Ledger(round_cap=1000)
    for _ in range(3):  # the same record read three times
        assert ledger.observe("a", 3, 800) == ""
    ledger.observe("b", 2, 500)
    ledger.observe("b", 1, 200)  # an older record read late
    assert ledger.total() == 1300
    assert ledger.count_of("b") == 500 and ledger.count_of("nobody") == 0
    assert ledger.observe("c", 0, 10**9)  # cut, and said why
    assert ledger.count_of("c") == 1000


def test_a_ledger_travels_with_the_state_and_malformed_entries_are_skipped():
    ledger = Ledger(round_cap=1000)
    ledger.observe("a", 3, 800)
    ledger.observe("b", 5, 2000)
    other = Ledger(round_cap=1000)
    other.take(dict(ledger.to_metadata(), bad=["x", 3], worse=[1], bool=[True, 5], **{"n" * 200: [1, 1]}))
    other.take("not a ledger")
    assert other.to_metadata() == ledger.to_metadata()


def test_a_ledger_keeps_its_largest_entries():
    ledger = Ledger(round_cap=10**6)
    for i in range(MAX_ENTRIES + 10):
        ledger.observe(f"p{i}", 10, i + 1)
    kept = ledger.to_metadata()
    assert len(kept) == MAX_ENTRIES and "p0" not in kept and f"p{MAX_ENTRIES + 9}" in kept


def test_a_meeting_carries_its_counts_and_refuses_bad_ones_naming_the_field():
    m = Meeting(3, "g", 80, "h", True, b"\x01", swarm=12345, contributed=678)
    assert Meeting.decode(m.encode()) == m
    for field, bad in (("swarm", -1), ("contributed", 2**60), ("swarm", "many"), ("contributed", 1.5)):
        raw = m.encode().replace(f'"{field}": {getattr(m, field)}'.encode(), f'"{field}": {bad!r}'.encode()
                                 if not isinstance(bad, str) else f'"{field}": "{bad}"'.encode())
        with pytest.raises(ValueError, match=field):
            Meeting.decode(raw)

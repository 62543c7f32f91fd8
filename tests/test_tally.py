"""Where a peer stands on the swarm's clock (cotrain.averaging.tally.Tally): counts in, counts out, hostile claims
cut and logged once a peer."""

import logging

from cotrain.averaging.tally import Tally

ME, A = "peer-me-0000000", "peer-a-11111111"


def test_the_swarms_count_is_the_groups_or_the_ledgers_whichever_is_more():
    tally = Tally(ME, round_cap=1_000)
    tally.advance(swarm=5_000, added=600)
    assert (tally.samples_total, tally.round_samples, tally.swarm_view()) == (5_600, 600, 5_600)
    tally.observe([(A, 1, 900)])  # another group's peer, seen on the board
    tally.count_own(400, next_round=1)
    assert tally.contributed == 400 and tally.swarm_view() == 5_600  # 900 + 400 counted by the ledger: less
    tally.observe([(A, 40, 9_000)])
    assert tally.swarm_view() == 9_400


def test_a_claim_beyond_what_a_peer_could_do_is_cut_and_logged_once(caplog):
    tally = Tally(ME, round_cap=1_000)
    with caplog.at_level(logging.WARNING, logger="cotrain.averaging.tally"):
        tally.observe([(A, 1, 10**9)])
        tally.observe([(A, 2, 10**9)])
    assert tally.ledger.count_of(A) <= 5_000  # a few rounds of the cap, not the claim
    assert len(caplog.records) == 1


def test_a_claim_its_contribution_did_not_show_is_logged_once(caplog):
    tally = Tally(ME, round_cap=1_000)
    with caplog.at_level(logging.WARNING, logger="cotrain.averaging.tally"):
        tally.note_credits(3, {A: 800_000, ME: 800}, {A: 1_000, ME: 800})
        tally.note_credits(4, {A: 800_000}, {A: 1_000})
        tally.note_credits(5, {ME: 800}, {ME: 500})  # more than half shown: an ordinary round
    assert len(caplog.records) == 1 and A[-8:] in caplog.records[0].getMessage()


def test_a_joiner_takes_the_states_count_without_counting_twice():
    donor = Tally(A, round_cap=1_000)
    donor.count_own(700, next_round=1)
    donor.advance(swarm=0, added=1_300)
    joiner = Tally(ME, round_cap=1_000)
    joiner.take(donor.to_metadata())
    assert (joiner.samples_total, joiner.round_samples, joiner.contributed) == (1_300, 1_300, 0)
    back = Tally(A, round_cap=1_000)  # the donor's own identity, back after a restart: its count is its own again
    back.take(donor.to_metadata())
    assert back.contributed == 700


def test_a_malformed_states_count_leaves_the_tally_as_it_was():
    tally = Tally(ME, round_cap=1_000)
    tally.take({"samples_total": 10, "ledger": {"x": "not a count", 7: [1, 2]}})
    assert (tally.samples_total, tally.ledger.total()) == (10, 0)

"""A node's evidence of a round: kept for its last rounds, committed with its record key, encoded for a validator;
hostile bytes refused with the field named; what it reduced of its groupmates' contributions, and the binding of
a contribution to those reports (cotrain.verification.witness)."""

import struct

import pytest
import torch
from hivemind.utils.crypto import RSAPrivateKey

from cotrain.verification.commitment import matches, verify_commitment
from cotrain.verification.evidence import (KEEP_ROUNDS, MAGIC, Evidence, EvidenceError, EvidenceKeeper,
                                           decode_evidence, encode_evidence, evidence_bytes)
from cotrain.verification.witness import (MAX_PARTS_SEEN, PartSeen, binding_counts, contradicting,
                                          part_digest)

RUN, PEER = "run-1-0123abcd", "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
PARAMS = [torch.randn(3, 4), torch.randn(5)]
NUMEL = 17


@pytest.fixture(scope="module")
def key():
    return RSAPrivateKey()


@pytest.fixture(scope="module")
def keeper(key):
    k = EvidenceKeeper(key, RUN, PEER)
    for r in range(1, 6):
        k.keep(r, f"hash{r}", PARAMS, torch.full((NUMEL,), float(r)))
    return k


def test_the_keeper_keeps_the_last_rounds_and_their_evidence_round_trips(keeper):
    assert keeper.latest() == 5
    assert keeper.encoded(5 - KEEP_ROUNDS) is None  # dropped
    ev = decode_evidence(keeper.encoded(4), NUMEL)
    assert (ev.round, ev.state_hash) == (4, "hash4")
    assert torch.equal(ev.params, torch.cat([p.reshape(-1) for p in PARAMS]))
    assert torch.equal(ev.contribution, torch.full((NUMEL,), 4.0))


def test_the_commitment_is_the_peers_and_covers_the_contribution(keeper, key):
    ev = decode_evidence(keeper.encoded(5), NUMEL)
    signed = verify_commitment(ev.commitment, key.get_public_key().to_bytes(), run_id=RUN, round=5, peer_id=PEER)
    assert signed.ok, signed.reason
    assert matches(signed.commitment, ev.contribution_bytes).ok
    assert not matches(signed.commitment, decode_evidence(keeper.encoded(4), NUMEL).contribution_bytes).ok
    # another round's commitment is not this round's
    assert not verify_commitment(ev.commitment, key.get_public_key().to_bytes(), run_id=RUN, round=4,
                                 peer_id=PEER).ok


def test_the_reads_since_the_last_round_go_with_its_evidence_merged(key):
    k = EvidenceKeeper(key, RUN, PEER)
    k.note_read([(100, 133), (500, 533)])
    k.note_read([(132, 165), (532, 565)])  # the next batch of each stream overlaps by a byte
    k.keep(1, "h", PARAMS, torch.zeros(NUMEL))
    k.note_read([(165, 198)])
    k.keep(2, "h", PARAMS, torch.zeros(NUMEL))
    assert decode_evidence(k.encoded(1), NUMEL).reads == ((100, 165), (500, 565))
    assert decode_evidence(k.encoded(2), NUMEL).reads == ((165, 198),)


def test_overlapping_or_empty_reads_are_refused():
    for reads in (((10, 20), (15, 30)), ((10, 10),), ((30, 40), (10, 20))):
        data = encode_evidence(Evidence(1, "h", b"c", torch.zeros(NUMEL), torch.zeros(NUMEL), reads))
        with pytest.raises(EvidenceError, match="evidence.reads"):
            decode_evidence(data, NUMEL)


def test_nothing_kept_says_round_zero(key):
    assert EvidenceKeeper(key, RUN, PEER).latest() == 0
    assert EvidenceKeeper(key, RUN, PEER).encoded(1) is None


@pytest.mark.parametrize("mangle, field", [
    (lambda b: b"XXXX" + b[4:], "evidence.magic"),
    (lambda b: b[:-1], "evidence.contribution"),
    (lambda b: b + b"\0", "trailing"),
    (lambda b: b[:20], "evidence."),
    (lambda b: b"", "evidence.magic"),
])
def test_malformed_evidence_names_the_field(keeper, mangle, field):
    with pytest.raises(EvidenceError, match=field.replace(".", r"\.")):
        decode_evidence(mangle(keeper.encoded(5)), NUMEL)


def test_evidence_of_another_model_or_too_large_is_refused(keeper):
    data = keeper.encoded(5)
    with pytest.raises(EvidenceError, match="numel"):
        decode_evidence(data, NUMEL + 1)
    with pytest.raises(EvidenceError, match="at most"):
        decode_evidence(data + bytes(evidence_bytes(NUMEL)), NUMEL)
    with pytest.raises(EvidenceError, match="expected bytes"):
        decode_evidence("text", NUMEL)


def test_non_finite_parameters_are_refused():
    params = torch.zeros(NUMEL)
    params[3] = float("nan")
    data = encode_evidence(Evidence(1, "h", b"c", params, torch.zeros(NUMEL)))
    with pytest.raises(EvidenceError, match="evidence.params"):
        decode_evidence(data, NUMEL)


def test_a_huge_length_field_is_refused_before_reading(keeper):
    data = bytearray(keeper.encoded(5))
    at = len(MAGIC) + 8
    data[at:at + 2] = struct.pack("<H", 60000)
    with pytest.raises(EvidenceError, match="state_hash"):
        decode_evidence(bytes(data), NUMEL)


def test_the_parts_a_node_reduced_go_with_its_heartbeats_for_its_last_two_rounds_newest_first(key):
    k = EvidenceKeeper(key, RUN, PEER)
    for r in range(1, 5):
        k.keep(r, f"hash{r}", PARAMS, torch.zeros(NUMEL),
               seen=[(f"Qm{r}a", 0, 8, bytes(32)), (f"Qm{r}b", 0, 8, bytes(32))])
    k.keep(5, "hash5", PARAMS, torch.zeros(NUMEL))  # a round it reduced nothing in
    assert [(p.round, p.member) for p in k.parts_seen()] == [(4, "Qm4a"), (4, "Qm4b"), (3, "Qm3a"), (3, "Qm3b")]
    many = EvidenceKeeper(key, RUN, PEER)
    many.keep(1, "h", PARAMS, torch.zeros(NUMEL), seen=[(f"Qm{i}", 0, 8, bytes(32)) for i in range(MAX_PARTS_SEEN * 2)])
    assert len(many.parts_seen()) == MAX_PARTS_SEEN


def test_a_contribution_is_bound_when_every_reported_part_is_its_own():
    values = torch.randn(100)
    reports = [("node-r", PartSeen(3, PEER, 0, 50, part_digest(values[:50]))),
               ("node-s", PartSeen(3, PEER, 50, 100, part_digest(values[50:])))]
    assert contradicting(values, reports) == []
    assert contradicting(values, []) == []  # nothing reported: nothing to bind to
    other = values.clone()
    other[70] += 1e-3  # one value in the second part
    assert [reducer for reducer, _ in contradicting(other, reports)] == ["node-s"]
    assert [reducer for reducer, _ in contradicting(values[:40], reports)] == ["node-r", "node-s"]


@pytest.mark.parametrize("reducers, counts", [(set(), False), ({"node-r"}, False), ({"node-r", "node-s"}, True),
                                              ({"a", "b", "c"}, True)])
def test_a_contradiction_counts_once_two_distinct_reducers_made_one(reducers, counts):
    assert binding_counts(reducers) == counts

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
from cotrain.verification.witness import (MAX_PARTS_SEEN, PartSeen, PartSigning, binding, pack_signed,
                                          part_digest, part_signed, unpack_signed)

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


def seen(round_number, member):
    return PartSeen(round_number, member, 0, 8, bytes(32), b"sig", bytes(32))


def test_the_parts_a_node_reduced_go_with_its_heartbeats_for_its_last_two_rounds_newest_first(key):
    k = EvidenceKeeper(key, RUN, PEER)
    for r in range(1, 5):
        k.keep(r, f"hash{r}", PARAMS, torch.zeros(NUMEL), seen=[seen(r, f"Qm{r}a"), seen(r, f"Qm{r}b")])
    k.keep(5, "hash5", PARAMS, torch.zeros(NUMEL))  # a round it reduced nothing in
    assert [(p.round, p.member) for p in k.parts_seen()] == [(4, "Qm4a"), (4, "Qm4b"), (3, "Qm3a"), (3, "Qm3b")]
    many = EvidenceKeeper(key, RUN, PEER)
    many.keep(1, "h", PARAMS, torch.zeros(NUMEL), seen=[seen(1, f"Qm{i}") for i in range(MAX_PARTS_SEEN * 2)])
    assert len(many.parts_seen()) == MAX_PARTS_SEEN


def test_a_part_is_the_members_word_only_with_its_record_keys_signature(key):
    values = torch.randn(10)
    whole = part_digest(torch.randn(20))
    signing = PartSigning(RUN, 3, PEER, key, {PEER: key.get_public_key().to_bytes()}.get)
    part = PartSeen(3, PEER, 2, 12, part_digest(values), signing.sign(2, 12, part_digest(values), whole), whole)
    public = key.get_public_key().to_bytes()
    assert part_signed(public, RUN, part) and signing.valid(part)
    assert not part_signed(public, "other-run", part)
    assert not part_signed(public, RUN, part._replace(end=11))
    assert not part_signed(public, RUN, part._replace(digest=part_digest(values + 1)))
    assert not part_signed(public, RUN, part._replace(contribution=bytes(32)))
    assert not part_signed(RSAPrivateKey().get_public_key().to_bytes(), RUN, part)
    assert not part_signed(b"garbage", RUN, part) and not part_signed(None, RUN, part)
    assert unpack_signed(pack_signed(whole, part.signature, b"values")) == (whole, part.signature, b"values")
    with pytest.raises(ValueError, match="signature"):
        unpack_signed(bytes(32) + b"\x05\x00ab")


def reports(whole, cuts, contribution=None):
    contribution = part_digest(whole) if contribution is None else contribution
    return [(f"node-{i}", PartSeen(3, PEER, a, b, part_digest(whole[a:b]), b"s", contribution))
            for i, (a, b) in enumerate(cuts)]


def test_the_evidence_is_bound_when_the_reports_of_its_contribution_match_it():
    values = torch.randn(100)
    assert binding(values, reports(values, [(0, 50), (50, 100)])) == ""
    assert binding(values, []) == ""  # nothing reported: nothing to bind to
    other = values.clone()
    other[70] += 1e-3  # signed as a part of `values`, but with another value
    mixed = reports(values, [(0, 50)]) + reports(other, [(50, 100)], contribution=part_digest(values))
    assert "[50, 100)" in binding(values, mixed)
    assert "[0, 50)" in binding(values[:40], reports(values[:40], [(0, 50)], contribution=part_digest(values[:40])))


def test_reports_of_only_another_contribution_unbind_it_and_an_earlier_try_beside_this_one_does_not():
    values, earlier = torch.randn(100), torch.randn(100)
    assert "another contribution" in binding(values, reports(earlier, [(0, 100)]))
    assert binding(values, reports(earlier, [(0, 100)]) + reports(values, [(0, 50)])) == ""

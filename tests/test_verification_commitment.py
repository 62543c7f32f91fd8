"""Commitments to contributions: signed with the peer's record key, checked field by field, hostile bytes refused
with the field named and never an exception; copies attributed to the commitment that came first."""

import hashlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hivemind.utils.crypto import RSAPrivateKey

from cotrain.verification.commitment import (MAX_COMMITMENT_BYTES, MAX_RUN_ID_BYTES, Commitment, commit,
                                             decode_commitment, encode_commitment, find_copies, matches,
                                             verify_commitment)

RUN, ROUND = "run-1-0123abcd", 7
PEER = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
OTHER_PEER = "QmZMxNdpMkewiVZLMRxaNxUeZpDUb34pWjZ1kZvsd16Zic"
CONTRIBUTION = bytes(range(256)) * 40
#: for the hypothesis tests, which take no pytest fixtures
_FUZZ_KEY = RSAPrivateKey()
_FUZZ_SIGNED = encode_commitment(commit(_FUZZ_KEY, run_id=RUN, round=ROUND, peer_id=PEER, contribution=CONTRIBUTION))


@pytest.fixture(scope="module")
def key():
    return RSAPrivateKey()


@pytest.fixture(scope="module")
def other_key():
    return RSAPrivateKey()


@pytest.fixture(scope="module")
def signed(key):
    return encode_commitment(commit(key, run_id=RUN, round=ROUND, peer_id=PEER, contribution=CONTRIBUTION))


def public(key) -> bytes:
    return key.get_public_key().to_bytes()  # as a credential's record_public_key holds it


def check(data, key, run_id=RUN, round=ROUND, peer_id=PEER):
    return verify_commitment(data, public(key), run_id=run_id, round=round, peer_id=peer_id)


def test_a_commitment_verifies_and_its_reveal_matches(key, signed):
    checked = check(signed, key)
    assert checked.ok, checked.reason
    c = checked.commitment
    assert (c.run_id, c.round, c.peer_id, c.size) == (RUN, ROUND, PEER, len(CONTRIBUTION))
    assert c.digest == hashlib.sha256(CONTRIBUTION).digest()
    assert len(signed) <= MAX_COMMITMENT_BYTES
    assert matches(c, CONTRIBUTION).ok


def _resigned_body_field(signed: bytes, offset: int, value: bytes) -> bytes:
    return signed[:offset] + value + signed[offset + len(value):]


def test_hostile_commitments_are_refused_with_the_field_named(key, other_key, signed):
    run_at = 4 + 2  # magic, run_id's length
    round_at = run_at + len(RUN)
    peer_len_at = round_at + 8
    digest_at = peer_len_at + 2 + len(PEER)
    size_at = digest_at + 32
    sig_len_at = size_at + 8
    cases = [
        ("another key signed it", signed, dict(k=other_key), "commitment.signature"),
        ("the digest was changed", _resigned_body_field(signed, digest_at, b"\0" * 32), {}, "commitment.signature"),
        ("the size was changed", _resigned_body_field(signed, size_at, struct.pack(">Q", 1)), {},
         "commitment.signature"),
        ("of another run", signed, dict(run_id="run-2"), "commitment.run_id"),
        ("of another round", signed, dict(round=ROUND + 1), "commitment.round"),
        ("of another peer", signed, dict(peer_id=OTHER_PEER), "commitment.peer_id"),
        ("oversize", signed + b"\0" * MAX_COMMITMENT_BYTES, {}, "commitment: "),
        ("trailing bytes", signed + b"\0", {}, "trailing"),
        ("empty", b"", {}, "commitment.magic"),
        ("not a commitment", b"GET / HTTP/1.1\r\n", {}, "commitment.magic"),
        ("truncated in the run id", signed[:run_at + 3], {}, "commitment.run_id: truncated"),
        ("truncated in the round", signed[:round_at + 3], {}, "commitment.round: truncated"),
        ("truncated in the digest", signed[:digest_at + 3], {}, "commitment.digest: truncated"),
        ("truncated in the signature", signed[:-1], {}, "commitment.signature: truncated"),
        ("run id of length 0", signed[:4] + b"\0\0" + signed[round_at:], {}, "commitment.run_id"),
        ("run id over its bound", signed[:4] + struct.pack(">H", MAX_RUN_ID_BYTES + 1) + signed[run_at:], {},
         "commitment.run_id"),
        ("peer id not utf-8", signed[:peer_len_at + 2] + b"\xff" + signed[peer_len_at + 3:], {},
         "commitment.peer_id: not utf-8"),
        ("size over its bound", _resigned_body_field(signed, size_at, struct.pack(">Q", 1 << 62)), {},
         "commitment.size"),
        ("round over its bound", _resigned_body_field(signed, round_at, struct.pack(">Q", 1 << 63)), {},
         "commitment.round"),
        ("signature of length 0", signed[:sig_len_at] + b"\0\0", {}, "commitment.signature"),
        ("not bytes", "a string", {}, "expected bytes"),
        ("None", None, {}, "expected bytes"),
    ]
    for what, data, kwargs, field in cases:
        k = kwargs.pop("k", key)
        checked = check(data, k, **kwargs)
        assert not checked.ok, what
        assert field in checked.reason, (what, checked.reason)


@pytest.mark.parametrize("bad_key", [b"", b"ssh-rsa AAAA", b"\0" * 5000, "not bytes"])
def test_a_malformed_public_key_is_refused_not_raised(signed, bad_key):
    checked = verify_commitment(signed, bad_key, run_id=RUN, round=ROUND, peer_id=PEER)
    assert not checked.ok and checked.reason.startswith("public_key")


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=MAX_COMMITMENT_BYTES + 8))
def test_random_bytes_never_raise_and_never_verify(data):
    key_bytes = _FUZZ_KEY.get_public_key().to_bytes()
    assert not verify_commitment(data, key_bytes, run_id=RUN, round=ROUND, peer_id=PEER).ok
    decode_commitment(data)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_mutated_commitment_never_raises_and_never_verifies_to_other_contents(data):
    original = _FUZZ_SIGNED
    at = data.draw(st.integers(0, len(original) - 1))
    byte = data.draw(st.integers(0, 255))
    mutated = original[:at] + bytes([byte]) + original[at + 1:]
    checked = verify_commitment(mutated, _FUZZ_KEY.get_public_key().to_bytes(), run_id=RUN, round=ROUND,
                                peer_id=PEER)
    if checked.ok:  # base64 leaves a few bits of the signature's last character unused: same signature, same contents
        c = checked.commitment
        assert (c.digest, c.size) == (hashlib.sha256(CONTRIBUTION).digest(), len(CONTRIBUTION))


@pytest.mark.parametrize("revealed, field", [
    (CONTRIBUTION[:-1] + b"\x00", "sha256"),
    (CONTRIBUTION + b"\x00", "revealed: "),
    (b"", "revealed: 0 bytes"),
    ("text", "expected bytes"),
])
def test_a_reveal_other_than_the_committed_bytes_does_not_match(key, revealed, field):
    c = commit(key, run_id=RUN, round=ROUND, peer_id=PEER, contribution=CONTRIBUTION)
    result = matches(c, revealed)
    assert not result.ok and field in result.reason


@pytest.mark.parametrize("kwargs, field", [
    (dict(run_id=""), "run_id"),
    (dict(run_id="r" * (MAX_RUN_ID_BYTES + 1)), "run_id"),
    (dict(peer_id="p" * 129), "peer_id"),
    (dict(round=-1), "round"),
])
def test_commit_refuses_out_of_bound_arguments_naming_them(key, kwargs, field):
    args = dict(run_id=RUN, round=ROUND, peer_id=PEER, contribution=b"x") | kwargs
    with pytest.raises(ValueError, match=field):
        commit(key, **args)


def _c(peer, round_, digest, run=RUN):
    return Commitment(run, round_, peer, digest, 1, b"sig")


X, Y, Z = b"x" * 32, b"y" * 32, b"z" * 32


@pytest.mark.parametrize("commitments, expected", [
    ([_c("A", 1, X), _c("B", 1, Y)], set()),
    ([_c("A", 1, X), _c("A", 1, X)], set()),  # the same commitment seen twice
    ([_c("A", 1, X), _c("B", 2, X)], {("B", 2, "A", 1, "copied")}),
    ([_c("A", 1, X), _c("A", 3, X)], {("A", 3, "A", 1, "resent its own")}),
    ([_c("A", 1, Z), _c("B", 1, Z)], {("A", 1, "B", 1, "same bytes"), ("B", 1, "A", 1, "same bytes")}),
    ([_c("A", 1, X), _c("B", 1, X, run="run-2")], set()),  # another run's
])
def test_copies_are_attributed_to_the_first_commitment(commitments, expected):
    found = {(c.peer_id, c.round, c.of_peer_id, c.of_round) for c in find_copies(commitments)}
    assert found == {e[:4] for e in expected}
    reasons = {(c.peer_id, c.round): c.reason for c in find_copies(commitments)}
    for e in expected:
        assert e[4] in reasons[e[:2]]

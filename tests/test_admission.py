"""Data-plane admission as pure logic: credentials and revocation lists checked with a fake clock, the coordinator's
issuer and key, reachability decisions. The swarm-level checks (rogue peers against real nodes) are in
tests/test_rogue_peers.py."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cotrain.averaging.admission import (Admission, AdmissionError, MembershipValidator, credential_decision,
                                         issue_credential, new_private_key, parse_credential, public_key_bytes,
                                         sign_revocations)
from cotrain.coordinator.admission import Issuer, load_or_create_key, needs_renewal, nodes_to_revoke
from cotrain.coordinator.reachability import InvalidPeer, parse_peer, reachability_decision
from cotrain.protocol import DIAL_OUT_ONLY, PUBLIC

RUN = "run-1"
PEER = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
OTHER_PEER = "QmZMxNdpMkewiVZLMRxaNxUeZpDUb34pWjZ1kZvsd16Zic"
RECORD_KEY = b"rsa-public-key-of-the-node"


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def credential(key, now=1000.0, ttl=300.0, run_id=RUN, peer_id=PEER, node_id="a" * 32, role="node",
               reputation=1.0):
    return issue_credential(key, run_id=run_id, node_id=node_id, peer_id=peer_id, record_public_key=RECORD_KEY,
                            role=role, now=now, ttl=ttl, reputation=reputation)


@pytest.fixture
def key():
    return new_private_key()


def test_a_valid_credential_admits_its_peer(key):
    clock = Clock()
    gate = Admission(RUN, key.public_key(), clock=clock)
    verdict = gate.check(credential(key), PEER, "a state download", record_public_key=RECORD_KEY)
    assert verdict.ok and verdict.node_id == "a" * 32 and verdict.expires == 1300.0
    assert gate.refused == 0


def test_a_peers_reputation_is_its_newest_credentials(key):
    clock = Clock()
    gate = Admission(RUN, key.public_key(), clock=clock)
    assert gate.reputation(PEER) == 1.0  # none seen
    assert gate.check(credential(key, now=1000.0, reputation=0.5), PEER, "a part").ok
    assert gate.reputation(PEER) == 0.5
    assert gate.check(credential(key, now=990.0), PEER, "a part").ok  # an older credential undoes nothing
    assert gate.reputation(PEER) == 0.5
    assert gate.check(credential(key, now=1001.0, reputation=0.75), PEER, "a part").ok
    assert gate.reputation(PEER) == 0.75
    assert gate.check(credential(key, now=1000.0, peer_id="x" * 46), PEER, "a part").ok is False
    assert gate.reputation(PEER) == 0.75  # a refused credential says nothing
    with pytest.raises(ValueError, match="reputation"):
        credential(key, reputation=0.0)


@pytest.mark.parametrize("case", ["none", "garbage", "oversized", "other_key", "other_run", "other_peer", "expired",
                                  "future", "record_key", "tampered"])
def test_bad_credentials_are_refused_and_counted(key, case):
    clock = Clock()
    gate = Admission(RUN, key.public_key(), clock=clock)
    record_key = RECORD_KEY
    peer = PEER
    data = credential(key)
    if case == "none":
        data = b""
    elif case == "garbage":
        data = b"\xff\x01garbage"
    elif case == "oversized":
        data = b"x" * 10_000
    elif case == "other_key":
        data = credential(new_private_key())
    elif case == "other_run":
        data = credential(key, run_id="another-run")
    elif case == "other_peer":  # a member's credential replayed by someone else
        peer = OTHER_PEER
    elif case == "expired":
        clock.now = 1300.0
    elif case == "future":
        data = credential(key, now=5000.0)
    elif case == "record_key":  # a record signed with another key than the credential names
        record_key = b"another-rsa-key"
    elif case == "tampered":
        data = bytearray(data)
        data[20] ^= 1
        data = bytes(data)
    verdict = gate.check(data, peer, "an all-reduce piece", record_public_key=record_key)
    assert not verdict.ok and verdict.reason
    assert gate.refused == 1 and gate.refused_peers[peer].startswith("an all-reduce piece")


def test_expiry_follows_the_clock(key):
    clock = Clock()
    gate = Admission(RUN, key.public_key(), clock=clock)
    data = credential(key, ttl=60)
    assert gate.verify(data, PEER).ok
    clock.now = 1059.9
    assert gate.verify(data, PEER).ok
    clock.now = 1060.0
    assert not gate.verify(data, PEER).ok


def test_revocation_lists_apply_newest_first(key):
    clock = Clock()
    gate = Admission(RUN, key.public_key(), clock=clock)
    data = credential(key)
    assert gate.apply_revocations(sign_revocations(key, run_id=RUN, version=2, node_ids=["a" * 32], now=1000))
    assert not gate.verify(data, PEER).ok and "revoked" in gate.verify(data, PEER).reason
    # an older list (replayed) does not undo a revocation
    assert not gate.apply_revocations(sign_revocations(key, run_id=RUN, version=1, node_ids=[], now=1000))
    assert "a" * 32 in gate.revoked
    # lists signed by another key or for another run are ignored
    assert not gate.apply_revocations(sign_revocations(new_private_key(), run_id=RUN, version=9, node_ids=[], now=1))
    assert not gate.apply_revocations(sign_revocations(key, run_id="other", version=9, node_ids=[], now=1))
    assert not gate.apply_revocations(b"not a list")
    assert gate.revocations_version == 2


def test_checks_can_be_switched_off_for_benches():
    gate = Admission(RUN, None, enabled=False)
    assert gate.verify(b"", PEER).ok
    with pytest.raises(ValueError):
        Admission(RUN, None)


def test_refused_peers_are_bounded(key):
    gate = Admission(RUN, key.public_key(), clock=Clock())
    for i in range(1000):
        gate.check(b"", f"peer-{i}", "a progress record")
    assert gate.refused == 1000 and len(gate.refused_peers) <= 256


def test_parse_credential_names_the_problem(key):
    with pytest.raises(AdmissionError, match="not signed"):
        parse_credential(credential(new_private_key()), key.public_key())
    with pytest.raises(AdmissionError, match="no credential"):
        parse_credential(b"", key.public_key())


def test_credential_decision_reasons(key):
    cred = parse_credential(credential(key), key.public_key())
    assert credential_decision(cred, run_id=RUN, peer_id=PEER, now=1000, revoked=frozenset()).ok
    assert "revoked" in credential_decision(cred, run_id=RUN, peer_id=PEER, now=1000,
                                            revoked=frozenset({"a" * 32})).reason
    assert "expired" in credential_decision(cred, run_id=RUN, peer_id=PEER, now=2000, revoked=frozenset()).reason


def test_membership_validator_takes_the_newer_revocations(key):
    old = MembershipValidator(RUN, f"{RUN}_progress", public_key_bytes(key), ["x"], version=1)
    new = MembershipValidator(RUN, f"{RUN}_progress", public_key_bytes(key), ["x", "y"], version=2)
    assert old.merge_with(new) and old.revoked == {"x", "y"}
    assert old.merge_with(MembershipValidator(RUN, f"{RUN}_progress", public_key_bytes(key), [], version=0))
    assert old.revoked == {"x", "y"}
    assert not old.merge_with(MembershipValidator(RUN, "other_progress", public_key_bytes(key)))



@settings(max_examples=300, deadline=None)
@given(subkey=st.binary(max_size=64), value=st.binary(max_size=256))
def test_membership_validator_rejects_any_malformed_record_without_raising(subkey, value):
    """It runs on what strangers store in the DHT: bytes that are not a record are invalid, never an exception."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord

    validator = MembershipValidator(RUN, f"{RUN}_progress", public_key_bytes(new_private_key()))
    record = DHTRecord(key=DHTID.generate(source=f"{RUN}_progress").to_bytes(), subkey=subkey, value=value,
                       expiration_time=0.0)
    assert validator.validate(record) in (True, False)


# ---- the coordinator's side -------------------------------------------------------------------------------------
def test_coordinator_key_is_kept_private_and_stable(tmp_path):
    first = load_or_create_key(tmp_path)
    assert (tmp_path / "coordinator.ed25519").stat().st_mode & 0o077 == 0
    assert public_key_bytes(load_or_create_key(tmp_path)) == public_key_bytes(first)


def test_issuer_persists_its_revocations(key):
    meta = {}
    clock = Clock()
    issuer = Issuer(key, RUN, 300.0, meta.get, meta.__setitem__, clock)
    assert issuer.revoke({"n1"}) and not issuer.revoke({"n1"})
    again = Issuer(key, RUN, 300.0, meta.get, meta.__setitem__, clock)
    assert again.version == issuer.version == 1 and again.revoked == {"n1"}
    gate = Admission(RUN, key.public_key(), clock=clock)
    assert gate.apply_revocations(again.signed_revocations) and gate.revoked == {"n1"}
    cred = issuer.issue("n2", PEER, RECORD_KEY)
    assert gate.verify(cred, PEER, RECORD_KEY).ok


def test_renewal_and_revocation_decisions():
    assert not needs_renewal(issued=100.0, now=249.0, ttl=300.0)
    assert needs_renewal(issued=100.0, now=250.0, ttl=300.0)
    members = [("n1", "alice"), ("n2", "alice"), ("n3", "bob")]
    assert nodes_to_revoke({"alice"}, members) == {"n1", "n2"}
    assert nodes_to_revoke(set(), members) == set()


def test_reachability_decisions():
    assert reachability_decision(True, None, "")[0] == DIAL_OUT_ONLY
    assert reachability_decision(False, True, "connected")[0] == PUBLIC
    state, reason = reachability_decision(False, False, "no answer within 5s")
    assert state == DIAL_OUT_ONLY and "client mode" in reason


@pytest.mark.parametrize("peer_id, maddrs, field", [
    ("", [], "peer_id"), ("not-base58-0OIl", [], "peer_id"), (PEER, ["/ip4/1.2.3.4/tcp/5"] * 17, "maddrs"),
    (PEER, ["nonsense"], "maddrs"), (PEER, ["/ip4/" + "1" * 300], "maddrs"),
])
def test_registered_peers_are_validated(peer_id, maddrs, field):
    with pytest.raises(InvalidPeer, match=field):
        parse_peer(peer_id, maddrs)


def test_a_good_peer_parses():
    peer, maddrs = parse_peer(PEER, [f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER}"])
    assert str(peer) == PEER and str(maddrs[0]) == "/ip4/127.0.0.1/tcp/4001"

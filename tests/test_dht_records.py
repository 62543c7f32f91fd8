"""Progress records on the DHT are signed per peer and checked against a schema by every DHT peer: one peer cannot
overwrite or forge another's record, and a record of the wrong shape is refused. Two real DHT peers on loopback."""

import time

import pytest
from hivemind.utils import get_dht_time

from cotrain.averaging import PeerProgress, ProgressBoard, load_record_key, start_dht

RUN = "records-test"


def _read_until(board, predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        peers = board.read() or []
        if predicate(peers) or time.monotonic() > deadline:
            return peers
        time.sleep(0.2)


def test_record_key_is_kept_across_restarts(tmp_path):
    first = load_record_key(tmp_path / "records.key")
    again = load_record_key(tmp_path / "records.key")
    assert first.get_public_key().to_bytes() == again.get_public_key().to_bytes()
    assert (tmp_path / "records.key").stat().st_mode & 0o077 == 0
    assert load_record_key(None).get_public_key().to_bytes() != first.get_public_key().to_bytes()


@pytest.mark.swarm
def test_progress_records_are_signed_and_validated(tmp_path):
    a = start_dht(identity_path=str(tmp_path / "a.key"))
    b = start_dht([str(m) for m in a.get_visible_maddrs()], identity_path=str(tmp_path / "b.key"))
    try:
        board_a = ProgressBoard(a, RUN, ttl=60, private_key=load_record_key(tmp_path / "a.rsa"))
        board_b = ProgressBoard(b, RUN, ttl=60, private_key=load_record_key(tmp_path / "b.rsa"))
        alice, bob = str(a.peer_id), str(b.peer_id)
        board_a.publish(PeerProgress(alice, round=7, steps=3, samples=96))
        board_b.publish(PeerProgress(bob, round=7, steps=1, samples=32))
        peers = _read_until(board_b, lambda ps: {p.peer_id for p in ps} == {alice, bob})
        assert {p.peer_id: p.round for p in peers} == {alice: 7, bob: 7}

        forged = dict(round=999, steps=0, samples=0, phase="train", mid_round=False, time=float(get_dht_time()))
        expires = get_dht_time() + 60
        # bob writes under alice's subkey: unsigned by alice's key, refused
        assert not b.store(board_a.key, subkey=board_a.subkey(alice), value=forged, expiration_time=expires)
        # a subkey without an owner's public key: refused by the schema
        assert not b.store(board_a.key, subkey=alice.encode(), value=forged, expiration_time=expires)
        # bob's own subkey, but a record of the wrong shape: refused by the schema
        assert not b.store(board_b.key, subkey=board_b.subkey(bob), value=dict(forged, round=-1),
                           expiration_time=expires)
        assert not b.store(board_b.key, subkey=board_b.subkey(bob), value=dict(forged, round="999"),
                           expiration_time=expires)
        # bob's own record, right shape: accepted
        assert b.store(board_b.key, subkey=board_b.subkey(bob), value=dict(forged, round=8), expiration_time=expires)

        peers = _read_until(board_a, lambda ps: {p.peer_id: p.round for p in ps}.get(bob) == 8)
        rounds = {p.peer_id: p.round for p in peers}
        assert rounds == {alice: 7, bob: 8}, rounds
    finally:
        b.shutdown()
        a.shutdown()

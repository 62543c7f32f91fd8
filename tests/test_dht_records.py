"""Progress records on the DHT are signed per peer and checked against a schema by every DHT peer: one peer cannot
overwrite or forge another's record, and a record of the wrong shape is refused. Two real DHT peers on loopback."""

import time

import pytest
from hivemind.utils import get_dht_time

from cotrain.averaging import Admission, PeerProgress, ProgressBoard, load_record_key, start_dht
from cotrain.averaging.admission import issue_credential, new_private_key

RUN = "records-test"


def member_board(dht, key_path, coordinator_key, shards=1):
    """A board whose peer holds a credential of ``coordinator_key`` for its peer id and record key."""
    admission = Admission(RUN, coordinator_key.public_key())
    board = ProgressBoard(dht, RUN, ttl=60, admission=admission, private_key=load_record_key(key_path), shards=shards)
    admission.set_credential(issue_credential(coordinator_key, run_id=RUN, node_id=key_path.stem,
                                              peer_id=str(dht.peer_id), record_public_key=board.record_public_key,
                                              role="node", now=time.time(), ttl=600))
    return board


@pytest.fixture
def members(tmp_path):
    """-> make(shards=1): two DHT peers on loopback and a member's board on each, stopped after the test."""
    started = []

    def make(shards: int = 1):
        a = start_dht(identity_path=str(tmp_path / "a.key"))
        started.append(a)
        b = start_dht([str(m) for m in a.get_visible_maddrs()], identity_path=str(tmp_path / "b.key"))
        started.append(b)
        coordinator_key = new_private_key()
        return (a, b, member_board(a, tmp_path / "a.rsa", coordinator_key, shards),
                member_board(b, tmp_path / "b.rsa", coordinator_key, shards))

    yield make
    for dht in reversed(started):
        dht.shutdown()


def _stored(board, progress, timeout=30.0):
    """Publish until a DHT peer kept the record (a store on a loaded machine can time out)."""
    deadline = time.monotonic() + timeout
    while not board.publish(progress).result(timeout=timeout):
        assert time.monotonic() < deadline, f"no DHT peer stored {progress}"
        time.sleep(0.2)


def _read_until(board, predicate, timeout=20.0, shard=0):
    deadline = time.monotonic() + timeout
    while True:
        peers = (board.read_all() if shard is None else board.read(shard=shard)) or []
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
def test_progress_records_are_signed_and_validated(members):
    a, b, board_a, board_b = members()
    alice, bob = str(a.peer_id), str(b.peer_id)
    board_a.publish(PeerProgress(alice, round=7, steps=3, samples=96, since=1234.5))
    board_b.publish(PeerProgress(bob, round=7, steps=1, samples=32))
    peers = _read_until(board_b, lambda ps: {p.peer_id for p in ps} == {alice, bob})
    assert {p.peer_id: (p.round, p.since) for p in peers} == {alice: (7, 1234.5), bob: (7, 0.0)}

    forged = dict(round=999, steps=0, samples=0, phase="train", mid_round=False, time=float(get_dht_time()),
                  reducer=True, since=0.0, contributed=0, cred=board_b.admission.credential())
    expires = get_dht_time() + 60
    # bob writes under alice's subkey, even with alice's own credential: unsigned by alice's key, refused
    assert not b.store(board_a.key, subkey=board_a.subkey(alice), value=dict(forged, cred=board_a.admission.credential()),
                       expiration_time=expires)
    assert not b.store(board_a.key, subkey=board_a.subkey(alice), value=forged, expiration_time=expires)
    # a subkey without an owner's public key: refused by the schema
    assert not b.store(board_a.key, subkey=alice.encode(), value=forged, expiration_time=expires)
    # bob's own subkey, but a record of the wrong shape: refused by the schema
    assert not b.store(board_b.key, subkey=board_b.subkey(bob), value=dict(forged, round=-1),
                       expiration_time=expires)
    assert not b.store(board_b.key, subkey=board_b.subkey(bob), value=dict(forged, round="999"),
                       expiration_time=expires)
    assert not b.store(board_b.key, subkey=board_b.subkey(bob), value=dict(forged, since="soon"),
                       expiration_time=expires)
    assert not b.store(board_b.key, subkey=board_b.subkey(bob), value=dict(forged, contributed=-1),
                       expiration_time=expires)
    for missing in ("since", "contributed"):  # records of protocol versions 1 and 4
        older = {k: v for k, v in forged.items() if k != missing}
        assert not b.store(board_b.key, subkey=board_b.subkey(bob), value=older, expiration_time=expires)
    # bob's own record, right shape: accepted
    assert b.store(board_b.key, subkey=board_b.subkey(bob), value=dict(forged, round=8), expiration_time=expires)

    peers = _read_until(board_a, lambda ps: {p.peer_id: p.round for p in ps}.get(bob) == 8)
    rounds = {p.peer_id: p.round for p in peers}
    assert rounds == {alice: 7, bob: 8}, rounds


@pytest.mark.swarm
def test_a_sharded_board_keeps_each_record_in_its_rounds_shard(members):
    a, b, board_a, board_b = members(shards=4)
    alice, bob = str(a.peer_id), str(b.peer_id)
    # rounds at which the two peers fall in different shards, then one where they share one
    apart = next(r for r in range(100) if board_a.shard(r, alice) != board_a.shard(r, bob))
    _stored(board_a, PeerProgress(alice, round=apart, steps=3, samples=96))
    _stored(board_b, PeerProgress(bob, round=apart, steps=1, samples=32))
    everyone = _read_until(board_b, lambda ps: len(ps) == 2, shard=None)
    assert {p.peer_id for p in everyone} == {alice, bob}
    # each peer reads only its own shard: the other's record is not in it
    assert [p.peer_id for p in board_b.read(shard=board_b.shard(apart, bob))] == [bob]
    assert [p.peer_id for p in board_a.read(shard=board_a.shard(apart, alice))] == [alice]

    together = next(r for r in range(apart + 1, 200) if board_a.shard(r, alice) == board_a.shard(r, bob))
    _stored(board_a, PeerProgress(alice, round=together, steps=0, samples=0))
    _stored(board_b, PeerProgress(bob, round=together, steps=0, samples=0))
    shared = _read_until(board_a, lambda ps: len(ps) == 2, shard=board_a.shard(together, alice))
    assert {p.peer_id: p.round for p in shared} == {alice: together, bob: together}
    # the newest record of each peer wins across shards (the older one waits out its TTL in its old shard)
    assert {p.peer_id: p.round for p in board_a.read_all()} == {alice: together, bob: together}

    # every shard's key is held to the schema and the members' check, not only the first
    key = board_b.keys[board_b.shard(together, bob)]
    forged = dict(round=1, steps=0, samples=0, phase="train", mid_round=False, time=float(get_dht_time()),
                  reducer=True, since=0.0, contributed=0, cred=board_b.admission.credential())
    expires = get_dht_time() + 60
    assert not b.store(key, subkey=board_b.subkey(bob), value=dict(forged, round=-1), expiration_time=expires)
    assert not b.store(key, subkey=board_b.subkey(bob), value=dict(forged, cred=b"not a credential"),
                       expiration_time=expires)
    assert not b.store(key, subkey=board_a.subkey(alice), value=forged, expiration_time=expires)
    assert b.store(key, subkey=board_b.subkey(bob), value=forged, expiration_time=expires)


@pytest.mark.swarm  # a dozen DHT processes: out of make test-fast
def test_every_record_is_read_back_from_a_dht_larger_than_the_search_beam(tmp_path):
    """Board reads and stores search only SEARCH_BEAM of a key's nearest peers (hivemind's default, 20, made every
    read visit most of a 32-node swarm): with more DHT peers than that, each peer's read still finds every record,
    stored from every peer, because reads and stores search the same nearest peers."""
    from cotrain.averaging.dht import SEARCH_BEAM

    count = SEARCH_BEAM + 4
    dhts = []
    try:
        dhts.append(start_dht(identity_path=str(tmp_path / "0.key")))
        first = [str(m) for m in dhts[0].get_visible_maddrs()]
        for i in range(1, count):
            dhts.append(start_dht(first, identity_path=str(tmp_path / f"{i}.key")))
        coordinator_key = new_private_key()
        boards = [member_board(d, tmp_path / f"{i}.rsa", coordinator_key) for i, d in enumerate(dhts)]
        ids = {str(d.peer_id) for d in dhts}
        for board, d in zip(boards, dhts):
            _stored(board, PeerProgress(str(d.peer_id), round=2, steps=1, samples=8))
        for board in boards:
            seen = _read_until(board, lambda ps: {p.peer_id for p in ps} == ids)
            assert {p.peer_id for p in seen} == ids, (len(seen), count)
    finally:
        for d in reversed(dhts):
            d.shutdown()


# ---- the DHT process's remembered verdicts (pure logic: validators counted, no DHT) ------------------------------
class CountingValidator:
    """A validator whose verdict is set by the test and whose calls are counted."""

    def __init__(self, verdict=True, priority=0):
        self.verdict, self._priority, self.calls = verdict, priority, 0

    def validate(self, record):
        self.calls += 1
        return self.verdict

    def sign_value(self, record):
        return record.value

    def strip_value(self, record):
        return record.value

    @property
    def priority(self):
        return self._priority

    def merge_with(self, other):
        return False


def make_record(value=b"v", expiration=100.0):
    from hivemind.dht.validation import DHTRecord

    return DHTRecord(key=b"k", subkey=b"s", value=value, expiration_time=expiration)


def remembered(*validators, **kwargs):
    from hivemind.dht.validation import CompositeValidator

    from cotrain.averaging.dht import RememberedVerdicts

    return RememberedVerdicts(CompositeValidator(validators), **kwargs)


def test_a_record_seen_again_is_not_validated_again_but_another_one_is():
    inner = CountingValidator()
    memo = remembered(inner)
    assert memo.validate(make_record()) and memo.validate(make_record())
    assert inner.calls == 1
    assert memo.validate(make_record(value=b"w")) and memo.validate(make_record(expiration=101.0))
    assert inner.calls == 3


def test_a_refused_record_stays_refused():
    inner = CountingValidator(verdict=False)
    memo = remembered(inner)
    assert not memo.validate(make_record()) and not memo.validate(make_record())
    assert inner.calls == 1


def test_new_validators_judge_every_record_again():
    # a newer revocation list reaches the DHT process as a validator added (merged): a record a revoked peer signed
    # must not pass on an old verdict
    memo = remembered(CountingValidator())
    assert memo.validate(make_record())
    memo.extend([CountingValidator(verdict=False)])
    assert not memo.validate(make_record())


def test_a_verdict_is_forgotten_after_max_age_and_beyond_size():
    now = [1000.0]
    inner = CountingValidator()
    memo = remembered(inner, size=2, max_age=10.0, clock=lambda: now[0])
    memo.validate(make_record())
    now[0] += 11.0
    memo.validate(make_record())
    assert inner.calls == 2  # too old: judged again
    memo.validate(make_record(value=b"a"))
    memo.validate(make_record(value=b"b"))  # the third verdict pushes out the oldest
    memo.validate(make_record())
    assert inner.calls == 5


def test_records_that_differ_anywhere_have_different_verdict_keys():
    from hivemind.dht.validation import DHTRecord

    from cotrain.averaging.dht import RememberedVerdicts

    base = DHTRecord(key=b"ab", subkey=b"c", value=b"v", expiration_time=1.0)
    others = [DHTRecord(key=b"a", subkey=b"bc", value=b"v", expiration_time=1.0),  # the same bytes run together
              DHTRecord(key=b"ab", subkey=b"c", value=b"w", expiration_time=1.0),
              DHTRecord(key=b"ab", subkey=b"c", value=b"v", expiration_time=1.5)]
    digests = {RememberedVerdicts.digest(r) for r in [base, *others]}
    assert len(digests) == 4
    assert RememberedVerdicts.digest(base) == RememberedVerdicts.digest(
        DHTRecord(key=b"ab", subkey=b"c", value=b"v", expiration_time=1.0))

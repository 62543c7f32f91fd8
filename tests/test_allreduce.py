"""The butterfly all-reduce between real peers: hivemind DHTs and libp2p daemons on 127.0.0.1, in one process."""

import pytest
import torch

from cotrain.averaging import AllReduceFailed, butterfly_allreduce
from cotrain.compression import Int4Blockwise, Int8Blockwise, NoCompression
from hivemind.utils.crypto import RSAPrivateKey

from cotrain.verification.witness import PartSigning, part_digest, part_signed
from tiny_swarm import exchanges, run_peers

pytestmark = pytest.mark.swarm


@pytest.fixture(scope="module")
def peers(tmp_path_factory):
    """Three peers, each with its own DHT."""
    with exchanges(tmp_path_factory.mktemp("keys"), "test_exchange") as three:
        yield three


def run_all(exchanges, tag, vectors, weights, codec, timeout, skip=(), reducers=None, min_part_values=0,
            signing=None):
    group = sorted((e.peer_id for e in exchanges), key=str)
    results = [None] * len(exchanges)

    def one(i):
        try:
            results[i] = butterfly_allreduce(exchanges[i], tag, group, exchanges[i].peer_id, vectors[i], weights[i],
                                             codec, timeout, reducers=reducers, min_part_values=min_part_values,
                                             signing=signing and signing[i])
        except AllReduceFailed as e:
            results[i] = e

    run_peers(len(exchanges), one, timeout + 30, skip)
    return results


def test_every_peer_gets_the_same_weighted_mean(peers):
    torch.manual_seed(0)
    weights = [1.0, 2.0, 3.0]
    common = torch.randn(10_001)  # pseudo-gradients of one round point about one way, longer for more work
    vectors = [w ** 0.5 * (common + 0.5 * torch.randn(10_001)) for w in weights]
    results = run_all(peers, "t-exact", vectors, weights, NoCompression(), timeout=20)
    expected = sum(w * v for w, v in zip(weights, vectors)) / sum(weights)
    names = [str(e.peer_id) for e in peers]
    for r in results:
        assert r.complete and r.contributors == [3, 3, 3]
        assert r.credits == dict(zip(names, weights))  # each part's reducer credited every claim
        assert torch.equal(r.average, results[0].average)  # bitwise identical on every peer
        assert torch.allclose(r.average, expected, atol=1e-5)


def signings(peers, round_number, impostor=None):
    """Each peer's signing of a round's parts; ``impostor``: the index of a peer that signs with a key other than
    the one its credential names."""
    names = [str(e.peer_id) for e in peers]
    keys = {name: RSAPrivateKey() for name in names}
    public = {name: key.get_public_key().to_bytes() for name, key in keys.items()}
    return [PartSigning("run", round_number, name, RSAPrivateKey() if i == impostor else keys[name], public.get)
            for i, name in enumerate(names)], public


def test_each_reducer_witnesses_the_very_values_each_member_signed_and_sent(peers):
    torch.manual_seed(2)
    vectors = [torch.randn(20_000) for _ in peers]
    signing, public = signings(peers, 7)
    results = run_all(peers, "t-witness", vectors, [1.0, 1.0, 1.0], Int8Blockwise(256), timeout=20, signing=signing)
    names = [str(e.peer_id) for e in peers]
    for reducer, r in zip(names, results):
        assert r.complete and r.dropped == {}
        assert {part.member for part in r.seen} == set(names) - {reducer}  # every groupmate's part, not its own
        for part in r.seen:
            sent = results[names.index(part.member)].sent
            assert part.digest == part_digest(sent[part.start:part.end]) and part.contribution == part_digest(sent)
            assert part.round == 7 and part_signed(public[part.member], "run", part)
    for i, member in enumerate(names):  # the others witnessed the whole contribution but the part it reduced itself
        (own,) = {(p.start, p.end) for p in results[i].seen}
        covered = [(p.start, p.end) for r in results for p in r.seen if p.member == member]
        assert own not in covered and sum(b - a for a, b in covered) + own[1] - own[0] == 20_000
    untouched = run_all(peers, "t-no-witness", vectors, [1.0, 1.0, 1.0], Int8Blockwise(256), timeout=20)
    assert all(r.seen == [] for r in untouched)  # off unless asked


def test_a_part_not_signed_by_its_members_record_key_is_left_out(peers):
    torch.manual_seed(3)
    vectors = [torch.randn(20_000) for _ in peers]
    signing, _ = signings(peers, 8, impostor=2)
    results = run_all(peers, "t-impostor", vectors, [1.0, 1.0, 1.0], Int8Blockwise(256), timeout=20, signing=signing)
    impostor = str(peers[2].peer_id)
    for r in results[:2]:  # the honest reducers left its parts out, and say why
        assert impostor in r.dropped and not r.complete
        assert all(part.member != impostor for part in r.seen)


@pytest.mark.parametrize("codec, bytes_per_value, max_error", [(Int8Blockwise(256), 1.0, 0.1),
                                                                (Int4Blockwise(256), 0.5, 1.0)],
                         ids=["int8", "int4"])
def test_compressed_average_is_identical_everywhere_and_bytes_are_counted(peers, codec, bytes_per_value, max_error):
    torch.manual_seed(1)
    vectors = [torch.randn(30_000) for _ in peers]
    before = [(e.bytes_sent, e.bytes_received) for e in peers]
    results = run_all(peers, f"t-{codec.name}", vectors, [1.0, 1.0, 1.0], codec, timeout=20)
    for r in results:
        assert torch.equal(r.average, results[0].average)
    mean = sum(vectors) / 3
    assert (results[0].average - mean).abs().max() < max_error
    encoded = 30_000 * bytes_per_value
    for e, (sent, received) in zip(peers, before):
        # each peer sends 2 (n-1)/n of its encoded vector (~30 KB int8, ~15 KB int4) plus small headers
        assert 1.17 * encoded < e.bytes_sent - sent < 1.5 * encoded
        assert 1.17 * encoded < e.bytes_received - received < 1.5 * encoded


def test_a_vanished_peer_does_not_hold_the_others_past_the_timeout(peers):
    vectors = [torch.ones(3000) * i for i in range(3)]
    results = run_all(peers, "t-vanish", vectors, [1.0, 1.0, 1.0], NoCompression(), timeout=3, skip=(2,))
    assert all(isinstance(r, AllReduceFailed) for r in results[:2]), results
    assert results[2] is None


def test_peers_nobody_can_dial_reduce_no_part_and_still_average(peers):
    """Two peers behind NAT and one public: only the public one reduces, so the two never fetch from each other."""
    torch.manual_seed(2)
    group = sorted((e.peer_id for e in peers), key=str)
    public = [str(p) == str(group[1]) for p in group]  # only the middle peer of the group can be dialled
    vectors = [torch.randn(5_000) for _ in peers]
    before = [e.bytes_sent for e in peers]
    results = run_all(peers, "t-nat", vectors, [1.0, 1.0, 1.0], NoCompression(), timeout=20, reducers=public)
    expected = sum(vectors) / 3
    for r in results:
        assert r.complete and torch.equal(r.average, results[0].average)
        assert torch.allclose(r.average, expected, atol=1e-5)
    sent = {str(e.peer_id): e.bytes_sent - b for e, b in zip(peers, before)}
    reducer = str(group[1])
    # the reducer sends the whole average to the two others; each of them sends only its contribution
    assert sent[reducer] > 2 * 5_000 * 4
    assert all(5_000 * 4 <= v < 1.1 * 5_000 * 4 for k, v in sent.items() if k != reducer), sent


@pytest.mark.parametrize("min_part_values, reducers", [(4_000, 2), (20_000, 1)])
def test_a_small_vector_is_reduced_by_fewer_peers(peers, min_part_values, reducers):
    torch.manual_seed(3)
    numel = 10_001
    common = torch.randn(numel)
    vectors = [w ** 0.5 * (common + 0.5 * torch.randn(numel)) for w in (1.0, 2.0, 1.0)]  # as their work shows
    tag = f"t-few-{reducers}"
    before = [(e.bytes_sent, e.served["unary"] + e.served["stream"]) for e in peers]
    results = run_all(peers, tag, vectors, [1.0, 2.0, 1.0], NoCompression(), timeout=20,
                      min_part_values=min_part_values)
    expected = (vectors[0] + 2 * vectors[1] + vectors[2]) / 4
    for r in results:
        assert r.complete and torch.equal(r.average, results[0].average)
        assert torch.allclose(r.average, expected, atol=1e-5)
    served = [e.served["unary"] + e.served["stream"] - b for e, (_, b) in zip(peers, before)]
    # a reducer serves its result to the 2 others and its contribution to the other reducers; a peer that reduces
    # nothing serves its contribution to every reducer
    assert sorted(served) == sorted([reducers + 1] * reducers + [reducers] * (3 - reducers)), served

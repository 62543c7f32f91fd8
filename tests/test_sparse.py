"""The sparse codec (chunked top-k, Rice-coded indices, 2-bit values) and the sparse all-gather between real peers."""

import struct

import numpy as np
import pytest
import torch

from cotrain.averaging.allgather import sparse_aggregate, sparse_allgather
from cotrain.compression import SparseLowBit
from cotrain.compression.sparse import _HEADER
from cotrain.config import ConfigError, RunConfig
from tiny_swarm import exchanges, run_peers

SIZES = [4 * 64 * 96, 4 * 64, 10_000, 7]  # a matrix, a bias, a tensor with a short last chunk, a tiny one


def vector(seed=0, sizes=SIZES):
    return torch.randn(sum(sizes), generator=torch.Generator().manual_seed(seed))


def test_keeps_the_largest_of_every_chunk_and_stays_within_its_bound():
    codec = SparseLowBit(SIZES, chunk=1024, topk=16, bits=2)
    x = vector()
    positions, values = codec.decode_sparse(codec.encode(x), x.numel())
    lay = codec.layout(x.numel())
    assert positions.size == lay.kept == int(lay.keep.sum())
    # per chunk: exactly its quota, and nothing dropped is larger than what was kept
    kept = np.zeros(x.numel(), dtype=bool)
    kept[positions] = True
    mag = x.abs().numpy()
    for start, length, keep in zip(lay.starts, lay.lengths, lay.keep):
        chunk_kept = kept[start: start + length]
        assert chunk_kept.sum() == keep
        if keep < length:
            assert mag[start: start + length][chunk_kept].min() >= mag[start: start + length][~chunk_kept].max()
    decoded = codec.decode(codec.encode(x), x.numel())
    assert (decoded - x).abs().max() <= codec.error_bound(x)
    # signs survive 2 bits, and each tensor's values come from a table of 4
    assert (np.sign(decoded.numpy()[positions]) == np.sign(x.numpy()[positions])).mean() > 0.99
    for start, size in zip(np.cumsum([0] + SIZES[:-1]), SIZES):
        inside = (positions >= start) & (positions < start + size)
        assert len(np.unique(values[inside])) <= 4


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_bits_per_parameter_on_the_wire(bits):
    """64 of 4096 with Rice-coded gaps: ~7.6 bits an index, so ~0.15 bits a parameter at 2 bits (SparseLoCo's
    12-bit indices: 0.22); every extra value bit costs 1/64."""
    sizes = [2048 * 576, 2048 * 512, 2048, 256 * 512]
    codec = SparseLowBit(sizes, bits=bits)
    x = vector(1, sizes)
    payload = codec.encode(x)
    bits_per_param = 8 * len(payload) / x.numel()
    assert bits_per_param <= 0.14 + bits / 64
    assert len(payload) <= codec.payload_bytes_bound(x.numel())
    more_bits = codec.decode(payload, x.numel())
    assert (more_bits - x).abs().max() <= codec.error_bound(x)


def test_error_feedback_sends_everything_eventually():
    """What a round did not send stays in the buffer: over rounds, the sum sent approaches the sum offered."""
    codec = SparseLowBit([20_000], chunk=1000, topk=20)
    update = vector(2, [20_000]) * 0.01
    error = torch.zeros_like(update)
    sent_total = torch.zeros_like(update)
    rounds = 200
    for _ in range(rounds):
        flat = update + error
        sent = codec.decode(codec.encode(flat), flat.numel())
        error = flat - sent
        sent_total += sent
    # without feedback about 2% of it would ever be sent (the same largest values every round); with it, all but
    # what waits in the buffer (a value waits until it is among its chunk's largest: tens of rounds here)
    assert torch.allclose(sent_total + error, rounds * update, atol=1e-3)
    assert (sent_total - rounds * update).norm() < 0.2 * (rounds * update).norm()
    assert (sent_total != 0).float().mean() > 0.8  # 2% a round, yet most values went out at least once


def test_malformed_payloads_are_refused_with_a_reason():
    codec = SparseLowBit(SIZES, chunk=1024, topk=16)
    x = vector(3)
    good = codec.encode(x)
    n = x.numel()
    bad = {
        "truncated header": good[:5],
        "not a version": b"XX" + good[2:],
        "this swarm uses": SparseLowBit(SIZES, chunk=1024, topk=8).encode(x),
        "expected": good + b"\0",
        "truncated tables": good[:_HEADER.size + 3],
    }
    for reason, payload in bad.items():
        with pytest.raises(ValueError, match=reason):
            codec.decode_sparse(payload, n)
    nan = bytearray(good)
    nan[_HEADER.size: _HEADER.size + 4] = struct.pack("<f", float("nan"))
    with pytest.raises(ValueError, match="non-finite"):
        codec.decode_sparse(bytes(nan), n)
    # where the Rice parameters (4 bits a chunk) and the unary stream lie
    lay = codec.layout(n)
    rice_at = _HEADER.size + 4 * 4 * len(SIZES)
    rice_len = (4 * len(lay.starts) + 7) // 8
    fields = np.unpackbits(np.frombuffer(good, dtype=np.uint8, count=rice_len, offset=rice_at))[: 4 * len(lay.starts)]
    rice = fields.reshape(-1, 4) @ np.array([8, 4, 2, 1])
    (unary_len,) = struct.unpack_from("<I", good, rice_at + rice_len)
    # a unary stream that claims more than any payload can hold is refused before it is read
    huge = bytearray(good)
    struct.pack_into("<I", huge, rice_at + rice_len, 1 << 30)
    with pytest.raises(ValueError, match="unary stream"):
        codec.decode_sparse(bytes(huge), n)
    # a quotient stream with one zero bit turned to one: fewer quotients than indices
    offset = rice_at + rice_len + 4
    stream = np.unpackbits(np.frombuffer(good, dtype=np.uint8, count=unary_len, offset=offset))
    flipped = stream.copy()
    flipped[np.flatnonzero(stream == 0)[0]] = 1
    broken = good[:offset] + np.packbits(flipped).tobytes() + good[offset + unary_len:]
    with pytest.raises(ValueError, match="quotients"):
        codec.decode_sparse(broken, n)
    # gaps too large for the chunk: remainders all ones
    rem_start = offset + unary_len
    rem_len = (int((lay.keep * rice).sum()) + 7) // 8
    wide = good[:rem_start] + b"\xff" * rem_len + good[rem_start + rem_len:]
    with pytest.raises(ValueError, match="beyond its chunk"):
        codec.decode_sparse(wide, n)


def test_each_position_is_averaged_over_the_peers_that_sent_it():
    a = (np.array([0, 2]), np.array([1.0, 4.0], dtype=np.float32))
    b = (np.array([2, 3]), np.array([2.0, -6.0], dtype=np.float32))
    out = sparse_aggregate([a, b], [1.0, 3.0], 5).numpy()
    assert out.tolist() == [1.0, 0.0, (4.0 + 3 * 2.0) / 4, -6.0, 0.0]


def test_clipped_mean_bounds_a_blown_up_contribution():
    honest = [(np.arange(4), np.full(4, v, dtype=np.float32)) for v in (1.0, 1.1, 0.9)]
    huge = (np.arange(4), np.full(4, 1000.0, dtype=np.float32))
    plain = sparse_aggregate(honest + [huge], [1.0] * 4, 4, "mean").numpy()
    clipped = sparse_aggregate(honest + [huge], [1.0] * 4, 4, "clipped_mean", clip_multiple=2.0).numpy()
    assert plain[0] > 200
    assert clipped.max() <= (1.0 + 1.1 + 0.9 + 2 * 1.0) / 4 + 1e-6  # the huge one counts as 2x the median norm
    with pytest.raises(ValueError, match="averaging.aggregation"):
        sparse_aggregate(honest, [1.0] * 3, 4, "centered_clip")


def test_config_names_the_field():
    with pytest.raises(ConfigError, match="averaging.aggregation"):
        RunConfig.from_dict({"compression": {"kind": "sparse"}})
    with pytest.raises(ConfigError, match="sparse_topk"):
        RunConfig.from_dict({"compression": {"kind": "sparse", "sparse_chunk": 64, "sparse_topk": 65},
                             "averaging": {"aggregation": "mean"}})
    with pytest.raises(ConfigError, match="outer"):
        RunConfig.from_dict({"averaging": {"outer": "adam"}})
    cfg = RunConfig.from_dict({"compression": {"kind": "sparse"},
                               "averaging": {"aggregation": "clipped_mean", "outer": "error_feedback"}})
    assert cfg.compression.sparse_bits == 2 and cfg.averaging.error_decay == 0.95


# ---- between real peers ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def peers(tmp_path_factory):
    with exchanges(tmp_path_factory.mktemp("keys"), "test_sparse") as three:
        yield three


def gather_all(exchanges, tag, vectors, weights, codec, timeout=20, reducers=None, skip=(), aggregation="mean"):
    group = sorted((e.peer_id for e in exchanges), key=str)
    results = [None] * len(exchanges)

    def one(i):
        results[i] = sparse_allgather(exchanges[i], tag, group, exchanges[i].peer_id, vectors[i], weights[i], codec,
                                      timeout, aggregation, 2.0, reducers)

    run_peers(len(exchanges), one, timeout + 30, skip)
    return results


@pytest.mark.swarm
def test_every_peer_ends_with_the_same_average_and_the_bytes_are_counted(peers):
    sizes = [64 * 1024, 4096, 300]
    codec = SparseLowBit(sizes, chunk=1024, topk=16)
    vectors = [vector(10 + i, sizes) for i in range(3)]
    weights = [1.0, 2.0, 1.0]
    before = [e.bytes_sent for e in peers]
    results = gather_all(peers, "s-same", vectors, weights, codec)
    group = sorted((str(e.peer_id) for e in peers))
    order = [group.index(str(e.peer_id)) for e in peers]
    for r in results:
        assert r.complete and torch.equal(r.average, results[0].average)  # bitwise identical on every peer
    # the same as averaging the decoded payloads in the group's order, each position over its senders
    supports = [None] * 3
    for i, v in enumerate(vectors):
        supports[order[i]] = (codec.decode_sparse(codec.encode(v), v.numel()), weights[i])
    expected = sparse_aggregate([s for s, _ in supports], [w for _, w in supports], vectors[0].numel())
    assert torch.equal(results[0].average, expected)
    for i, r in enumerate(results):
        assert torch.equal(r.sent, codec.decode(codec.encode(vectors[i]), vectors[i].numel()))
    # each peer served its payload (and its weight) to each of the two others: nothing else
    payload = len(codec.encode(vectors[0])) + 8
    for e, b in zip(peers, before):
        assert 2 * payload * 0.98 <= e.bytes_sent - b <= 2 * payload * 1.02


@pytest.mark.swarm
def test_a_malformed_payload_is_dropped_and_named(peers):
    """A member that publishes garbage under its key is left out by everyone, who still agree."""
    codec = SparseLowBit([8192], chunk=1024, topk=16)
    group = sorted((e.peer_id for e in peers), key=str)
    rogue = peers[2]
    tag = "s-rogue"
    rogue.publish(tag, f"{tag}/in/{rogue.peer_id}", struct.pack("<d", 1.0) + b"SP\x01\x02garbage")
    vectors = [vector(20 + i, [8192]) for i in range(2)]
    results = [None, None]

    def one(i):
        results[i] = sparse_allgather(peers[i], tag, group, peers[i].peer_id, vectors[i], 1.0, codec, 10)

    run_peers(2, one, 40)
    for r in results:
        assert not r.complete and r.contributors == [2, 2, 2]
        assert "malformed" in r.dropped[str(rogue.peer_id)]
        assert torch.equal(r.average, results[0].average)


@pytest.mark.swarm
def test_peers_nobody_can_dial_get_each_others_payloads_through_the_relay(peers):
    codec = SparseLowBit([30_000], chunk=1000, topk=10)
    group = sorted((e.peer_id for e in peers), key=str)
    public = [str(p) == str(group[1]) for p in group]  # only the middle peer of the group can be dialled
    vectors = [vector(30 + i, [30_000]) for i in range(3)]
    before = {str(e.peer_id): e.bytes_sent for e in peers}
    results = gather_all(peers, "s-nat", vectors, [1.0, 1.0, 1.0], codec, reducers=public)
    for r in results:
        assert r.complete and torch.equal(r.average, results[0].average)
    payload = len(codec.encode(vectors[0])) + 8
    sent = {str(e.peer_id): e.bytes_sent - before[str(e.peer_id)] for e in peers}
    relay = str(group[1])
    # an undialable peer serves its payload once (to the relay); the relay serves its own twice and relays two
    assert all(0.98 * payload <= v <= 1.02 * payload for k, v in sent.items() if k != relay), sent
    assert 3.9 * payload <= sent[relay] <= 4.1 * payload, sent

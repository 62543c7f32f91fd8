import math

import numpy as np
import pytest
import torch

from cotrain.compression import Float16, Int4Blockwise, Int8Blockwise, NoCompression, PowerSGD, TopK, make_codec

CODECS = [NoCompression(), Float16(), Int8Blockwise(64), Int4Blockwise(64), TopK(0.05, 64)]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@pytest.mark.parametrize("numel", [1, 63, 64, 1000, 4097])
def test_round_trip_within_documented_bound(codec, numel):
    torch.manual_seed(numel)
    x = torch.randn(numel) * torch.logspace(-3, 1, numel)
    data = codec.encode(x)
    y = codec.decode(data, numel)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert (y - x).abs().max().item() <= codec.error_bound(x) + 1e-12


def test_sizes_on_the_wire():
    x = torch.randn(10_000)
    assert len(NoCompression().encode(x)) == 40_000
    assert len(Float16().encode(x)) == 20_000
    assert len(Int8Blockwise(256).encode(x)) == 10_000 + 4 * math.ceil(10_000 / 256)
    assert len(Int4Blockwise(256).encode(x)) == 5_000 + 4 * math.ceil(10_000 / 256)
    assert len(Int4Blockwise(256).encode(x[:9_999])) == 5_000 + 4 * math.ceil(9_999 / 256)
    assert len(TopK(0.01, 256).encode(x)) == 4 + 100 * 4 + 100 + 4


def test_topk_keeps_the_largest_and_result_keeps_every_nonzero():
    x = torch.zeros(1000)
    x[[3, 500, 999]] = torch.tensor([5.0, -7.0, 6.0])
    codec = TopK(0.002, 64)  # k = 2
    y = codec.decode(codec.encode(x), 1000)
    assert set(torch.nonzero(y).flatten().tolist()) == {500, 999}
    z = codec.decode_result(codec.encode_result(x), 1000)
    assert set(torch.nonzero(z).flatten().tolist()) == {3, 500, 999}


def test_fp16_sends_ieee_half_precision_little_endian_subnormals_and_clipping_included():
    # numpy's cast as the reference: what every peer decodes must not depend on which library cast it
    x = torch.cat([torch.randn(3000) * scale for scale in (1e-7, 1e-5, 1.0, 1e4)]
                  + [torch.tensor([0.0, -0.0, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 65519.0, 65520.0, -1e6,
                                   float("inf"), -float("inf")])])
    data = Float16().encode(x)
    expected = np.clip(x.numpy(), -65504, 65504).astype("<f2")
    assert data == expected.tobytes()
    decoded = Float16().decode(data, x.numel())
    assert decoded.dtype == torch.float32
    assert torch.equal(decoded, torch.from_numpy(expected.astype(np.float32)))
    assert torch.isnan(Float16().decode(Float16().encode(torch.tensor([float("nan")])), 1)).all()


def test_int4_uses_every_code_and_keeps_signs():
    x = torch.linspace(-7, 7, 15)  # one block whose absmax is 7: the codes are the values themselves
    y = Int4Blockwise(64).decode(Int4Blockwise(64).encode(x), 15)
    assert torch.equal(y, x)


@pytest.mark.parametrize("codec", [Int8Blockwise(64), Int4Blockwise(64), TopK(0.02, 64)], ids=lambda c: c.name)
def test_error_feedback_carries_what_was_dropped(codec):
    torch.manual_seed(0)
    inputs = [torch.randn(500) for _ in range(30)]
    error = torch.zeros(500)
    sent_total = torch.zeros(500)
    for x in inputs:
        corrected = x + error
        sent = codec.decode(codec.encode(corrected), 500)
        error = corrected - sent
        sent_total += sent
    # what was sent over all rounds is what was meant, up to the one residual still held back
    assert torch.allclose(sent_total + error, sum(inputs), atol=1e-4)
    assert error.abs().max() < sum(inputs).abs().max()


def test_decode_rejects_malformed_payloads():
    with pytest.raises(ValueError):
        Int8Blockwise(64).decode(b"\0" * 10, 100)
    with pytest.raises(ValueError):
        TopK(0.1).decode(b"\xff\xff\xff\xff", 10)
    with pytest.raises(ValueError, match="int4: a code outside"):
        Int4Blockwise(64).decode(b"\0\0\x80\x3f" + b"\0" * 5, 10)  # code 0 - 8 = -8 is never sent
    with pytest.raises(ValueError, match="compression.kind"):
        make_codec("zip")


def _powersgd_round(peers, deltas_per_peer):
    """One PowerSGD round of several simulated peers whose all-reduce is an exact mean."""
    known = {}
    for phase in ("p", "q"):
        known[phase] = torch.stack([_probe(c, d, phase, known) for c, d in zip(peers, deltas_per_peer)]).mean(0)
    return [c.reduce(d, lambda vector, phase: known[phase]) for c, d in zip(peers, deltas_per_peer)]


def _probe(compressor, deltas, phase, known):
    """The vector this peer would send in ``phase``, given the averages of earlier phases."""
    import copy

    probe = copy.deepcopy(compressor)
    captured = {}

    class Stop(Exception):
        pass

    def fake(vector, ph):
        if ph == phase:
            captured["v"] = vector
            raise Stop
        return known[ph]

    try:
        probe.reduce(deltas, fake)
    except Stop:
        pass
    return captured["v"]


def test_powersgd_recovers_a_low_rank_update_shared_by_peers():
    torch.manual_seed(0)
    u, v = torch.randn(40, 2), torch.randn(2, 30)
    shapes = [torch.Size([40, 30]), torch.Size([30])]
    peers = [PowerSGD(shapes, rank=2, seed=7) for _ in range(3)]
    deltas = [[u @ v * (1 + 0.1 * i), torch.full((30,), float(i))] for i in range(3)]
    mean_matrix = sum(d[0] for d in deltas) / 3
    for _ in range(3):  # a few rounds of power iteration with warm-started Q
        outs = _powersgd_round(peers, [[mean_matrix.clone(), d[1]] for d in deltas])
    assert all(torch.equal(outs[0][0], o[0]) for o in outs)  # every peer applies the same update
    assert torch.allclose(outs[0][0], mean_matrix, atol=1e-3)
    assert torch.allclose(outs[0][1], torch.full((30,), 1.0))  # vectors are averaged exactly
    p_values, q_values = peers[0].payload_values()
    assert p_values + q_values < 40 * 30 + 30  # fewer values on the wire than the update has


def test_powersgd_keeps_the_error_for_the_next_round():
    torch.manual_seed(1)
    shapes = [torch.Size([20, 20])]
    peer = PowerSGD(shapes, rank=1, seed=0)
    full_rank = torch.randn(20, 20)
    out = peer.reduce([full_rank], lambda vector, phase: vector)
    assert torch.allclose(out[0] + peer.error[0], full_rank, atol=1e-5)


def test_powersgd_error_decays_or_moves_out():
    """Under DiLoCo's outer error feedback the kept error is decayed before it is added (``decay``), or handed to
    the caller, who keeps it in the local model (``take_error``), and PowerSGD then keeps none."""
    torch.manual_seed(2)
    shapes = [torch.Size([20, 20]), torch.Size([20])]
    update = [torch.randn(20, 20), torch.randn(20)]
    peer = PowerSGD(shapes, rank=1, seed=0, decay=0.5)
    alone = lambda vector, phase: vector  # noqa: E731 - a group of one
    peer.reduce(update, alone)
    error = peer.error[0].clone()
    twin = PowerSGD(shapes, rank=1, seed=0, decay=1.0)
    twin.q[0].copy_(peer.q[0])
    # the second round of a decaying peer sees update + 0.5 x error, exactly what a plain one does given that
    assert torch.allclose(peer.reduce(update, alone)[0], twin.reduce([update[0] + 0.5 * error, update[1]], alone)[0],
                          atol=1e-5)
    taken = peer.take_error()
    assert [t.shape for t in taken] == shapes
    assert taken[0].abs().sum() > 0 and torch.equal(taken[1], torch.zeros(20))
    assert all(e.abs().sum() == 0 for e in peer.error)

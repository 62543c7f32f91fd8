"""Experts on a host over the data plane (two real hivemind DHTs and libp2p daemons on 127.0.0.1, in one process): a
trainer's mixture layer gets from a remote expert exactly what the same expert gives here, forward and backward;
the host trains its experts on the gradients it is sent; a stranger is refused; malformed calls are refused with the
field named; a host that is gone is left out and not asked again for a while."""

import copy

import pytest
import torch

from cotrain.averaging import Admission, start_dht
from cotrain.averaging.admission import new_private_key
from cotrain.moe.gating import expert_uid, grid_experts
from cotrain.moe.host import ExpertHost, RemoteExperts, encode_values
from cotrain.moe.mixture import FeedForward, LocalExperts, MixtureLayer
from cotrain.v1 import swarm_pb2 as pb

DIM, HIDDEN, GRID = 8, 16, (2, 2)


@pytest.fixture(scope="module")
def dhts(tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys")
    host = start_dht(identity_path=str(keys / "host.key"))
    trainer = start_dht([str(m) for m in host.get_visible_maddrs()], identity_path=str(keys / "trainer.key"))
    try:
        yield host, trainer
    finally:
        trainer.shutdown()
        host.shutdown()


@pytest.fixture
def served(dhts):
    """A host of the grid's 4 experts, its twins kept here, and a trainer's view of the host."""
    torch.manual_seed(0)
    local = LocalExperts(len(grid_experts(GRID)), DIM, HIDDEN)
    twins = copy.deepcopy(local)
    open_to_all = Admission("moe", None, enabled=False)
    uids = [expert_uid("ffn", cell) for cell in grid_experts(GRID)]
    host = ExpertHost(dhts[0], "moe", open_to_all, dict(zip(uids, local.experts)), DIM, lr=1e-2)
    remote = RemoteExperts(dhts[1], "moe", open_to_all, {i: (uid, host.peer_id) for i, uid in enumerate(uids)},
                           timeout_s=5.0)
    try:
        yield host, remote, twins, uids
    finally:
        remote.shutdown()
        host.shutdown()


def test_a_remote_expert_answers_as_the_same_expert_here_forward_and_backward(served):
    host, remote, twins, _ = served
    x = torch.randn(3, 4, DIM, requires_grad=True)
    x_here = x.detach().clone().requires_grad_(True)
    before = [p.detach().clone() for p in host.experts[next(iter(host.experts))].parameters()]
    out = remote({0: x})[0]
    here = twins.experts[0](x_here)
    torch.testing.assert_close(out, here)
    g = torch.randn_like(here)
    out.backward(g)
    here.backward(g)
    torch.testing.assert_close(x.grad, x_here.grad)
    assert host.calls == {"forward": 1, "backward": 1}
    after = list(host.experts[next(iter(host.experts))].parameters())
    assert any(not torch.equal(a, b) for a, b in zip(after, before))  # the host trained the expert on it


def test_rows_past_a_messages_bound_go_in_pieces_and_come_back_whole(served, monkeypatch):
    """The daemon takes messages of 4 MiB at most: a trainer's large batch for one expert is asked for in pieces, side
    by side, and its answer and gradient are the same expert's on all the rows."""
    from cotrain.moe import host as host_module

    host, remote, twins, _ = served
    monkeypatch.setattr(host_module, "PIECE_BYTES", 4 * (4 * 4 * DIM))  # 4 rows a forward piece, 2 a backward one
    x = torch.randn(7, 4, DIM, requires_grad=True)
    x_here = x.detach().clone().requires_grad_(True)
    out = remote({0: x})[0]
    here = twins.experts[0](x_here)
    torch.testing.assert_close(out, here)
    assert host.calls["forward"] == 2
    out.backward(torch.ones_like(out))
    here.backward(torch.ones_like(here))
    assert host.calls["backward"] == 4 and x.grad.shape == x.shape
    # each piece stepped the host's optimizer as it came: the piece computed first got the untouched expert's
    assert any(torch.allclose(x.grad[at:at + 2], x_here.grad[at:at + 2], atol=1e-6) for at in range(0, 7, 2))


def test_a_mixture_layer_trains_on_remote_experts(served):
    _, remote, _, _ = served
    torch.manual_seed(1)
    layer = MixtureLayer(DIM, GRID, k=2, k_min=1, chunk=4, experts=remote)
    opt = torch.optim.Adam(layer.parameters(), lr=1e-2)
    x, target = torch.randn(6, 8, DIM), torch.randn(6, 8, DIM)
    losses = []
    for _ in range(15):
        loss = torch.nn.functional.mse_loss(layer(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.95, losses
    assert remote.failed == {"forward": 0, "backward": 0}


def test_a_stranger_is_refused_and_gets_nothing(dhts):
    guarded = Admission("moe", new_private_key().public_key(), enabled=True)
    host = ExpertHost(dhts[0], "guarded", guarded, {"ffn.0": FeedForward(DIM, HIDDEN)}, DIM)
    stranger = RemoteExperts(dhts[1], "guarded", Admission("moe", None, enabled=False), {0: ("ffn.0", host.peer_id)})
    try:
        assert stranger({0: torch.randn(1, 2, DIM)}) == {0: None}
        assert host.refused == 1 and host.calls == {"forward": 0, "backward": 0}
        assert "credential" in stranger.refusals[0]
        assert stranger.available() == []  # not asked again for a while
    finally:
        stranger.shutdown()
        host.shutdown()


@pytest.mark.parametrize("call, field", [
    (dict(uid="ffn.9", shape=[1, 2, DIM]), "uid"),
    (dict(shape=[1, 2, DIM + 1]), "shape"),
    (dict(shape=[1, 2]), "shape"),
    (dict(shape=[1 << 10, 1 << 10, DIM]), "shape"),
    (dict(shape=[1, 3, DIM]), "inputs"),
    (dict(shape=[1, 2, DIM], backward=True), "grad_outputs"),
])
def test_malformed_calls_are_refused_naming_the_field(served, call, field):
    host, remote, _, uids = served
    request = pb.ExpertCall(uid=call.get("uid", uids[0]), shape=call["shape"], backward=call.get("backward", False),
                            inputs=encode_values(torch.zeros(1, 2, DIM)))
    answer = remote.run(remote.p2p.call_protobuf_handler(host.peer_id, host.handler_name, request, pb.ExpertAnswer),
                        timeout=30)
    assert answer.refused.startswith(field) and not answer.values, answer.refused
    nan = pb.ExpertCall(uid=uids[0], shape=[1, 2, DIM], inputs=encode_values(torch.full((1, 2, DIM), float("nan"))))
    answer = remote.run(remote.p2p.call_protobuf_handler(host.peer_id, host.handler_name, nan, pb.ExpertAnswer),
                        timeout=30)
    assert answer.refused == "inputs: non-finite values"


def test_a_host_that_is_gone_is_left_out_and_not_asked_again(served):
    host, remote, _, _ = served
    host.shutdown()
    remote.timeout_s = 1.0
    answers = remote({0: torch.randn(1, 2, DIM), 1: torch.randn(1, 2, DIM)})
    assert answers == {0: None, 1: None} and remote.failed["forward"] == 2
    assert set(remote.available()) == {2, 3}


class GarbageHost(ExpertHost):
    """A host that answers expert 0 with values of another shape and expert 1 with NaN."""

    def _answer(self, uid, x, grad):
        out = super()._answer(uid, x, grad)
        if uid.endswith(".0.0"):
            return out[:, :-1]
        if uid.endswith(".0.1"):
            return torch.full_like(out, float("nan"))
        return out


def test_a_host_that_answers_garbage_is_left_out_and_counted(dhts):
    torch.manual_seed(0)
    open_to_all = Admission("moe", None, enabled=False)
    uids = [expert_uid("ffn", cell) for cell in grid_experts(GRID)]
    host = GarbageHost(dhts[0], "garbage", open_to_all, {u: FeedForward(DIM, HIDDEN) for u in uids}, DIM)
    remote = RemoteExperts(dhts[1], "garbage", open_to_all, {i: (u, host.peer_id) for i, u in enumerate(uids)})
    try:
        answers = remote({i: torch.randn(2, 3, DIM) for i in range(4)})
        assert answers[0] is None and answers[1] is None  # skipped: the step mixes the others
        assert answers[2].shape == (2, 3, DIM) and answers[3].shape == (2, 3, DIM)
        assert remote.failed["forward"] == 2 and set(remote.available()) == {2, 3}
    finally:
        remote.shutdown()
        host.shutdown()


def test_a_byte_language_model_trains_with_its_experts_on_a_host(served):
    """The trainer's model (embedding, LSTM, gate, head) holds no expert: its parameters are what a swarm averages."""
    from cotrain.models.moe_lm import MixtureLM

    host, remote, _, _ = served
    torch.manual_seed(2)
    model = MixtureLM(embed_dim=8, hidden_size=DIM, grid=GRID, expert_hidden=HIDDEN, k=2, chunk=4, experts=[remote],
                      dropout=0.0)
    assert not any(p is q for p in model.parameters() for e in host.experts.values() for q in e.parameters())
    text = torch.tensor(list(b"the quick brown fox jumps over the lazy dog. " * 4)[:161], dtype=torch.long)
    x, y = text[:-1].view(4, -1), text[1:].view(4, -1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    losses = []
    for _ in range(20):
        logits, _ = model(x, None)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.8, losses
    assert host.calls["backward"] > 0 and remote.failed == {"forward": 0, "backward": 0}

"""A real coordinator and real nodes on 127.0.0.1, speaking gRPC and hivemind, training one model together."""

import signal

import pytest
import torch

from cotrain.checkpoint import load_checkpoint
from cotrain.data import Corpus
from cotrain.evaluation import evaluate_lm
from cotrain.launch import start_node, wait_for
from cotrain.models import build_model
from cotrain.v1 import coordinator_pb2 as pb

from cotrain.node.client import CoordinatorClient

pytestmark = pytest.mark.swarm

ROUNDS = 4


def val_loss(cfg, state=None):
    corpus = Corpus.from_source(cfg.data.source, cfg.data.max_bytes, cfg.data.val_fraction)
    torch.manual_seed(cfg.run.seed)
    model = build_model(cfg.model)
    if state is not None:
        model.load_state_dict(state)
    return evaluate_lm(model, corpus.read, corpus.val.start, corpus.val.end, cfg.data.seq_len).loss


def test_two_nodes_train_and_average_into_one_model(coordinator, tmp_path):
    nodes = [start_node(coordinator.address, coordinator.token, f"node-{i}", tmp_path / f"node-{i}",
                        extra=["--max-rounds", str(ROUNDS), "--threads", "1", "--wait-peers", "2"]) for i in range(2)]
    client = CoordinatorClient(coordinator.address, insecure=True)
    try:
        def both_joined():
            return sum(n.state == "healthy" for n in client.health().nodes) == 2

        wait_for(both_joined, 120, what="both nodes to join", procs=nodes + [coordinator.proc])
        for node in nodes:
            wait_for(lambda: not node.alive(), 300, interval=0.5, what=f"{node.name} to finish {ROUNDS} rounds")
        codes = [node.stop(30) for node in nodes]
        assert codes == [0, 0], [n.log()[-3000:] for n in nodes]
        health = client.health()
    finally:
        client.close()
        for node in nodes:
            node.stop(10)

    # both left cleanly and reported their work
    assert sorted(n.state for n in health.nodes) == ["left", "left"]
    assert all(n.metrics.round >= ROUNDS and n.metrics.rounds_completed >= 1 for n in health.nodes)

    finals = [load_checkpoint(tmp_path / f"node-{i}" / "last.safetensors") for i in range(2)]
    history = [dict(map(tuple, f.metadata["rounds"])) for f in finals]
    averaged = [r for r, size in history[0].items() if size == 2 and history[1].get(r) == 2]
    assert averaged, f"no round was averaged by both nodes: {history}"
    assert finals[0].round == finals[1].round == ROUNDS
    for name, tensor in finals[0].tensors.items():
        assert torch.allclose(tensor, finals[1].tensors[name], atol=1e-5), f"{name} differs between the nodes"

    cfg = coordinator.cfg
    assert val_loss(cfg, finals[0].model_state()) < val_loss(cfg) - 0.3


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_node_leaves_cleanly_on_signal(coordinator, tmp_path, sig):
    node = start_node(coordinator.address, coordinator.token, "quitter", tmp_path / "q", extra=["--threads", "1"])
    client = CoordinatorClient(coordinator.address, insecure=True)
    try:
        def training():
            rows = [n for n in client.health().nodes if n.node_name == "quitter"]
            return rows and rows[0].metrics.step > 0

        wait_for(training, 120, what="the node to train", procs=[node, coordinator.proc])
        node.signal(sig)
        wait_for(lambda: not node.alive(), 60, what="the node to exit")
        assert node.stop(10) == 0, node.log()[-3000:]
        states = {n.node_name: n.state for n in client.health().nodes}
    finally:
        client.close()
        node.stop(10)
    assert states["quitter"] == "left"
    assert "Traceback" not in node.log()

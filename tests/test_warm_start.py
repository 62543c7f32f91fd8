"""Warm starts: joining a running swarm, falling back to checkpoints, resuming, and shrink and perturb."""

import re
import subprocess
import sys

import pytest
import torch

from cotrain.checkpoint import load_checkpoint, save_checkpoint
from cotrain.exit_codes import ExitCode
from cotrain.cli.launch import start_node, wait_for
from cotrain.models import build_model
from cotrain.client import CoordinatorClient
from cotrain.warmstart import WarmStartError, fresh_parameters, shrink_perturb

from tiny_swarm import RunningCoordinator, tiny_config


def test_shrink_perturb_arithmetic():
    theta = {"w": torch.tensor([1.0, -2.0, 4.0]), "b": torch.tensor([0.5])}
    noise = {"w": torch.tensor([10.0, 0.0, -10.0]), "b": torch.tensor([2.0])}
    out = shrink_perturb(theta, noise, shrink=0.6, perturb=0.01)
    assert torch.allclose(out["w"], torch.tensor([0.7, -1.2, 2.3]))
    assert torch.allclose(out["b"], torch.tensor([0.32]))
    exact = shrink_perturb(theta, noise, shrink=1.0, perturb=0.0)
    assert all(torch.equal(exact[k], theta[k]) for k in theta)
    with pytest.raises(WarmStartError, match="w"):
        shrink_perturb(theta, {"w": torch.zeros(2), "b": torch.zeros(1)}, 0.6, 0.01)


def test_noise_comes_from_the_models_own_initializer(corpus_file):
    cfg = tiny_config(corpus_file)
    a = fresh_parameters(lambda: build_model(cfg), seed=5)
    b = fresh_parameters(lambda: build_model(cfg), seed=5)
    c = fresh_parameters(lambda: build_model(cfg), seed=6)
    torch.manual_seed(5)
    reference = dict(build_model(cfg).named_parameters())
    assert all(torch.equal(a[k], b[k]) and torch.equal(a[k], reference[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)




def logged_states(log: str) -> dict[int, set[str]]:
    """round -> the state hashes a node logged after finishing rounds."""
    out: dict[int, set[str]] = {}
    for r, h in re.findall(r"now at round (\d+) \(state ([0-9a-f]+)\)", log):
        out.setdefault(int(r), set()).add(h)
    return out


@pytest.mark.swarm
def test_third_node_holds_the_donors_state_before_its_first_step(coordinator, tmp_path):
    donors = [start_node(coordinator.address, coordinator.token, f"donor-{i}", tmp_path / f"d{i}",
                         extra=["--threads", "1", "--wait-peers", "2"]) for i in range(2)]
    client = CoordinatorClient(coordinator.address, insecure=True)
    joiner = None
    try:
        wait_for(lambda: client.health().totals.global_round >= 3, 180, what="the swarm to make progress",
                 procs=donors + [coordinator.proc])
        joiner = start_node(coordinator.address, coordinator.token, "joiner", tmp_path / "j",
                            extra=["--threads", "1", "--max-rounds", "0", "--max-steps", "3"])
        wait_for(lambda: not joiner.alive(), 120, what="the joiner to take three steps")
        log = joiner.log()
        took = re.search(r"took the shared state of round (\d+) \(state ([0-9a-f]+)\)", log)
        assert took, log[-3000:]
        round_, state = int(took.group(1)), took.group(2)
        assert round_ >= 3
        assert log.index(took.group(0)) < log.index("reached --max-steps")
        assert "downloaded the swarm's state" in log
    finally:
        for p in donors + ([joiner] if joiner else []):
            p.stop(30)
        client.close()
    donor_states = [logged_states(d.log()) for d in donors]
    assert any(state in s.get(round_, set()) for s in donor_states), (round_, state, donor_states)


@pytest.mark.swarm
def test_checkpoint_fallback_and_resume_with_the_same_identity(tmp_path, corpus_file):
    running = RunningCoordinator(tmp_path, tiny_config(corpus_file))
    client = CoordinatorClient(running.address, insecure=True)
    try:
        first = start_node(running.address, running.token, "solo", tmp_path / "solo", extra=["--threads", "1"])
        wait_for(lambda: client.health().totals.latest_checkpoint_round >= 2, 120, what="a checkpoint of round 2",
                 procs=[first, running.proc])
        assert first.stop(30) == 0
        last_round = max(logged_states(first.log()))
        node_id = client.health().nodes[0].node_id

        # the same identity comes back: same node id, and it resumes where it stopped instead of starting over
        again = start_node(running.address, running.token, "solo", tmp_path / "solo",
                           extra=["--threads", "1", "--max-steps", "2"])
        wait_for(lambda: not again.alive(), 120, what="the restarted node to finish")
        assert again.stop(10) == 0
        assert f"resumed from this node's last state at round {last_round}" in again.log(), again.log()[-3000:]
        assert [n.node_id for n in client.health().nodes] == [node_id]

        # a stranger with no state of its own and no peer takes the coordinator's checkpoint
        stranger = start_node(running.address, running.token, "stranger", tmp_path / "stranger",
                              extra=["--threads", "1", "--max-steps", "2"])
        wait_for(lambda: not stranger.alive(), 120, what="the stranger to start")
        assert stranger.stop(10) == 0
        took = re.search(r"resumed from the coordinator's checkpoint at round (\d+)", stranger.log())
        assert took and 2 <= int(took.group(1)) <= last_round, stranger.log()[-3000:]
    finally:
        client.close()
        running.stop()


@pytest.mark.swarm
def test_new_run_from_a_checkpoint_with_shrink_and_perturb(tmp_path, corpus_file):
    cfg = tiny_config(corpus_file)
    torch.manual_seed(0)
    old = build_model(cfg)
    names = [n for n, _ in old.named_parameters()]
    old_path = tmp_path / "old.safetensors"
    save_checkpoint(old_path, {f"model.{n}": p.detach() for n, p in old.named_parameters()},
                    {"run_id": "old-run", "round": 17, "config_toml": cfg.to_toml()})
    state = tmp_path / "state"
    from cotrain.coordinator.store import Store
    from cotrain.cli.launch import start_coordinator

    (tmp_path / "run.toml").write_text(cfg.to_toml())
    token = Store(state).create_token("t")
    proc, address = start_coordinator(state, tmp_path / "run.toml",
                                      extra=["--warm-start", str(old_path), "--shrink", "0.5", "--perturb", "0.0"])
    try:
        node = start_node(address, token, "n", tmp_path / "n", extra=["--threads", "1", "--max-steps", "1"])
        wait_for(lambda: not node.alive(), 120, what="the node to start")
        assert node.stop(10) == 0
        assert "resumed from the coordinator's checkpoint at round 0" in node.log()
    finally:
        proc.stop(30)
    round0 = load_checkpoint(state / "checkpoints" / "round-000000.safetensors")
    assert round0.metadata["warm_start"]["from_round"] == 17
    for n, p in old.named_parameters():
        assert torch.allclose(round0.tensors[f"model.{n}"], 0.5 * p.detach())
    assert names


def test_warm_start_from_a_missing_checkpoint_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "cotrain.cli", "coordinator", "start", "--insecure", "--state-dir",
                          str(tmp_path / "s"), "--warm-start", str(tmp_path / "nope.safetensors")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == ExitCode.CONFIG
    assert "nope.safetensors" in out.stderr and "Traceback" not in out.stderr

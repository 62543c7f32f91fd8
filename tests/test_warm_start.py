"""Warm starts: joining a running swarm, falling back to checkpoints, resuming, and shrink and perturb."""

import json
import subprocess
import sys

import pytest
import torch

from cotrain.checkpoint import load_checkpoint, save_checkpoint
from cotrain.exit_codes import ExitCode
from cotrain.cli.launch import start_node, wait_for
from cotrain.cli.local_swarm import Swarm
from cotrain.models import build_model, initial_seed
from cotrain.optim.schedule import Schedule, lr_factor
from cotrain.client import CoordinatorClient
from cotrain.warmstart import WarmStartError, fresh_parameters, shrink_perturb

from tiny_swarm import tiny_config


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
    with initial_seed(5):  # the model's own initializer, drawn from seed 5 instead of the run's seed
        reference = dict(build_model(cfg).named_parameters())
    assert all(torch.equal(a[k], b[k]) and torch.equal(a[k], reference[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)




def row(client, name):
    return {n.node_name: n for n in client.health().nodes}.get(name)


@pytest.fixture
def decaying(tmp_path, corpus_file, node_zygote):
    """A coordinator whose run's lr falls with the swarm's samples from the first ones on (inverse sqrt after 64)."""
    cfg = tiny_config(corpus_file, schedule={"kind": "inverse_sqrt", "warmup_samples": 0, "timescale_samples": 64})
    with Swarm(cfg, tmp_path, zygote=node_zygote) as running:
        yield running


@pytest.mark.swarm
def test_third_node_holds_the_donors_state_before_its_first_step(decaying, tmp_path):
    coordinator = decaying
    donors = [coordinator.start_node(f"donor-{i}", extra=["--threads", "1", "--wait-peers", "2"],
                                     state_dir=tmp_path / f"d{i}") for i in range(2)]
    client = CoordinatorClient(coordinator.address, insecure=True)
    joiner = None
    try:
        wait_for(lambda: client.health().totals.global_round >= 3, 180, what="the swarm to make progress",
                 procs=donors + [coordinator.proc])
        joiner = coordinator.start_node("joiner", extra=["--threads", "1", "--max-rounds", "0", "--max-steps", "3"],
                                        state_dir=tmp_path / "j")
        wait_for(lambda: not joiner.alive(), 120, what="the joiner to take three steps")
        assert joiner.stop(10) == 0, joiner.log()[-3000:]
        left = row(client, "joiner")
        donor_status = json.loads((tmp_path / "d0" / "status.json").read_text())
    finally:
        for p in donors + ([joiner] if joiner else []):
            p.stop(30)
        client.close()
    # it left with the shared state of a round the swarm had reached, which it downloaded from a donor, not from the
    # coordinator's checkpoint; a round it averaged in (its 3 steps may join the donors' round as it closes) came
    # after that state, never from round 0
    took = load_checkpoint(tmp_path / "j" / "last.safetensors")
    assert took.round >= 3 and all(r >= 3 for r, _ in took.metadata["rounds"]), took.metadata
    assert left.state == "left" and left.metrics.step == 3, left
    assert left.metrics.state_bytes_received > 0, left.metrics
    # its lr is the run's schedule at the swarm's samples, as the veterans' is: not the peak, where its own three
    # steps would put it (by round 3 the swarm's samples took the lr well below it)
    status = json.loads((tmp_path / "j" / "status.json").read_text())
    schedule, peak = Schedule.from_config(coordinator.cfg), coordinator.cfg.optimizer.lr
    assert peak * lr_factor(schedule, 2 * coordinator.cfg.data.batch_size) == peak  # its own steps' lr
    assert status["lr"] < 0.6 * peak, status
    # each step's lr is the schedule where the round's clock stood (lr_samples): from the swarm's count in the state
    # it took, never below it (the clock starts at the count and moves at the round before's pace)
    for s in (status, donor_status):
        assert s["lr"] == pytest.approx(peak * lr_factor(schedule, s["lr_samples"]), rel=1e-9), s
    assert status["lr_samples"] >= 3 * 10 * coordinator.cfg.data.batch_size, status  # three rounds the swarm made
    # the veterans' lr is the same schedule at the same swarm: each status.json holds the lr of its node's last step,
    # which may lag the other's by a round's samples either way, never by the joiner's own-steps peak
    assert 0.6 < donor_status["lr"] / status["lr"] < 1 / 0.6, (status, donor_status)
    # the donors kept their own last state: the joiner's is a state of the same run that moved on from initial
    # weights as theirs did (a missing signal: nodes record no state hash per round, so the very round cannot be
    # compared)
    donor = load_checkpoint(tmp_path / "d0" / "last.safetensors")
    assert took.metadata["run_id"] == donor.metadata["run_id"] and donor.round >= took.round


@pytest.mark.swarm
def test_checkpoint_fallback_and_resume_with_the_same_identity(tmp_path, corpus_file, node_zygote):
    running = Swarm(tiny_config(corpus_file), tmp_path, zygote=node_zygote).start()
    client = CoordinatorClient(running.address, insecure=True)
    try:
        first = running.start_node("solo", extra=["--threads", "1"])
        wait_for(lambda: client.health().totals.latest_checkpoint_round >= 2, 120, what="a checkpoint of round 2",
                 procs=[first, running.proc])
        assert first.stop(30) == 0
        stopped = load_checkpoint(tmp_path / "solo" / "last.safetensors")
        node_id = client.health().nodes[0].node_id

        # the same identity comes back: same node id, and it resumes where it stopped instead of starting over
        again = running.start_node("solo", extra=["--threads", "1", "--max-steps", "2"])
        wait_for(lambda: not again.alive(), 120, what="the restarted node to finish")
        assert again.stop(10) == 0
        resumed = load_checkpoint(tmp_path / "solo" / "last.safetensors")  # 2 steps finish no round: as taken
        assert resumed.round == stopped.round, (resumed.round, stopped.round)
        assert all(torch.equal(t, resumed.tensors[k]) for k, t in stopped.tensors.items())
        assert [n.node_id for n in client.health().nodes] == [node_id]

        # a stranger with no state of its own and no peer takes the coordinator's checkpoint
        newest = running.checkpoints()[0]
        stranger = running.start_node("stranger", extra=["--threads", "1", "--max-steps", "2"])
        wait_for(lambda: not stranger.alive(), 120, what="the stranger to start")
        assert stranger.stop(10) == 0
        took = load_checkpoint(tmp_path / "stranger" / "last.safetensors")
        assert 2 <= took.round <= stopped.round and took.round == newest.round, (took.round, newest.round, stopped.round)
    finally:
        client.close()
        running.close()


@pytest.mark.swarm
def test_new_run_from_a_checkpoint_with_shrink_and_perturb(tmp_path, corpus_file, node_zygote):
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
                                      extra=["--warm-start", str(old_path), "--shrink", "0.5", "--perturb", "0.0"],
                                      zygote=node_zygote)
    try:
        node = start_node(address, token, "n", tmp_path / "n", extra=["--threads", "1", "--max-steps", "1"],
                          zygote=node_zygote)
        wait_for(lambda: not node.alive(), 120, what="the node to start")
        assert node.stop(10) == 0
    finally:
        proc.stop(30)
    round0 = load_checkpoint(state / "checkpoints" / "round-000000.safetensors")
    assert round0.metadata["warm_start"]["from_round"] == 17
    took = load_checkpoint(tmp_path / "n" / "last.safetensors")  # the node started from the shrunk weights
    assert took.round == 0
    for n, p in old.named_parameters():
        assert torch.allclose(round0.tensors[f"model.{n}"], 0.5 * p.detach())
        assert torch.allclose(took.tensors[f"model.{n}"], 0.5 * p.detach())
    assert names


def test_warm_start_from_a_missing_checkpoint_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "cotrain.cli", "coordinator", "start", "--insecure", "--state-dir",
                          str(tmp_path / "s"), "--warm-start", str(tmp_path / "nope.safetensors")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == ExitCode.CONFIG, out.stderr  # a handled error (a traceback exits 1)
    assert "nope.safetensors" in out.stderr  # the CLI's error names the file (the CONFIG exit code promises it)

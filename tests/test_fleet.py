"""The operator's fleet through a real local Ray instance: a managed node joins like a volunteer, trains, is
restarted when it dies, evaluations run as Ray tasks. `cotrain simulate`'s virtual swarm: tests/test_simulate_cli.py."""

import os
import signal
import subprocess
import sys

import pytest

from cotrain.coordinator.store import Store
from cotrain.exit_codes import ExitCode
from cotrain.cli.launch import wait_for
from cotrain.cli.local_swarm import Swarm
from cotrain.client import CoordinatorClient

from tiny_swarm import tiny_config

pytestmark = pytest.mark.swarm


def test_managed_node_joins_trains_is_restarted_and_evaluations_run_on_ray(tmp_path, corpus_file):
    cfg = tiny_config(corpus_file, coordinator={"eval_every_rounds": 2})
    running = Swarm(cfg, tmp_path, extra=["--managed-nodes", "1", "--managed-node-cpus", "0.5"]).start()
    client = CoordinatorClient(running.address, insecure=True)

    def managed():
        return {n.node_name: n for n in client.health().nodes}.get("managed-0")

    try:
        assert running.info["ray"] == "local" and len(running.info["managed_pids"]) == 1
        wait_for(lambda: managed() is not None and managed().metrics.round >= 1, 240,
                 what="the managed node to join and finish a round", procs=[running.proc])
        wait_for(lambda: client.health().totals.val_round >= 1, 120, what="an evaluation by a Ray task",
                 procs=[running.proc])
        # (that the evaluation ran as a Ray task is only in the coordinator's log: no status says where it ran)
        rounds = [e.round for e in Store(running.state_dir).evals()]
        assert all(b - a >= 2 for a, b in zip(rounds, rounds[1:])), rounds  # every K = 2 rounds

        os.kill(running.info["managed_pids"][0], signal.SIGKILL)  # the node dies; Ray restarts its actor
        killed = managed().metrics.wall_s  # its figures stop here; a restarted process reports from 0 s again
        wait_for(lambda: managed().metrics.wall_s < killed, 240, what="Ray to restart the managed node",
                 procs=[running.proc])
        before = managed().metrics.step
        wait_for(lambda: managed().state == "healthy" and managed().metrics.step > before, 240,
                 what="the restarted node to train again", procs=[running.proc])
        assert [n.node_name for n in client.health().nodes] == ["managed-0"]  # the same identity
    finally:
        client.close()
        code = running.stop_coordinator()
    assert code == 0
    nodes = {n.name: n for n in Store(running.state_dir).load_nodes()}
    assert nodes["managed-0"].left  # stopped with the coordinator, cleanly
    assert all(t.revoked for t in Store(running.state_dir).list_tokens() if t.name.startswith("managed-"))


def test_simulate_rejects_bad_flags():
    out = subprocess.run([sys.executable, "-m", "cotrain.cli", "simulate", "--nodes", "0"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == ExitCode.USAGE and "--nodes" in out.stderr  # a handled error names the flag


def test_unreachable_ray_address_is_a_clear_error_not_a_hang(tmp_path):
    out = subprocess.run([sys.executable, "-m", "cotrain.cli", "coordinator", "start", "--insecure", "--listen",
                          "127.0.0.1:0", "--state-dir", str(tmp_path / "s"), "--ray-address", "127.0.0.1:1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == ExitCode.FLEET, out.stderr[-2000:]
    assert "--ray-address" in out.stderr  # the FLEET exit code is a handled error; its message names the flag


RAY_HEAD = """
import sys, ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the test closes it
ray.shutdown()
"""


def test_managed_nodes_a_ray_cluster_cannot_hold_are_refused(tmp_path):
    """3 nodes of 1 CPU for a cluster of 2 CPUs: exit code 3 (config) at start, one line with the flags and the
    figures, instead of a placement group that never schedules."""
    # an operator's cluster with Ray's token authentication, which a driver joins with RAY_AUTH_MODE=token (the
    # token in ~/.ray, made by the head when missing)
    env = dict(os.environ, RAY_AUTH_MODE="token")
    head = subprocess.Popen([sys.executable, "-c", RAY_HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True, env=env)
    try:
        address = head.stdout.readline().strip()
        assert address, "the Ray head did not start"
        out = subprocess.run([sys.executable, "-m", "cotrain.cli", "coordinator", "start", "--insecure", "--listen",
                              "127.0.0.1:0", "--state-dir", str(tmp_path / "s"), "--ray-address", address,
                              "--managed-nodes", "3", "--managed-node-cpus", "1"],
                             capture_output=True, text=True, timeout=120, env=env)
    finally:
        head.stdin.close()
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
    assert out.returncode == ExitCode.CONFIG, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("cotrain: --managed-nodes 3 x --managed-node-cpus 1 = 3 CPUs"), line
    assert f"2 CPUs of the Ray cluster at --ray-address {address}" in line, line

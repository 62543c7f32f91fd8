"""Faults on real processes: a node killed with -9 in the middle of training, a coordinator killed and restarted,
a corrupt checkpoint. Training goes on and nothing acknowledged is lost."""

import re
import socket

import pytest

from cotrain.coordinator.store import Store
from cotrain.cli.launch import start_coordinator, start_node, wait_for
from cotrain.client import CoordinatorClient

from tiny_swarm import RunningCoordinator, tiny_config

pytestmark = pytest.mark.swarm


def rounds_done(log: str) -> list[tuple[int, int]]:
    """(round finished, group size) in a node's log."""
    return [(int(r), int(g)) for r, g in re.findall(r"round (\d+) done with (\d+) peer", log)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_killed_node_does_not_stop_the_round_and_rejoins(tmp_path, corpus_file):
    running = RunningCoordinator(tmp_path, tiny_config(corpus_file, averaging={"inner_steps": 40,
                                                                               "allreduce_timeout": 5.0}))
    nodes = [start_node(running.address, running.token, f"n{i}", tmp_path / f"n{i}",
                        extra=["--threads", "1", "--wait-peers", "3"]) for i in range(3)]
    client = CoordinatorClient(running.address, insecure=True)
    try:
        wait_for(lambda: sum(g == 3 for _, g in rounds_done(nodes[0].log())) >= 2, 120, what="three-node rounds",
                 procs=nodes + [running.proc])
        nodes[2].kill()  # kill -9: no Leave, its DHT record and its parts of the all-reduce just stop
        before = len(rounds_done(nodes[0].log()))
        wait_for(lambda: len(rounds_done(nodes[0].log())) >= before + 2, 180,
                 what="the others to go on without it", procs=nodes[:2] + [running.proc])
        later = rounds_done(nodes[0].log())[before + 1:]
        assert any(g == 2 for _, g in later), later  # rounds completed by the survivors

        comeback = start_node(running.address, running.token, "n2", tmp_path / "n2", tmp_path / "n2-again.log",
                              extra=["--threads", "1"])
        nodes.append(comeback)
        wait_for(lambda: "took the shared state of round" in comeback.log() and rounds_done(comeback.log()), 120,
                 what="the killed node to rejoin and average again", procs=[comeback, running.proc])
        assert len([n for n in client.health().nodes if n.node_name == "n2"]) == 1  # same identity
        wait_for(lambda: {n.node_name: n.state for n in client.health().nodes}["n2"] == "healthy", 30,
                 what="the killed node to be healthy again")
    finally:
        client.close()
        for n in nodes:
            n.stop(30)
        running.stop()


def test_a_killed_nodes_work_unit_is_reissued_and_finished_by_another(tmp_path, corpus_file):
    cfg = tiny_config(corpus_file, coordinator={"unit_bytes": 4096, "lost_after_missed": 4},
                      averaging={"inner_steps": 20, "allreduce_timeout": 5.0})
    running = RunningCoordinator(tmp_path, cfg)
    nodes = [start_node(running.address, running.token, f"n{i}", tmp_path / f"n{i}",
                        extra=["--threads", "1", "--wait-peers", "2"]) for i in range(2)]
    client = CoordinatorClient(running.address, insecure=True)
    store = Store(running.state_dir)

    def row(name):
        return {n.node_name: n for n in client.health().nodes}.get(name)

    try:
        wait_for(lambda: client.health().totals.units_done >= 2 and row("n1") and row("n1").units, 120,
                 what="both nodes to finish units and n1 to hold one", procs=nodes + [running.proc])
        victim, survivor = row("n1").node_id, row("n0").node_id
        nodes[1].kill()  # kill -9: no Leave; the coordinator must notice it is lost
        held = [(r[0], r[1]) for r in store.load_units() if r[4] == "in_progress" and r[5] == victim]
        assert held, "n1 held no unit when it was killed"

        def finished_by_survivor():
            units = {(r[0], r[1]): r for r in store.load_units()}
            return all(k in units and units[k][4] == "done" and units[k][5] == survivor for k in held)

        wait_for(finished_by_survivor, 180, what=f"n0 to finish n1's units {held}", procs=[nodes[0], running.proc])
        health = client.health()
        assert health.totals.units_reissued >= len(held)
        assert {n.node_name: n.state for n in health.nodes}["n1"] == "lost"
        assert not row("n1").units
    finally:
        client.close()
        for n in nodes:
            n.stop(30)
        running.stop()


def test_swarm_trains_on_while_the_coordinator_is_away(tmp_path, corpus_file):
    cfg = tiny_config(corpus_file, averaging={"inner_steps": 40})
    (tmp_path / "run.toml").write_text(cfg.to_toml())
    state = tmp_path / "state"
    from cotrain.coordinator.store import Store

    token = Store(state).create_token("t")
    listen = f"127.0.0.1:{free_port()}"
    proc, address = start_coordinator(state, tmp_path / "run.toml", listen=listen)
    nodes = [start_node(address, token, f"n{i}", tmp_path / f"n{i}", extra=["--threads", "1", "--wait-peers", "2"])
             for i in range(2)]
    try:
        wait_for(lambda: len(rounds_done(nodes[0].log())) >= 2, 120, what="rounds", procs=nodes + [proc])
        with CoordinatorClient(address, insecure=True) as client:
            members = {n.node_id for n in client.health().nodes}
        proc.kill()  # kill -9 the coordinator
        proc.kill_group()
        during = len(rounds_done(nodes[0].log()))
        wait_for(lambda: len(rounds_done(nodes[0].log())) >= during + 2, 120,
                 what="rounds while the coordinator is down", procs=nodes)
        proc, address = start_coordinator(state, tmp_path / "run.toml", listen=listen)
        with CoordinatorClient(address, insecure=True) as client:
            assert {n.node_id for n in client.health().nodes} == members  # no member lost
            wait_for(lambda: all(n.state == "healthy" and n.metrics.round > during
                                 for n in client.health().nodes), 60, what="the nodes to report again")
    finally:
        for n in nodes:
            n.stop(30)
        proc.stop(30)


def test_corrupt_checkpoint_falls_back_to_the_previous(tmp_path, corpus_file):
    running = RunningCoordinator(tmp_path, tiny_config(corpus_file, coordinator={"checkpoint_interval_s": 1.0}))
    client = CoordinatorClient(running.address, insecure=True)
    try:
        node = start_node(running.address, running.token, "solo", tmp_path / "solo", extra=["--threads", "1"])
        wait_for(lambda: len(running.checkpoints()) >= 2, 120, what="two checkpoints", procs=[node, running.proc])
        node.stop(30)
        newest, previous = running.checkpoints()[:2]
        data = bytearray(open(newest[1], "rb").read())
        data[len(data) // 2] ^= 0xFF
        open(newest[1], "wb").write(bytes(data))
        stranger = start_node(running.address, running.token, "stranger", tmp_path / "s",
                              extra=["--threads", "1", "--max-steps", "1"])
        wait_for(lambda: not stranger.alive(), 120, what="the stranger to start")
        took = re.search(r"resumed from the coordinator's checkpoint at round (\d+)", stranger.log())
        assert took and int(took.group(1)) == previous[0], stranger.log()[-2000:]
        assert "corrupt" in running.proc.log()
    finally:
        client.close()
        running.stop()

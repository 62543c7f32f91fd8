"""Faults on real processes: a node killed with -9 in the middle of training, a coordinator killed and restarted,
a corrupt checkpoint. Training goes on and nothing acknowledged is lost."""

import json
import signal

import pytest
import torch

from cotrain.checkpoint import load_checkpoint
from cotrain.coordinator.store import Store
from cotrain.cli.launch import start_coordinator, start_node, wait_for
from cotrain.cli.local_swarm import Swarm
from cotrain.client import CoordinatorClient

from tiny_swarm import tiny_config

pytestmark = pytest.mark.swarm


def rows(client) -> dict:
    """The coordinator's health rows by node name."""
    return {n.node_name: n for n in client.health().nodes}


def node_status(state_dir) -> dict:
    """What a running node reports about itself in STATE_DIR/status.json (its heartbeat's figures, also while its
    coordinator is away); {} before it first wrote one."""
    try:
        return json.loads((state_dir / "status.json").read_text())
    except FileNotFoundError:
        return {}


def rounds_done(state_dir) -> list[tuple[int, int]]:
    """(round finished, group size) as a node that left cleanly recorded them in its last state."""
    return [tuple(r) for r in load_checkpoint(state_dir / "last.safetensors").metadata["rounds"]]


def test_killed_node_does_not_stop_the_round_and_rejoins(tmp_path, corpus_file, node_zygote):
    cfg = tiny_config(corpus_file, averaging={"inner_steps": 40, "allreduce_timeout": 5.0})
    running = Swarm(cfg, tmp_path, zygote=node_zygote).start()
    nodes = [running.start_node(f"n{i}", extra=["--threads", "1", "--wait-peers", "3"])
             for i in range(3)]
    client = CoordinatorClient(running.address, insecure=True)
    try:
        wait_for(lambda: len(rows(client)) == 3 and all(n.metrics.rounds_completed >= 2 for n in rows(client).values()),
                 120, what="three nodes to average twice", procs=nodes + [running.proc])
        nodes[2].kill()  # kill -9: no Leave, its DHT record and its parts of the all-reduce just stop
        # the node's own status file (written at every new round) is fresher than its last heartbeat: under make
        # test's load a heartbeat two rounds old let the wait below pass before any round without n2
        killed_at = max(rows(client)["n0"].metrics.round, node_status(tmp_path / "n0").get("round", 0))
        wait_for(lambda: rows(client)["n0"].metrics.round >= killed_at + 2, 180,
                 what="the others to go on without it", procs=nodes[:2] + [running.proc])

        swarm_round = rows(client)["n0"].metrics.round
        comeback = running.start_node("n2", extra=["--threads", "1"], log_path=tmp_path / "n2-again.log")
        nodes.append(comeback)

        def rejoined():  # its row reports the swarm's rounds (the killed process's figures stopped at killed_at)
            row = rows(client)["n2"]
            return row.state == "healthy" and row.metrics.round >= swarm_round and row.metrics.rounds_completed >= 1

        wait_for(rejoined, 120, what="the killed node to take the swarm's state and average again",
                 procs=[comeback, running.proc])
        assert [n.node_name for n in client.health().nodes].count("n2") == 1  # same identity
        assert [node.stop(30) for node in (nodes[0], nodes[1], comeback)] == [0, 0, 0]
    finally:
        client.close()
        for n in nodes:
            n.stop(30)
        running.close()
    history = rounds_done(tmp_path / "n0")
    assert any(g == 3 for r, g in history if r < killed_at), history  # rounds of all three before the kill
    assert any(g == 2 for r, g in history if r > killed_at), history  # rounds completed by the survivors
    rejoined_history = rounds_done(tmp_path / "n2")  # the comeback's own rounds: none before it took the state
    assert rejoined_history and min(r for r, _ in rejoined_history) >= swarm_round, rejoined_history


def test_a_killed_nodes_work_unit_is_reissued_and_finished_by_another(tmp_path, corpus_file, node_zygote):
    cfg = tiny_config(corpus_file, coordinator={"unit_bytes": 4096, "lost_after_missed": 4},
                      averaging={"inner_steps": 20, "allreduce_timeout": 5.0})
    running = Swarm(cfg, tmp_path, zygote=node_zygote).start()
    nodes = [running.start_node(f"n{i}", extra=["--threads", "1", "--wait-peers", "2"])
             for i in range(2)]
    client = CoordinatorClient(running.address, insecure=True)
    store = Store(running.state_dir)

    def row(name):
        return {n.node_name: n for n in client.health().nodes}.get(name)

    try:
        wait_for(lambda: client.health().totals.units_done >= 2 and row("n1") and row("n1").units, 120,
                 what="both nodes to finish units and n1 to hold one", procs=nodes + [running.proc])
        victim, survivor = row("n1").node_id, row("n0").node_id

        def holding() -> list:
            return [(u.epoch, u.index) for u in store.load_units() if u.state == "in_progress" and u.holder == victim]

        def frozen_holding_a_unit() -> bool:
            # a frozen node finishes no unit, so what the store says it holds is what it holds when it is killed (a
            # unit it finished between a look at the store and the kill left the test nothing to reissue)
            nodes[1].signal(signal.SIGSTOP)
            if holding():
                return True
            nodes[1].signal(signal.SIGCONT)
            return False

        wait_for(frozen_holding_a_unit, 120, what="n1 to hold a unit", procs=nodes + [running.proc])
        nodes[1].kill()  # kill -9: no Leave; the coordinator must notice it is lost
        held = holding()
        assert held, "n1 held no unit when it was killed"

        def finished_by_survivor():
            units = {(u.epoch, u.index): u for u in store.load_units()}
            return all(k in units and units[k].state == "done" and units[k].holder == survivor for k in held)

        wait_for(finished_by_survivor, 180, what=f"n0 to finish n1's units {held}", procs=[nodes[0], running.proc])
        health = client.health()
        assert health.totals.units_reissued >= len(held)
        assert {n.node_name: n.state for n in health.nodes}["n1"] == "lost"
        assert not row("n1").units
    finally:
        client.close()
        for n in nodes:
            n.stop(30)
        running.close()


def test_swarm_trains_on_while_the_coordinator_is_away(tmp_path, corpus_file, node_zygote):
    cfg = tiny_config(corpus_file, averaging={"inner_steps": 40})
    (tmp_path / "run.toml").write_text(cfg.to_toml())
    state = tmp_path / "state"
    token = Store(state).create_token("t")
    # port 0: the coordinator says which it got
    proc, address = start_coordinator(state, tmp_path / "run.toml", zygote=node_zygote)
    nodes = [start_node(address, token, f"n{i}", tmp_path / f"n{i}", extra=["--threads", "1", "--wait-peers", "2"],
                        zygote=node_zygote) for i in range(2)]
    try:
        with CoordinatorClient(address, insecure=True) as client:
            wait_for(lambda: len(rows(client)) == 2 and all(n.metrics.rounds_completed >= 2
                                                            for n in rows(client).values()),
                     120, what="rounds", procs=nodes + [proc])
            members = {n.node_id for n in client.health().nodes}
        proc.kill()  # kill -9 the coordinator
        proc.kill_group()
        dirs = {n.name: tmp_path / n.name for n in nodes}
        during = {name: node_status(d)["rounds_completed"] for name, d in dirs.items()}
        wait_for(lambda: all(node_status(d)["rounds_completed"] >= during[name] + 2 for name, d in dirs.items()),
                 120, what="rounds while the coordinator is down", procs=nodes)
        at_restart = {name: node_status(d)["round"] for name, d in dirs.items()}  # the round each node is at
        # where the nodes look
        proc, address = start_coordinator(state, tmp_path / "run.toml", listen=address, zygote=node_zygote)
        with CoordinatorClient(address, insecure=True) as client:
            assert {n.node_id for n in client.health().nodes} == members  # no member lost
            # the rounds finished while it was away count in what the nodes report to the restarted coordinator
            wait_for(lambda: all(n.state == "healthy" and n.metrics.round >= at_restart[n.node_name]
                                 for n in client.health().nodes), 60, what="the nodes to report again")
    finally:
        for n in nodes:
            n.stop(30)
        proc.stop(30)


def test_corrupt_checkpoint_falls_back_to_the_previous(tmp_path, corpus_file, node_zygote):
    running = Swarm(tiny_config(corpus_file, coordinator={"checkpoint_interval_s": 1.0}), tmp_path,
                    zygote=node_zygote).start()
    client = CoordinatorClient(running.address, insecure=True)
    try:
        node = running.start_node("solo", extra=["--threads", "1"])
        wait_for(lambda: len(running.checkpoints()) >= 2, 120, what="two checkpoints", procs=[node, running.proc])
        node.stop(30)
        newest, previous = running.checkpoints()[:2]
        data = bytearray(open(newest.path, "rb").read())
        data[len(data) // 2] ^= 0xFF
        open(newest.path, "wb").write(bytes(data))
        stranger = running.start_node("stranger", extra=["--threads", "1", "--max-steps", "1"],
                                      state_dir=tmp_path / "s")
        wait_for(lambda: not stranger.alive(), 120, what="the stranger to start")
        assert stranger.stop(10) == 0, stranger.log()[-2000:]
        # with no peer and no state of its own it took the newest checkpoint that is intact (the newest arrives
        # corrupt and the client refuses it too, so a stranger holding it would show the initial weights instead)
        took = load_checkpoint(tmp_path / "s" / "last.safetensors")
        assert took.round == previous.round, (took.round, previous.round, newest.round)
        intact = load_checkpoint(previous.path)
        common = intact.tensors.keys() & took.tensors.keys()
        assert common and all(torch.equal(intact.tensors[k], took.tensors[k]) for k in common)
    finally:
        client.close()
        running.close()

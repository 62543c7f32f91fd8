"""A real coordinator and real nodes on 127.0.0.1, speaking gRPC and hivemind, training one model together."""

import json
import signal
import subprocess
import sys

import pytest
import torch

from cotrain.checkpoint import load_checkpoint
from cotrain.cli.launch import start_node, wait_for
from cotrain.cli.local_swarm import Swarm
from cotrain.client import CoordinatorClient
from cotrain.evaluation import evaluate_state
from tiny_swarm import tiny_config

pytestmark = pytest.mark.swarm

ROUNDS = 4


def val_loss(cfg, state=None):
    """The run's evaluation of ``state`` (None: the weights every node starts from)."""
    metrics = evaluate_state(cfg, state)
    # world models on a few rollouts overfit their likelihood quickly; their prediction error is the steadier signal
    return metrics["mse"] if cfg.model.is_world_model else metrics["val_loss"]


def assert_learned(cfg, state):
    """The shared model's validation loss fell from the nodes' initial weights."""
    before, after = val_loss(cfg), val_loss(cfg, state)
    # language models start near the text's unigram entropy (their output bias), so a few rounds gain tenths of a
    # nat; world models start from nothing they know
    drop = 0.1 * abs(before) if cfg.model.is_world_model else 0.1
    assert after < before - drop, (before, after)


MODELS = {
    # rounds averaged in the background while the nodes train on (eager updates, one round of delay)
    "lstm_overlap": {"averaging": {"overlap": True}},
    # SparseLoCo's codec and outer error feedback, robustly averaged; 16 of 64 (not 64 of 4096) so that the few
    # rounds of this test move a tiny model far enough to show it learned
    "gru_sparse": {"model": {"kind": "gru"}, "compression": {"kind": "sparse", "sparse_chunk": 64, "sparse_topk": 16},
                   "averaging": {"outer": "error_feedback", "outer_lr": 1.0, "aggregation": "clipped_mean"}},
    "fast_slow": {"model": {"kind": "fast_slow", "fast_size": 32, "slow_size": 32, "fast_cells": 2,
                            "zoneout_cell": 0.1, "zoneout_hidden": 0.05}},
    "lru_root": {"model": {"kind": "lru", "hidden_size": 32, "state_size": 16, "mlp_ratio": 1},
                 "optimizer": {"kind": "root"}},
    "mingru_muon": {"model": {"kind": "mingru", "hidden_size": 32, "mlp_ratio": 1}, "optimizer": {"kind": "muon"}},
    # sync shares the optimizer's state: LAMB's moments and step counts travel and stay identical. LAMB moves each
    # weight by about lr of its norm a step, so the 4 steps of this test need more than AdamW's lr. With overlap
    # each round's gradients are applied one round late
    "sync_int8_lamb_overlap": {"averaging": {"strategy": "sync", "inner_steps": 2, "overlap": True},
                               "compression": {"kind": "int8"}, "optimizer": {"kind": "lamb", "lr": 0.05}},
    "diloco_powersgd": {"compression": {"kind": "powersgd", "powersgd_rank": 8}},
    # world models learn slowly per step: 100 local steps a round (rounds formed from the board take milliseconds,
    # so a node trains only what its rounds ask for)
    "mdn_rnn": {"model": {"kind": "mdn_rnn", "hidden_size": 32, "num_mixtures": 3}, "averaging": {"inner_steps": 100},
                "env": {"id": "Pendulum-v1", "episodes": 16, "horizon": 20, "eval_episodes": 16}},
    "actions_wm": {"model": {"kind": "actions_wm", "hidden_size": 32}, "averaging": {"inner_steps": 100},
                   "env": {"id": "CartPole-v1", "episodes": 16, "horizon": 20, "eval_episodes": 16}},
}


@pytest.fixture(params=list(MODELS))
def model_coordinator(request, tmp_path, corpus_file, node_zygote):
    with Swarm(tiny_config(corpus_file, **MODELS[request.param]), tmp_path, zygote=node_zygote) as running:
        yield running


def train_together(coordinator, tmp_path, count: int, rounds: int = ROUNDS, extra: dict | None = None):
    """``count`` real nodes train until ``rounds`` rounds (node i with ``extra[i]`` flags too); -> (final coordinator
    health, the nodes' final states)."""
    nodes = [coordinator.start_node(f"node-{i}", state_dir=tmp_path / f"node-{i}",
                                    extra=["--max-rounds", str(rounds), "--threads", "1", "--wait-peers", str(count),
                                           *(extra or {}).get(i, [])])
             for i in range(count)]
    client = CoordinatorClient(coordinator.address, insecure=True)
    try:
        # joined and reporting: healthy, or a straggler for a moment on a loaded machine
        wait_for(lambda: sum(n.state in ("healthy", "straggler") for n in client.health().nodes) == count, 120,
                 what="the nodes to join", procs=nodes + [coordinator.proc])
        for node in nodes:
            wait_for(lambda: not node.alive(), 300, interval=0.5, what=f"{node.name} to finish {rounds} rounds")
        codes = [node.stop(30) for node in nodes]
        assert codes == [0] * count, [n.log()[-3000:] for n in nodes]
        health = client.health()
    finally:
        client.close()
        for node in nodes:
            node.stop(10)
    return health, [load_checkpoint(tmp_path / f"node-{i}" / "last.safetensors") for i in range(count)]


def test_two_nodes_train_and_average_into_one_model(model_coordinator, tmp_path):
    coordinator = model_coordinator
    health, finals = train_together(coordinator, tmp_path, 2)

    # both left cleanly and reported their work
    assert sorted(n.state for n in health.nodes) == ["left", "left"]
    assert all(n.metrics.round >= ROUNDS and n.metrics.rounds_completed >= 1 for n in health.nodes)

    history = [dict(map(tuple, f.metadata["rounds"])) for f in finals]
    averaged = [r for r, size in history[0].items() if size == 2 and history[1].get(r) == 2]
    assert averaged, f"no round was averaged by both nodes: {history}"
    assert finals[0].round == finals[1].round == ROUNDS
    for name, tensor in finals[0].tensors.items():
        assert torch.equal(tensor, finals[1].tensors[name]), f"{name} differs between the nodes"

    assert_learned(coordinator.cfg, finals[0].model_state())

    if not coordinator.cfg.model.is_world_model:  # the saved state samples, one byte at a time with its state
        saved = tmp_path / "node-0" / "last.safetensors"
        sample = subprocess.run([sys.executable, "-m", "cotrain.cli", "sample", str(saved), "--prompt", "The ",
                                 "--length", "40", "--seed", "1"], capture_output=True, timeout=120)
        assert sample.returncode == 0, sample.stderr.decode()[-2000:]
        assert sample.stdout.startswith(b"The ") and len(sample.stdout) >= 4 + 40, sample.stdout


@pytest.mark.parametrize("formation", ["board", "board_only", "matchmaking"])
def test_a_diloco_round_of_three_nodes_leaves_identical_parameters(tmp_path, corpus_file, formation, node_zygote):
    # the tiny model's update is small: board_only's groups average it at the meeting, through the host
    # (allreduce.hosted); "board" makes every member reduce a part (min_part_values = 0), the butterfly after the
    # meeting that a large model's rounds take
    averaging = {"group_formation": formation, **({"min_part_values": 0} if formation == "board" else {})}
    coordinator = Swarm(tiny_config(corpus_file, averaging=averaging), tmp_path, zygote=node_zygote).start()
    # with board groups node-2 is a straggler (each local step takes 0.3 s more): it must cost the others nothing
    straggler = {2: ["--step-delay", "0.3"]} if formation != "matchmaking" else {}
    try:
        health, finals = train_together(coordinator, tmp_path, 3, rounds=3, extra=straggler)
    finally:
        coordinator.close()
    histories = [dict(map(tuple, f.metadata["rounds"])) for f in finals]
    assert all(h.get(2) == 3 for h in histories), histories  # the last round was averaged by all three
    for other in finals[1:]:
        assert other.round == finals[0].round == 3
        for name, tensor in finals[0].tensors.items():
            assert torch.equal(tensor, other.tensors[name]), f"{name} differs between the nodes"
    assert all(n.metrics.bytes_sent > 0 and n.metrics.partial_rounds == 0 for n in health.nodes)
    statuses = [json.loads((tmp_path / f"node-{i}" / "status.json").read_text()) for i in range(3)]
    # what each node costs, all its processes (itself, hivemind's DHT and averager processes, the libp2p daemon)
    assert all(s["processes"] >= 3 and s["memory_bytes"] > 100 << 20 and s["heartbeat_ms"] > 0
               for s in statuses), statuses
    # the health view names each node's groupmates of its last round: the other two
    assert {n.node_name: sorted(n.groupmates) for n in health.nodes} == {
        f"node-{i}": sorted(f"node-{j}" for j in range(3) if j != i) for i in range(3)}, health.nodes
    if formation == "board_only":  # no hivemind averager process: the node, its DHT process, the libp2p daemon
        assert all(s["processes"] == 3 and s["groups_matchmade"] == 0 for s in statuses), statuses
    hosted = [f.metadata["rounds_hosted"] for f in finals]
    if formation == "board_only":  # every round the board's group averaged went through its host
        assert hosted == [s["groups_from_board"] for s in statuses], (hosted, statuses)
    else:
        assert hosted == [0, 0, 0], hosted
    if formation != "matchmaking":  # the peers agree on their group from the board: no matchmaking in a calm swarm
        assert all(s["groups_from_board"] >= 2 for s in statuses), statuses
        # the fast nodes took their H steps a round and went to the meeting; the straggler came when it saw them
        # there, with the samples it had (weighted by them), instead of making them wait for its H steps
        samples = [s["samples_local"] for s in statuses]
        assert samples[2] < 0.67 * min(samples[:2]), samples
    else:
        assert all(s["groups_from_board"] == 0 and s["groups_matchmade"] >= 1 for s in statuses), statuses


def test_every_node_of_a_round_takes_the_same_lr_at_each_step_and_the_same_outer_step(tmp_path, corpus_file,
                                                                                      node_zygote):
    """One clock for the swarm: a schedule that decays from the first samples, the outer step on it too, a
    straggler that takes fewer steps a round than the others, and a node that claims 1,000 times the samples it
    trains on. Each node records every step's lr and every round's state hash (--step-record)."""
    schedule = {"kind": "inverse_sqrt", "warmup_samples": 0, "timescale_samples": 64, "outer": True}
    cfg = tiny_config(corpus_file, schedule=schedule)
    coordinator = Swarm(cfg, tmp_path, zygote=node_zygote).start()
    records = [tmp_path / f"steps-{i}.jsonl" for i in range(3)]
    odd = {1: ["--claim-multiple", "1000"], 2: ["--step-delay", "0.1"]}
    extra = {i: ["--step-record", str(records[i]), *odd.get(i, [])] for i in range(3)}
    try:
        train_together(coordinator, tmp_path, 3, rounds=4, extra=extra)
    finally:
        coordinator.close()
    lines = [[json.loads(line) for line in path.read_text().splitlines()] for path in records]
    steps = [{(x["round"], x["step"]): x["lr"] for x in node if "lr" in x} for node in lines]
    # the straggler takes fewer steps a round (as few as one on a loaded machine): each step is compared on every
    # node that took it
    shared = {key for key in set().union(*steps) if sum(key in s for s in steps) >= 2}
    assert len(shared) >= 12 and len(shared & set(steps[2])) >= 3, [sorted(s) for s in steps]
    for key in sorted(shared):
        lrs = [s[key] for s in steps if key in s]
        assert max(lrs) - min(lrs) <= 1e-9, (key, lrs)
    assert len({steps[0][key] for key in shared if key in steps[0]}) >= 5  # the lr moved: the comparison could fail
    rounds = [{x["round"]: x for x in node if "state" in x} for node in lines]
    reached = set.intersection(*(set(r) for r in rounds))
    assert {2, 3, 4} <= reached, rounds
    for r in sorted(reached):
        assert len({node[r]["state"] for node in rounds}) == 1, (r, [node[r] for node in rounds])
        assert len({node[r]["outer_lr"] for node in rounds}) == 1, (r, [node[r] for node in rounds])
        assert len({node[r]["samples_total"] for node in rounds}) == 1, (r, [node[r] for node in rounds])
    assert len({rounds[0][r]["outer_lr"] for r in reached}) >= 2  # the outer lr follows the schedule
    assert all(node[max(node)]["resyncs"] == 0 for node in rounds), [node[max(node)] for node in rounds]
    # the liar's claim counts for what its pseudo-gradient shows: the swarm's clock stays near the samples trained
    # (counting the claims, it would run hundreds of times too fast). Near, not at: work.credited_weights credits a
    # contribution whose norm is r times the median's 1 + 1.25 (r^2 - 1) medians, and in these first rounds at a high
    # lr norms vary by half from node to node (a loaded CI machine ran the clock 2.3x the samples trained)
    for r in sorted(reached):
        trained = cfg.data.batch_size * sum(1 for node in lines for x in node if "lr" in x and x["round"] < r)
        assert rounds[0][r]["samples_total"] <= 3 * trained, (r, rounds[0][r], trained)


def test_eight_nodes_in_groups_of_two_count_the_whole_swarms_samples(tmp_path, corpus_file, node_zygote):
    """The schedule's clock advances with every group's samples, not the node's own group's (a quarter of the swarm
    here): each node's count, at every round it applied in the second half of the run, against the swarm's true
    total then (the sum of every node's own samples in the rounds it applied, from their records)."""
    cfg = tiny_config(corpus_file, averaging={"group_formation": "board_only", "target_group_size": 2,
                                              "inner_steps": 5})
    coordinator = Swarm(cfg, tmp_path, zygote=node_zygote).start()
    records = [tmp_path / f"steps-{i}.jsonl" for i in range(8)]
    try:
        train_together(coordinator, tmp_path, 8, rounds=14,
                       extra={i: ["--step-record", str(records[i])] for i in range(8)})
    finally:
        coordinator.close()
    rounds = [[x for x in map(json.loads, path.read_text().splitlines()) if "state" in x] for path in records]
    events = sorted((x["time"], i, x["contributed"]) for i, node in enumerate(rounds) for x in node)
    contributed, truth = [0] * 8, []  # the true total after each node's round, in time order
    for t, i, count in events:
        contributed[i] = count
        truth.append((t, sum(contributed)))
    final = truth[-1][1]
    assert final >= 8 * 10 * 5 * cfg.data.batch_size, truth[-1]  # the swarm made its rounds

    def truth_at(when: float) -> int:
        return max([v for t, v in truth if t <= when] or [0])

    # the other groups' rounds reach a node through the board: published and read every progress_interval, and a
    # steady group reads every other interval, so a node may not know of the last 2 s of the others' rounds yet
    delay = 4 * cfg.averaging.progress_interval
    # while all eight train: once the first leaves, the last ones train alone, for as long as they wait
    end = min(node[-1]["time"] for node in rounds)
    checked = 0
    for node in rounds:
        for before, x in zip(node, node[1:]):
            if truth_at(x["time"]) >= truth_at(end) / 2 and x["time"] <= end:
                checked += 1
                # never counted twice: a group's members record the round a step after they applied it, each
                assert x["samples_total"] <= 1.05 * truth_at(x["time"] + delay), (x, truth_at(x["time"] + delay))
                # and never a round short of what the swarm had done by the node's previous round (or the delay,
                # whichever is longer): on a loaded machine a round takes longer than the board's few intervals
                known = truth_at(min(x["time"] - delay, before["time"]))
                assert x["samples_total"] >= 0.95 * known, (x, known)
    assert checked >= 8, checked
    # at the end every node knows of (almost) every sample: not its own group's quarter of them
    for node in rounds:
        assert node[-1]["samples_total"] >= 0.75 * truth_at(node[-1]["time"] - delay), (node[-1], truth)


@pytest.mark.parametrize("state_averaging,group_rounds", [(False, 1), (True, 4)],
                         ids=["states_by_majority", "states_averaged_groups_kept"])
def test_four_nodes_on_a_sharded_board_average_in_groups_of_their_shard(tmp_path, corpus_file, state_averaging,
                                                                        group_rounds, node_zygote):
    """board_shards = 2: each node reads and publishes only its shard of its round (about half the swarm), groups of
    two form within a shard, and the shards are dealt afresh every round. A shard of one (likely with 4 nodes in 2
    shards) waits round_wait for shardmates, then averages alone. Groups of a round apply different averages: a
    later group whose members' states differ takes its majority's (the others download it), or, with
    state_averaging, averages the states. With group_rounds = 4 the shards are dealt, and the groups planned, at
    round 0 only (of rounds 0 to 3): a group meets again at its next round from its roster, without the board. The
    two settings are independent: the second case has both (a swarm of 4 nodes costs seconds of a 2-core CI)."""
    cfg = tiny_config(corpus_file, averaging={"group_formation": "board_only", "board_shards": 2,
                                              "target_group_size": 2, "round_wait": 3.0,
                                              "state_averaging": state_averaging, "group_rounds": group_rounds})
    coordinator = Swarm(cfg, tmp_path, zygote=node_zygote).start()
    try:
        health, finals = train_together(coordinator, tmp_path, 4, rounds=4)
    finally:
        coordinator.close()
    assert all(f.round == 4 for f in finals), [f.round for f in finals]
    statuses = [json.loads((tmp_path / f"node-{i}" / "status.json").read_text()) for i in range(4)]
    # groups formed on the board, within shards: never matchmade, and never larger than a shard's share of 4. Not
    # every node need be in one: under make test's load a node can spend its 4 rounds alone in its shard or
    # downloading the state of peers that went ahead
    assert all(s["groups_matchmade"] == 0 for s in statuses), statuses
    assert sum(s["groups_from_board"] for s in statuses) >= 2, statuses
    sizes = [size for f in finals for _, size in f.metadata["rounds"]]
    assert sizes and max(sizes) <= 3 and sum(size >= 2 for size in sizes) >= len(sizes) // 2, sizes
    # with state_averaging a group averages states only when it met holding two, which 4 rounds need not bring
    # about; without it, never
    if not state_averaging:
        assert sum(f.metadata["states_averaged"] for f in finals) == 0
    kept = sum(f.metadata["groups_kept"] for f in finals)
    if group_rounds > 1:  # a group of round 0 (or 1, 2) met again at the next round: both its members count it
        assert kept >= 2, [f.metadata["rounds"] for f in finals]
    else:  # nor does any node leave out a read of the board
        assert kept == 0 and sum(f.metadata["board_reads_skipped"] for f in finals) == 0
    assert all(f.metadata["board_reads"] >= 1 for f in finals)
    assert_learned(coordinator.cfg, finals[0].model_state())


def test_a_byzantine_node_is_caught_by_the_validator_while_centered_clip_holds_it_off(tmp_path, corpus_file,
                                                                                     node_zygote):
    # node-2 sends its group its pseudo-gradient sign-flipped and scaled by 10 (with a plain mean the average points
    # backwards: bench/byzantine.py shows the loss exploding) and shows the validator its honest one, which passes the
    # loss score. CenteredClip clips it to the honest ones; the validator, checking every round's evidence against
    # what the round's reducers took in (their heartbeats), finds another contribution than the group's and revokes it
    # every check that passes the loss score replays the round too: the nodes' traces, recorded by their training
    # loops, must replay to what they sent (with dropout: tests/test_verification_trace.py)
    cfg = tiny_config(corpus_file, averaging={"aggregation": "centered_clip"},
                      verification={"enabled": True, "sample_rate": 1.0, "replay_rate": 1.0})
    with Swarm(cfg, tmp_path, zygote=node_zygote) as coordinator:
        nodes = [coordinator.start_node(f"node-{i}", state_dir=tmp_path / "nodes" / f"node-{i}",
                                        extra=["--threads", "1", "--wait-peers", "3",
                                               *(["--attack", "equivocate"] if i == 2 else [])])
                 for i in range(3)]

        def rows():
            return {n.node_name: n for n in coordinator.health().nodes}

        wait_for(lambda: rows().get("node-2") is not None and rows()["node-2"].verification.suspended, 240,
                 what="the validator to suspend node-2", procs=nodes + [coordinator.proc])
        # the attacker is told to drain and leaves; the honest pair trains on without it
        wait_for(lambda: not nodes[2].alive(), 60, interval=0.5, what="node-2 to leave", procs=nodes[:2])
        left_at = rows()["node-2"].metrics.round
        wait_for(lambda: min(rows()[f"node-{i}"].metrics.round for i in range(2)) >= left_at + 3, 120,
                 what="the honest pair to average on", procs=nodes[:2])
        assert [node.stop(30) for node in nodes] == [0, 0, 0], [n.log()[-3000:] for n in nodes]
        final, alerts = rows(), coordinator.health().alerts
    assert any(a.startswith("node node-2 was suspended") for a in alerts), alerts
    caught = final["node-2"].verification
    # its evidence is honest and passes the loss score: only the binding can have failed it
    assert caught.suspended and caught.failed >= 3 and "failed checks" in caught.reason, caught

    for name in ("node-0", "node-1"):  # checked too, and never failed a check that counts
        v = final[name].verification
        assert v.checks >= 1 and not v.suspended and v.reputation == 1.0, (name, v)
        assert v.replayed >= 1, (name, v)  # its first check replays, whatever the latest verdict was
    assert_learned(cfg, load_checkpoint(tmp_path / "nodes" / "node-0" / "last.safetensors").model_state())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_node_leaves_cleanly_on_signal(coordinator, tmp_path, sig):
    # a node started as users start it (a new Python running `cotrain node join`), not forked from the zygote
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

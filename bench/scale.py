"""How a swarm grows on one machine: 4, 8, 16, 32 real nodes (processes) training one model in groups of the same
size, what each round takes and what each node costs.

    python bench/scale.py [--nodes 4 8 16 32] [--group 4] [--samples 100000] [--formation board] [--shards auto]
                          [--model small|demo] [--zygote on|off] [--cpu-per-node auto|off|CPUS] [--json FILE]
    python bench/scale.py --virtual 100 300 1000 [--virtual-seconds 60] [--json FILE]

Every run is a real swarm on this machine: a coordinator and N ``cotrain node join`` processes, one torch thread
each (more nodes than cores: the kernel shares the cores out), forked from one zygote (:mod:`cotrain.cli.zygote`,
as ``cotrain demo`` starts them: they share one copy of torch and hivemind; ``--zygote off``: a new Python each),
a small byte-level LSTM (``--model demo``: the demo's 2x256 LSTM, sequences and batches), DiLoCo with
``target_group_size = --group``, so that a round's group is the same size at every swarm size and only the swarm
around it grows. Each run trains until the nodes together took ``--samples`` samples, so the validation loss of the
runs compares the same amount of training. Columns:

- ``round s``: seconds per round, median over the nodes, between the round each had when all were past their
  first (averaged, or caught up by downloading the state) and the last; a run goes on past ``--samples`` until
  the median node is ``--rounds`` rounds further (5: at 32 nodes the first round after all are in is the swarm's
  most disordered, as 32 peers that came one by one find groups; the budget was spent by then, and a run timed
  two rounds of it) (the machine's two cores are shared by all nodes, so at a fixed budget
  more nodes mean slower steps: ``round s`` grows with the swarm even when averaging costs nothing more; ``step
  s`` says how much);
- ``of which not stepping``: the part of a round a node spent outside its steps (meeting, all-reduce, waiting for
  its groupmates, reading the board), median over the nodes: what the swarm's size costs a round;
- ``partial``: rounds some node ended with a contribution left out or fewer groupmates than it saw (those that
  ended in a resync included), over the rounds the nodes averaged and applied;
- ``board reads/skipped``: reads of the progress board the nodes made, and those they left out while their group
  was kept (``--group-rounds``: its members meet from its roster), summed over the nodes for the whole run;
- ``PSS MB`` and ``RSS MB``: what one node costs, all its processes (the node, hivemind's DHT and averager
  processes, the libp2p daemon; the zygote's pages it shares count their share): proportional set size (shared
  pages split between the processes sharing them: summed over the machine it is the memory in use) and the sum
  of resident sets (shared pages counted in each);
- ``CPU node/DHT+daemon``: CPU a node used over the timed rounds (cores), in its own process (training, the board,
  the exchange) and in the processes it started (hivemind's DHT process, the libp2p daemon), mean over the nodes;
- ``coord CPU``: the coordinator's CPU over the run (cores: 1.0 is one core busy);
- ``heartbeat p99 ms``: the nodes' heartbeat round trips, 99th percentile of every one sampled;
- ``val loss``: the shared model's validation loss (nats per byte) after the budget.

``--cpu-per-node``: each node, all its processes, may use that much CPU time and no more (``node join --cpu-limit``,
a cgroup quota; needs root), the same at every swarm size ("auto": 90% of the machine over the largest swarm), as if
each node had a small machine of its own. Without it 4 nodes on two cores take half a core each and 32 a sixteenth,
and ``round s`` at 32 against 4 says more about the machine than about the swarm.

With ``--virtual``: ``records/read`` (a board read's records), ``DHT MB/node/min`` (what the board costs a peer,
sent and received), ``busiest MB/min`` (served by the busiest replica of a board key), ``rounds/min`` (a peer's round
counter), ``averaged/peer/min`` (contributions that went into a group's average; at most 60 / (H x step s), 12
here), ``states at lead`` (distinct shared states among the peers at the leading round: groups that never met
apply different averages).

``--virtual`` runs the pure-Python model of :mod:`cotrain.averaging.simulation` instead: hundreds of virtual peers
(no training, no network) deciding with the node's own round functions on a modelled board, once with the board as
one key and once sharded (``--shards``, "auto" by default there), and reports how groups formed and what the board
costs a node (DHT bytes a minute, by a Kademlia traffic model) and its busiest replica.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (Swarm, bench_parser, default_text, final_checkpoint, interruptible, lstm_config,  # noqa: E402
                    print_table, work_folder, write_json)

from cotrain.averaging.simulation import SimConfig, simulate  # noqa: E402
from cotrain.checkpoint import load_checkpoint  # noqa: E402
from cotrain.config import RunConfig  # noqa: E402
from cotrain.evaluation import evaluate_state  # noqa: E402
from cotrain.footprint import footprint  # noqa: E402


def shards_for(args, nodes: int) -> int:
    """--shards: a count, or "auto": shards of about twice the group (averaging.board_shards' advice)."""
    if args.shards == "auto":
        return max(1, nodes // (2 * max(1, args.group)))
    return int(args.shards)


def make_config(args, nodes: int) -> RunConfig:
    if args.model == "demo":  # the model, sequence length and batch of `cotrain demo` (the defaults of a run config)
        default = RunConfig()
        hidden = default.model.hidden_size
        shape = dict(embed_dim=default.model.embed_dim, layers=default.model.num_layers,
                     seq_len=default.data.seq_len, batch_size=default.data.batch_size)
    else:
        hidden, shape = args.hidden, dict(embed_dim=16, layers=1, seq_len=32, batch_size=8)
    return lstm_config(
        "scale", args.data, hidden, **shape,
        optimizer={"lr": 3e-3, "grad_clip": 1.0},
        averaging={"strategy": "diloco", "inner_steps": args.inner_steps, "target_group_size": args.group,
                   "group_formation": args.formation, "board_shards": shards_for(args, nodes),
                   "group_rounds": args.group_rounds,
                   "state_averaging": args.state_averaging,
                   "progress_interval": progress_interval(args, nodes), "matchmaking_time": 3.0,
                   "request_timeout": 2.0,
                   "round_wait": 10.0, "allreduce_timeout": 60.0},
        compression={"kind": "none"},
        # --unit-kb: with 128 KB units tinyshakespeare is 9 units, and half of 16 nodes waited, paused, for work
        coordinator={"heartbeat_interval_s": args.heartbeat_interval, "lost_after_missed": 30,
                     "eval_bytes": 32768, "unit_bytes": unit_kb(args, nodes) * 1024})


def progress_interval(args, nodes: int) -> float:
    """--progress-interval, or "auto": 1 s up to 8 nodes, nodes / 8 s beyond. Every node publishes its record and
    reads its shard every interval, and on one machine all their DHT processes and libp2p daemons share its cores:
    32 nodes at 1 s spent 1.3 of the 2 cores on the board (DHT processes 0.76, daemons 0.51), their training 0.55."""
    if args.progress_interval == "auto":
        return max(1.0, nodes / 8)
    return float(args.progress_interval)


def unit_kb(args, nodes: int) -> int:
    """--unit-kb, or "auto": at most 128 KB, and at least two units of the corpus a node (a node with no free unit
    waits for one, paused: 32 nodes on tinyshakespeare's 1.1 MB in 128 KB units had 16 of them waiting)."""
    if args.unit_kb != "auto":
        return int(args.unit_kb)
    return max(4, min(128, Path(args.data).stat().st_size // 1024 // (2 * nodes)))


def cpu_per_node(args) -> float:
    """--cpu-per-node in CPUs (0: no limit). "auto": 90% of the CPUs this bench may use over the largest swarm, the
    same at every size, so that a round at 4 nodes and at 32 compares what the swarm's size costs, not how thinly
    the machine's cores are spread (without a limit 4 nodes on 2 cores take half a core each, 32 a sixteenth)."""
    from cotrain.cli.launch import machine_cpus

    if args.cpu_per_node == "off":
        return 0.0
    if args.cpu_per_node == "auto":
        return round(0.9 * machine_cpus() / max(args.nodes), 4)
    value = float(args.cpu_per_node)
    if not value > 0:
        raise SystemExit(f"--cpu-per-node: must be > 0, auto or off, got {args.cpu_per_node}")
    return value


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def cpu_split(procs) -> tuple[float, float]:
    """CPU seconds so far of the nodes' own processes (training, board, exchange) and of what they started (hivemind's
    DHT process, the libp2p daemon), summed over the nodes."""
    trees = sum(footprint(p.pid).cpu_s for p in procs)
    own = sum(footprint(p.pid, descendants=False).cpu_s for p in procs)
    return own, trees - own


def one_run(args, nodes: int) -> dict:
    cfg = make_config(args, nodes)
    names = [f"node-{i}" for i in range(nodes)]
    with work_folder("cotrain-scale-", keep=args.keep) as tmp, \
            Swarm(cfg, tmp, nodes=nodes, zygote=args.zygote == "on") as swarm:
        started = time.monotonic()
        # each waits for a few peers, not all: on two cores a board read of 16 peers took seconds and came back
        # with some of them, and nodes waiting for all waited out --wait-peers' 5 minutes
        limit = ["--cpu-limit", f"{args.cpu_per_node:g}"] if args.cpu_per_node else []
        procs = [swarm.start_node(name, ["--wait-peers", str(min(nodes, 8)), *limit]) for name in names]
        deadline = started + args.timeout
        first: dict[str, tuple[int, float, float]] = {}  # node -> (round, wall_s, compute_s) once all started
        rtts: list[float] = []
        rows: dict[str, object] = {}
        warm_at = coordinator_cpu0 = None
        costs: list = []
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError(f"not every node had averaged once after {args.timeout:.0f}s" if warm_at is None
                                   else f"the budget was not reached in {args.timeout:.0f}s")
            dead = [p.name for p in procs if not p.alive()]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited (logs in {tmp}; --keep keeps them)")
            rows = {n.node_name: n.metrics for n in swarm.health().nodes}
            # every node past its first round, averaged or resynced (at 32 nodes some only ever caught up by
            # downloading the state for their first rounds)
            if warm_at is None and len(rows) == nodes and all(m.round >= 1 for m in rows.values()):
                warm_at = time.monotonic()
                coordinator_cpu0 = footprint(swarm.proc.pid).cpu_s
                node_cpu0 = cpu_split(procs)
                first = {name: (m.round, m.wall_s, m.compute_s) for name, m in rows.items()}
                print(f"  {nodes} nodes past their first round after {warm_at - started:.0f}s", flush=True)
            if warm_at is not None:
                rtts += [m.heartbeat_ms for m in rows.values() if m.heartbeat_ms > 0]
                if not costs:  # once, while they train: the node processes' trees as this bench sees them
                    costs = [footprint(p.pid) for p in procs]
            samples = sum(m.samples_local for m in rows.values())
            if warm_at is not None and samples >= args.samples and statistics.median(
                    m.round - first[name][0] for name, m in rows.items() if name in first) >= args.rounds:
                break  # the budget spent, and rounds enough since the start to time one
            time.sleep(2.0)
        window = time.monotonic() - warm_at
        coordinator_cpu = (footprint(swarm.proc.pid).cpu_s - coordinator_cpu0) / window
        own_cpu, helpers_cpu = (round((b - a) / window / nodes, 4) for a, b in zip(node_cpu0, cpu_split(procs)))
        per_round = [(m.wall_s - first[name][1]) / (m.round - first[name][0]) for name, m in rows.items()
                     if m.round > first[name][0]]
        # what a round took beyond the node's own steps (meeting, all-reduce, waiting for groupmates): the part of a
        # round that is the swarm's, where round_s also grows with the steps' time as more nodes share the cores
        overhead = [((m.wall_s - first[name][1]) - (m.compute_s - first[name][2])) / (m.round - first[name][0])
                    for name, m in rows.items() if m.round > first[name][0]]
        per_step = window * nodes / max(1, sum(m.step for m in rows.values()))
        completed = sum(m.rounds_completed for m in rows.values())
        partial = sum(m.partial_rounds for m in rows.values())
        pss = statistics.mean(m.memory_bytes for m in rows.values()) / 2**20
        codes = swarm.stop_nodes()
        if any(code not in (0, None) for code in codes):
            raise RuntimeError(f"exit codes {codes} (logs in {tmp}; --keep keeps them)")
        final = final_checkpoint(tmp, names)
        metrics = evaluate_state(cfg, final.model_state(), max_bytes=args.eval_bytes)
        lasts = [load_checkpoint(tmp / name / "last.safetensors").metadata for name in names]
        resyncs = sum(int(m.get("resyncs", 0)) for m in lasts)
        states_averaged = sum(int(m.get("states_averaged", 0)) for m in lasts)
        board_reads = sum(int(m.get("board_reads", 0)) for m in lasts)
        board_reads_skipped = sum(int(m.get("board_reads_skipped", 0)) for m in lasts)
    round_s = statistics.median(per_round) if per_round else float("nan")
    return dict(nodes=nodes, group=args.group, model=args.model, zygote=args.zygote, formation=args.formation,
                cpu_per_node=args.cpu_per_node, group_rounds=args.group_rounds,
                board_shards=cfg.averaging.board_shards, progress_interval=cfg.averaging.progress_interval,
                unit_bytes=cfg.coordinator.unit_bytes,
                state_averaging=args.state_averaging, resyncs=resyncs, states_averaged=states_averaged,
                board_reads=board_reads, board_reads_skipped=board_reads_skipped,
                round_s=round_s, round_overhead_s=statistics.median(overhead) if overhead else float("nan"),
                rounds_per_min=60.0 / round_s if per_round else 0.0, step_s=per_step, partial_rounds=partial,
                rounds_completed=completed,
                partial_fraction=partial / max(1, completed),
                rss_mb_per_node=statistics.mean(c.rss_bytes for c in costs) / 2**20 if costs else float("nan"),
                pss_mb_per_node=pss,
                processes_per_node=statistics.mean(c.processes for c in costs) if costs else 0,
                coordinator_cpu=coordinator_cpu, node_cpu=own_cpu, dht_daemon_cpu=helpers_cpu,
                heartbeat_p99_ms=percentile(rtts, 0.99),
                val_loss=metrics["val_loss"], val_bpc=metrics.get("val_bpc"), samples=samples,
                window_s=window, final_round=final.round)


def virtual_runs(args) -> None:
    runs = []
    for peers in args.virtual:
        for shards in sorted({1, shards_for(args, peers)}):
            cfg = SimConfig(peers=peers, shards=shards, group=args.group, inner_steps=args.inner_steps,
                            progress_interval=progress_interval(args, 1), duration_s=args.virtual_seconds,
                            state_averaging=args.state_averaging, group_rounds=args.group_rounds)
            started = time.monotonic()
            result = simulate(cfg)
            row = dict(vars(result), sim_wall_s=time.monotonic() - started, group=args.group,
                       inner_steps=args.inner_steps, step_s=cfg.step_s, duration_s=cfg.duration_s)
            runs.append(row)
            print(f"  {peers} virtual peers, {shards} shard(s): {row['dht_bytes_per_node_min'] / 1e6:.2f} MB a node "
                  f"a minute ({row['sim_wall_s']:.0f}s to simulate)", flush=True)
    print_table(f"Virtual peers on a modelled board, groups of {args.group}, H={args.inner_steps}, "
                f"{args.virtual_seconds:g}s simulated",
                ["peers", "shards", "records/read", "DHT MB/node/min", "busiest MB/min", "rounds/min",
                 "averaged/peer/min", "group size", "failed meetings", "resyncs", "alone", "states at lead"],
                [[r["peers"], r["shards"], r["records_per_read"], r["dht_bytes_per_node_min"] / 1e6,
                  r["busiest_node_bytes_min"] / 1e6, r["rounds_per_min"], r["averaged_per_peer_min"], r["group_size"],
                  r["failed_meetings"], r["resyncs"], r["alone"], r["states_at_end"]] for r in runs])
    write_json(args.json, {"virtual": runs, "group": args.group, "shards": args.shards,
                           "group_rounds": args.group_rounds,
                           "inner_steps": args.inner_steps, "model": "cotrain.averaging.simulation"})


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16, 32], help="swarm sizes")
    parser.add_argument("--group", type=int, default=4, help="averaging.target_group_size at every size")
    parser.add_argument("--samples", type=int, default=100_000, help="samples the nodes take together, per run")
    parser.add_argument("--hidden", type=int, default=64, help="LSTM hidden size (--model small)")
    parser.add_argument("--model", default="small", choices=["small", "demo"],
                        help="small: a 1-layer LSTM of --hidden, sequences of 32, batches of 8; demo: cotrain demo's "
                             "(2x256 LSTM, sequences of 128, batches of 16)")
    parser.add_argument("--zygote", default="on", choices=["on", "off"],
                        help="on: fork the nodes from one process that loaded torch and hivemind once "
                             "(cotrain.cli.zygote), as cotrain demo does; off: a new Python a node")
    parser.add_argument("--cpu-per-node", default="off",
                        help='CPU time each node may use, all its processes (cotrain node join --cpu-limit: a cgroup '
                             'quota; needs root): a number of CPUs, "auto" (the same at every size: 90%% of this '
                             'machine\'s CPUs over the largest --nodes, as if each node had a small machine of its own), '
                             'or "off" (the nodes share the cores as the kernel schedules them)')
    parser.add_argument("--inner-steps", type=int, default=20, help="local steps per round (H)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds the median node must average after all nodes are in, whatever the budget: the "
                             "rounds `round s` times")
    parser.add_argument("--formation", default="board", choices=["board", "board_only", "matchmaking"],
                        help="averaging.group_formation (board_only: no hivemind averager process)")
    parser.add_argument("--shards", default=None,
                        help='averaging.board_shards: a count, or "auto" (nodes / (2 x group), at least 1); default 1, '
                             'and "auto" with --virtual (which runs one key too, side by side)')
    parser.add_argument("--group-rounds", type=int, default=1,
                        help="averaging.group_rounds: rounds a group stays together (1: planned afresh every round)")
    parser.add_argument("--state-averaging", action="store_true",
                        help="averaging.state_averaging: groups whose members' states differ average them")
    parser.add_argument("--progress-interval", default="auto",
                        help='averaging.progress_interval in seconds, or "auto" (1 s, nodes / 8 s beyond 8 nodes)')
    parser.add_argument("--unit-kb", default="auto",
                        help='coordinator.unit_bytes in KB, or "auto" (128 KB, smaller when the corpus would not give '
                             'each node two units: a node without one waits)')
    parser.add_argument("--heartbeat-interval", type=float, default=2.0)
    parser.add_argument("--eval-bytes", type=int, default=65536, help="validation bytes the final model is scored on")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds a run may take")
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders (logs, state)")
    parser.add_argument("--virtual", type=int, nargs="+", default=None,
                        help="virtual peers instead of real nodes (cotrain.averaging.simulation), e.g. 100 300 1000")
    parser.add_argument("--virtual-seconds", type=float, default=60.0, help="seconds of swarm time to simulate")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.shards is None:
        args.shards = "auto" if args.virtual else "1"
    if args.virtual:
        return virtual_runs(args)
    args.data = args.data or default_text()
    args.cpu_per_node = cpu_per_node(args)
    runs = []
    try:
        with interruptible():
            for nodes in args.nodes:
                try:
                    row = one_run(args, nodes)
                except RuntimeError as e:  # a size this machine cannot run: said in the table, the others go on
                    print(f"  {nodes} nodes: {e}", flush=True)
                    runs.append(dict(nodes=nodes, group=args.group, formation=args.formation, error=str(e)))
                    continue
                runs.append(row)
                print(f"  {nodes} nodes: round {row['round_s']:.2f}s, {row['pss_mb_per_node']:.0f} MB a node, val "
                      f"loss {row['val_loss']:.4f}", flush=True)
    except KeyboardInterrupt:
        print("interrupted: the runs so far", file=sys.stderr)
    print_table(f"A swarm on this machine, groups of {args.group} formed by {args.formation}, {args.samples} samples a "
                f"run, the {args.model} model, nodes "
                f"{'forked from one zygote' if args.zygote == 'on' else 'one Python each'}, "
                + (f"{args.cpu_per_node:g} CPUs a node" if args.cpu_per_node else "no CPU limit"),
                ["nodes", "shards", "round s", "of which not stepping", "rounds/min", "step s", "partial", "resyncs",
                 "states averaged", "board reads/skipped",
                 "PSS MB", "RSS MB", "processes", "CPU node/DHT+daemon", "coord CPU", "heartbeat p99 ms", "val loss"],
                [[r["nodes"], r["board_shards"], r["round_s"], r["round_overhead_s"], r["rounds_per_min"], r["step_s"],
                  f"{r['partial_rounds']}/{r['rounds_completed']}", r["resyncs"], r["states_averaged"],
                  f"{r['board_reads']}/{r['board_reads_skipped']}",
                  r["pss_mb_per_node"], r["rss_mb_per_node"],
                  r["processes_per_node"], f"{r['node_cpu']:.4f}/{r['dht_daemon_cpu']:.4f}", r["coordinator_cpu"],
                  r["heartbeat_p99_ms"], r["val_loss"]]
                 if "error" not in r else [r["nodes"], "", "did not run: " + r["error"][:60]] + [""] * 14
                 for r in runs])
    write_json(args.json, {"runs": runs, "group": args.group, "formation": args.formation, "shards": args.shards,
                           "samples": args.samples, "rounds": args.rounds, "hidden": args.hidden,
                           "inner_steps": args.inner_steps,
                           "model": args.model, "zygote": args.zygote, "cpu_per_node": args.cpu_per_node})


if __name__ == "__main__":
    main()

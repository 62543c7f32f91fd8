"""Nodes sharing one machine: does each take every core, or do they divide them? Local steps per second.

    python bench/cores.py [--nodes 1 2 3] [--warmup 15] [--window 30] [--hidden 256] [--layers 2] [--json FILE]

For each node count N, one after another on this machine, a coordinator and N nodes train the same byte-level LSTM
on the same text (tinyshakespeare), started two ways:

- ``torch default``: every node with as many torch threads as torch takes by default in a fresh process (the
  machine's cores, whatever the affinity: what a node ran before it counted its CPUs, and what several nodes started
  with ``cotrain node join`` defaults on one machine ran): N x that many threads on the machine's cores.
- ``divided``: the flags :func:`cotrain.cli.launch.cpu_shares` gives the N nodes (the demo's and the benches'), a
  disjoint slice of the CPUs each, or one thread each when the nodes outnumber the CPUs.
- ``divided, unpinned``: the same threads, without pinning (``cpu_shares(..., pin=False)``): the kernel places
  them, and may move a node off a core that other programs keep busy.

Rounds never come within the measurement (``inner_steps`` far above the steps taken), so the figures are the nodes'
compute alone, with no waiting for peers. Once every node has reported a step, the bench waits ``--warmup`` s more,
then takes each node's local steps over ``--window`` s from its heartbeats (``step`` and ``wall_s`` as the node
reports them to the coordinator, every second). Per run: the threads and CPUs of each node, steps/s per node (mean
and slowest), the swarm's steps/s (the nodes' sum) and ``per node vs alone``: a node's steps/s over that of one node
alone with torch's default threads (the first run when ``--nodes`` starts with 1).

The machine is shared with whatever else runs on it: run it on a quiet machine, and compare runs of one invocation.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (Swarm, bench_parser, default_text, interruptible, lstm_config, print_table,  # noqa: E402
                    work_folder, write_json)

from cotrain.cli.launch import cpu_shares, machine_cpus, wait_for  # noqa: E402

MODES = ("torch default", "divided", "divided, unpinned")


def torch_default_threads() -> int:
    """The intra-op threads torch takes in a process that never set them (this one sets none)."""
    import torch

    return torch.get_num_threads()


def node_flags(mode: str, nodes: int, default_threads: int) -> list[list[str]]:
    if mode == "torch default":
        return [["--threads", str(default_threads)] for _ in range(nodes)]
    return [share or ["--threads", "0"] for share in cpu_shares(nodes, pin=mode == "divided")]


def describe(flags: list[str]) -> tuple[str, str]:
    """(threads, CPUs) a node's flags give it, for the table ("auto" when the node chooses)."""
    threads = flags[flags.index("--threads") + 1] if "--threads" in flags else "0"
    cpus = flags[flags.index("--cpus") + 1] if "--cpus" in flags else "all"
    return ("auto" if threads == "0" else threads), cpus


def heartbeats(swarm: Swarm) -> dict[str, tuple[int, float]]:
    """Each node's last reported (local steps, seconds since it began training)."""
    return {row["name"]: (int(row.get("step", 0)), float(row.get("wall_s", 0.0))) for row in swarm.node_rows()}


def one_run(args, mode: str, nodes: int, default_threads: int) -> dict:
    cfg = lstm_config("cores", args.data, args.hidden, layers=args.layers, seq_len=args.seq_len,
                      batch_size=args.batch_size,
                      averaging={"inner_steps": 1_000_000},  # no round within the window: compute only
                      coordinator={"heartbeat_interval_s": 1.0})
    flags = node_flags(mode, nodes, default_threads)
    names = [f"node-{i}" for i in range(nodes)]
    with work_folder("cotrain-cores-", keep=args.keep) as work, Swarm(cfg, work) as swarm:
        for name, extra in zip(names, flags):
            swarm.start_node(name, extra)

        def all_stepping():
            beats = heartbeats(swarm)
            return len(beats) == nodes and all(step > 0 for step, _ in beats.values())

        wait_for(all_stepping, 300, interval=1.0, what=f"{nodes} node(s) to take a step", procs=swarm.nodes)
        time.sleep(args.warmup)
        first = heartbeats(swarm)
        time.sleep(args.window)
        last = heartbeats(swarm)
        for proc in swarm.nodes:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited during the measurement; see {proc.log_path}")
    rates = []
    for name in names:
        (s0, w0), (s1, w1) = first[name], last[name]
        rates.append((s1 - s0) / (w1 - w0) if w1 > w0 else 0.0)
    threads, cpus = zip(*(describe(f) for f in flags))
    return dict(mode=mode, nodes=nodes, node_flags=flags, threads=list(threads), cpus=list(cpus),
                steps_per_s=rates, mean_steps_per_s=statistics.fmean(rates), min_steps_per_s=min(rates),
                swarm_steps_per_s=sum(rates))


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3], help="node counts to run, in order")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--repeats", type=int, default=1, help="run every (nodes, mode) this many times, "
                        "alternating the modes")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds after every node's first step")
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--keep", action="store_true", help="keep the work folders (logs)")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()
    args.data = args.data or default_text()
    if min(args.nodes) < 1:
        raise SystemExit("--nodes: each must be >= 1")
    default_threads = torch_default_threads()
    cpus = machine_cpus()
    print(f"{cpus} CPU(s) to use here; torch's default: {default_threads} thread(s) per process; "
          f"LSTM {args.layers}x{args.hidden}, batch {args.batch_size}x{args.seq_len}; "
          f"{args.warmup:g} s warm-up, {args.window:g} s measured per run", flush=True)
    # a mode whose flags are another's for that many nodes (unpinned for one node, or more nodes than CPUs) is
    # run once, as that one
    plan = []
    for nodes in args.nodes:
        modes = [m for m in args.modes if m != "divided, unpinned" or "divided" not in args.modes
                 or node_flags(m, nodes, default_threads) != node_flags("divided", nodes, default_threads)]
        plan += [(nodes, m) for _ in range(args.repeats) for m in modes]
    runs = []
    try:
        with interruptible():
            for nodes, mode in plan:
                run = one_run(args, mode, nodes, default_threads)
                print(f"{mode}, {nodes} node(s): {', '.join(f'{r:.2f}' for r in run['steps_per_s'])} steps/s",
                      flush=True)
                runs.append(run)
    except KeyboardInterrupt:
        print("interrupted: the runs so far", file=sys.stderr)
    alone = [r["mean_steps_per_s"] for r in runs if r["nodes"] == 1 and r["mode"] == "torch default"]
    alone = statistics.fmean(alone) if alone else None
    for r in runs:
        r["per_node_vs_alone"] = r["mean_steps_per_s"] / alone if alone else None
    print_table("local steps per second, nodes sharing this machine",
                ["mode", "nodes", "threads/node", "cpus/node", "steps/s/node", "slowest", "swarm steps/s",
                 "per node vs alone"],
                [[r["mode"], r["nodes"], "/".join(r["threads"]), " ".join(r["cpus"]), r["mean_steps_per_s"],
                  r["min_steps_per_s"], r["swarm_steps_per_s"],
                  float("nan") if r["per_node_vs_alone"] is None else r["per_node_vs_alone"]] for r in runs])
    write_json(args.json, dict(machine_cpus=cpus, torch_default_threads=default_threads,
                               model=dict(kind="lstm", hidden=args.hidden, layers=args.layers),
                               batch_size=args.batch_size, seq_len=args.seq_len, warmup_s=args.warmup,
                               window_s=args.window, runs=runs))
    return 0 if runs and len(runs) == len(plan) else 1


if __name__ == "__main__":
    sys.exit(main())

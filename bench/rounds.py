"""What a round costs beyond moving its bytes: round time against payload size and group size, on loopback, with
the group formed from the progress board (``group_formation = "board"``) and by hivemind's matchmaking.

    python bench/rounds.py [--nodes 2 4] [--hidden 32 256 1024] [--formations board ddp] [--rounds 60] [--json FILE]

Every run is a real swarm on this machine (coordinator and node processes) training a byte-level LSTM with one
local step per round (DiLoCo, H=1, no compression), so that a round is almost all averaging. The model's hidden
size sets the payload (the fp32 pseudo-gradient each node contributes). Each node writes its heartbeat figures to
``STATE_DIR/status.json`` as its rounds go (at most every half second); the bench reads them and takes, between the
first round it saw from ``--warmup`` on and the last, the wall time per round and the part of it that is not computing (``overhead``:
matchmaking or the board's meeting, the all-reduce, the outer step), split further into the meeting (which includes
waiting for the last groupmate to finish its step: on a shared machine, the others' compute) and the all-reduce, as
the nodes report them. The fixed part of a round, all but moving the bytes, is where the overhead against the payload
meets zero payload: with two payloads or more a row of the second table fits a line through a formation's and group
size's rows (least squares: fixed ms + ms per MB x payload MB); the overhead at the smallest payload also moves its
bytes. A payload small enough
for one reducer (``averaging.min_part_values``) is averaged at the meeting itself, by the group's host
(``cotrain.averaging.allreduce.hosted``): its all-reduce column is then only the decoding of the host's result.

On a machine shared by
the whole swarm the wall time of a round is set by the CPU it costs: ``cpu ms`` is the CPU time a node spent per
round, its own process and what it started (hivemind's DHT process, the libp2p daemon), as the node reads it from
``/proc`` with its figures (``helpers ms`` is the latter part). ``nodes x cpu ms / cores`` is the least a round can take here.

``--formations ddp`` runs torch DDP instead (gloo, the ranks of bench/ddp_worker.py, one torch thread each) on the
same model, data and batches: gradients averaged at every step, as a round at H=1 averages the update. Its step is
the round it is compared with (``vs ddp``: a row's round over DDP's step at the same size), and its CPU a rank-step
is read the same way.
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (Swarm, bench_parser, default_text, lstm_config, print_table, stop_all, stopped_on_exit,  # noqa: E402
                    work_folder, write_json)

from cotrain.config import AveragingConfig, RunConfig  # noqa: E402
from cotrain.footprint import cpu_seconds  # noqa: E402
from cotrain.models import build_model, count_parameters  # noqa: E402


def make_config(args, nodes: int, hidden: int, formation: str) -> RunConfig:
    return lstm_config(
        "rounds", args.data, hidden, embed_dim=32, seq_len=16, batch_size=4,
        optimizer={"lr": 1e-3, "grad_clip": 1.0},
        averaging={"strategy": "diloco", "inner_steps": 1, "group_formation": formation,
                   "matchmaking_time": args.matchmaking_time, "request_timeout": args.matchmaking_time * 0.75,
                   "progress_interval": args.progress_interval, "target_group_size": nodes, "round_wait": 30.0,
                   "allreduce_timeout": 120.0},
        compression={"kind": "none"})


def read_status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet
        return {}


def snapshot(status: dict) -> tuple[float, ...]:
    """A node's running totals as its status.json gives them: (wall, compute, meeting, all-reduce, CPU of the node,
    CPU of its process tree), seconds."""
    return (status["wall_s"], status["compute_s"], status["meet_s"], status["allreduce_s"], status["cpu_s"],
            status["cpu_tree_s"])


def one_run(args, nodes: int, hidden: int, formation: str) -> dict:
    cfg = make_config(args, nodes, hidden, formation)
    payload = 4 * count_parameters(build_model(cfg))
    names = [f"node-{i}" for i in range(nodes)]
    # round -> (wall_s, compute_s, meet_s, allreduce_s, cpu_s of the node, of its process tree) as the node reported
    # them when it got to the round
    seen: dict[str, dict[int, tuple[float, ...]]] = {name: {} for name in names}
    groups = {name: (0, 0) for name in names}  # (formed from the board, matchmade), as each node last reported
    with work_folder("cotrain-rounds-", keep=args.keep) as tmp, Swarm(cfg, tmp) as swarm:
        procs = [swarm.start_node(name, ["--threads", "1", "--wait-peers", str(nodes), "--max-rounds",
                                         str(args.rounds)]) for name in names]
        deadline = time.monotonic() + args.timeout
        # looked at ten times a second: the bench shares the machine with the swarm it measures (reading every
        # status file 50 times a second, and the CPU of every process tree at every round, took 0.16 of the 2 cores
        # at 8 nodes). The figures are running totals, so two snapshots a node, far apart, give the rounds between
        while any(p.alive() for p in procs) and time.monotonic() < deadline:
            for name, proc in zip(names, procs):
                status = read_status(tmp / name / "status.json")
                if status and status["round"] not in seen[name]:
                    seen[name][status["round"]] = snapshot(status)
                    groups[name] = (status["groups_from_board"], status["groups_matchmade"])
            time.sleep(0.1)
        codes = swarm.stop_nodes()
        for name in names:  # the figures each node left with (written before its DHT process and daemon stop)
            status = read_status(tmp / name / "status.json")
            if status:
                seen[name][status["round"]] = snapshot(status)
                groups[name] = (status["groups_from_board"], status["groups_matchmade"])
    if any(codes):
        raise RuntimeError(f"node exit codes {codes} (run again with --keep to read their logs)")
    per_round, overhead, meet, allreduce, cpu, helpers = [], [], [], [], [], []
    for name in names:
        rounds = sorted(r for r in seen[name] if r >= args.warmup)
        if len(rounds) < 2:
            raise RuntimeError(f"{name}: saw rounds {sorted(seen[name])}; raise --rounds above --warmup + 1")
        (w0, c0, m0, a0, o0, t0), (w1, c1, m1, a1, o1, t1) = seen[name][rounds[0]], seen[name][rounds[-1]]
        count = rounds[-1] - rounds[0]
        per_round.append((w1 - w0) / count)
        overhead.append(((w1 - c1) - (w0 - c0)) / count)
        meet.append((m1 - m0) / count)
        allreduce.append((a1 - a0) / count)
        cpu.append((t1 - t0) / count)
        helpers.append(((t1 - o1) - (t0 - o0)) / count)
    board, matchmade = map(sum, zip(*groups.values()))
    return dict(formation=formation, nodes=nodes, hidden=hidden, payload_bytes=payload,
                round_s=sum(per_round) / nodes, overhead_s=sum(overhead) / nodes, meet_s=sum(meet) / nodes,
                allreduce_s=sum(allreduce) / nodes, cpu_s=sum(cpu) / nodes, helpers_cpu_s=sum(helpers) / nodes,
                groups_from_board=board, groups_matchmade=matchmade)


def ddp_run(args, nodes: int, hidden: int) -> dict:
    """The same model, data and batches in ``nodes`` ranks of torch DDP (gloo, bench/ddp_worker.py): gradients
    averaged at every step, as the swarm's rounds at H=1 average the update. A step's wall time is its round. Rank 0
    evaluates every ``--ddp-eval-every`` steps and writes when (its evaluations taken out); the figures are taken
    between its second evaluation and its last, like the nodes' between ``--warmup`` and the last round."""
    from wan import NsProc  # a command in its own process group, logged to a file

    cfg = make_config(args, nodes, hidden, "board")
    payload = 4 * count_parameters(build_model(cfg))
    seen: list[tuple[int, float, float]] = []  # (step, elapsed_s, CPU seconds of every rank) at each evaluation
    with work_folder("cotrain-rounds-ddp-", keep=args.keep) as tmp, stopped_on_exit(timeout=10) as ranks:
        (tmp / "run.toml").write_text(cfg.to_toml())
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            master = f"127.0.0.1:{free.getsockname()[1]}"
        out, t0 = tmp / "evals.jsonl", time.time()
        for rank in range(nodes):
            ranks.append(NsProc(f"ddp-{rank}", [
                sys.executable, str(Path(__file__).resolve().parent / "ddp_worker.py"), "--config",
                str(tmp / "run.toml"), "--rank", str(rank), "--world-size", str(nodes), "--master", master,
                "--t0", repr(t0), "--budget-s", str(args.ddp_budget_s), "--target-val-loss", "0",
                "--eval-every", str(args.ddp_eval_every), "--out", str(out)], tmp / f"ddp-{rank}.log"))
        deadline = time.monotonic() + args.timeout
        while any(p.alive() for p in ranks) and time.monotonic() < deadline:
            lines = out.read_text().splitlines() if out.exists() else []
            if len(lines) > len(seen) and lines[-1].endswith("}"):
                last = json.loads(lines[-1])
                seen.append((last["step"], last["elapsed_s"], sum(cpu_seconds(p.popen.pid)[1] for p in ranks)))
            if any(p.popen.poll() not in (None, 0) for p in ranks):
                break
            time.sleep(0.02)
        codes = stop_all(ranks, timeout=10)
        if any(codes) or len(seen) < 3:
            raise RuntimeError(f"ddp: exit codes {codes}, {len(seen)} evaluations (raise --ddp-budget-s); last "
                               f"lines of rank 0:\n{ranks[0].tail(1500)}")
    (s0, e0, c0), (s1, e1, c1) = seen[1], seen[-1]
    steps = s1 - s0
    return dict(formation="ddp", nodes=nodes, hidden=hidden, payload_bytes=payload, round_s=(e1 - e0) / steps,
                overhead_s=None, meet_s=None, allreduce_s=None, cpu_s=(c1 - c0) / steps / nodes, helpers_cpu_s=None,
                groups_from_board=0, groups_matchmade=0)


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4], help="group sizes (one group per run)")
    parser.add_argument("--hidden", type=int, nargs="+", default=[32, 256, 1024], help="LSTM sizes (payload)")
    parser.add_argument("--formations", nargs="+", default=["board", "matchmaking"],
                        choices=["board", "board_only", "matchmaking", "ddp"],
                        help="how groups form; ddp: torch DDP's ranks instead of nodes, side by side")
    parser.add_argument("--rounds", type=int, default=60,
                        help="rounds a run takes: nodes write their figures at most twice a second, so a run should "
                             "last a few seconds past --warmup (two nodes take about 12 ms a round)")
    parser.add_argument("--warmup", type=int, default=10, help="rounds left out of the figures (start-up)")
    parser.add_argument("--matchmaking-time", type=float, default=2.0)
    parser.add_argument("--progress-interval", type=float, default=AveragingConfig().progress_interval,
                        help="seconds between a node's board records and reads (the board's traffic is per second, "
                             "not per round: on a shared machine it takes CPU from the rounds)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders (logs, state)")
    parser.add_argument("--ddp-budget-s", type=float, default=45.0,
                        help="ddp: seconds a run takes from launch (8 ranks on 2 cores took 16 s to their first step)")
    parser.add_argument("--ddp-eval-every", type=int, default=50, help="ddp: steps between rank 0's evaluations")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every row this many times, taking turns, and report the median (at 8 nodes on 2 "
                             "cores one run of a row moved by 20%% from the next)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    args.data = args.data or default_text()
    runs = []
    for repeat in range(args.repeat):  # every row once, then again: rows of one repeat share the machine's mood
        for nodes in args.nodes:
            for hidden in args.hidden:
                for formation in args.formations:
                    run = (ddp_run(args, nodes, hidden) if formation == "ddp"
                           else one_run(args, nodes, hidden, formation))
                    runs.append(dict(run, repeat=repeat))
                    apart = ("" if run["overhead_s"] is None
                             else f", of which not computing {run['overhead_s'] * 1e3:7.1f} ms")
                    print(f"  {formation:11s} {nodes} nodes, {run['payload_bytes'] / 1e6:6.2f} MB: round "
                          f"{run['round_s'] * 1e3:7.1f} ms{apart}", flush=True)
    rows = median_rows(runs)

    def ms(value):
        return "-" if value is None else value * 1e3

    print_table(f"Round time on loopback, H=1, rounds {args.warmup}..{args.rounds}, the median of {args.repeat} "
                f"run(s) a row",
                ["formation", "nodes", "payload MB", "round ms", "range ms", "vs ddp", "overhead ms", "meeting ms",
                 "all-reduce ms", "cpu ms", "helpers ms", "board groups", "matchmade"],
                [[r["formation"], r["nodes"], r["payload_bytes"] / 1e6, ms(r["round_s"]),
                  f"{r['round_s_min'] * 1e3:.0f}-{r['round_s_max'] * 1e3:.0f}",
                  "-" if r["vs_ddp"] is None else r["vs_ddp"], ms(r["overhead_s"]), ms(r["meet_s"]),
                  ms(r["allreduce_s"]), ms(r["cpu_s"]), ms(r["helpers_cpu_s"]), r["groups_from_board"],
                  r["groups_matchmade"]]
                 for r in rows])
    fits = fixed_parts(rows)
    if fits:
        print_table("The fixed part of a round (all but moving the bytes): overhead = fixed + per MB x payload, least "
                    "squares over the rows above",
                    ["formation", "nodes", "payloads MB", "fixed ms", "ms per MB"],
                    [[f["formation"], f["nodes"], " ".join(f"{p:.2f}" for p in f["payloads_mb"]), f["fixed_s"] * 1e3,
                      f["s_per_mb"] * 1e3] for f in fits])
    write_json(args.json, {"rows": rows, "runs": runs, "fits": fits, "rounds": args.rounds, "warmup": args.warmup,
                           "repeat": args.repeat})


def fixed_parts(rows: list[dict]) -> list[dict]:
    """Per (formation, nodes) of ``rows`` with overheads at two payloads or more: the least-squares line of the
    overhead (s) against the payload (MB) -> its intercept ``fixed_s`` (a round's cost at no payload) and slope
    ``s_per_mb``."""
    groups: dict[tuple, list[tuple[float, float]]] = {}
    for r in rows:
        if r["overhead_s"] is not None:
            groups.setdefault((r["formation"], r["nodes"]), []).append((r["payload_bytes"] / 1e6, r["overhead_s"]))
    out = []
    for (formation, nodes), points in groups.items():
        xs = [x for x, _ in points]
        if len(set(xs)) < 2:
            continue
        mx, my = statistics.fmean(xs), statistics.fmean(y for _, y in points)
        slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
        out.append(dict(formation=formation, nodes=nodes, payloads_mb=sorted(xs), fixed_s=my - slope * mx,
                        s_per_mb=slope))
    return out


def median_rows(runs: list[dict]) -> list[dict]:
    """One row per (formation, nodes, hidden) of ``runs``: the median of each figure over its repeats (None stays
    None), the round's least and most, and ``vs_ddp``: the row's median round over DDP's at the same size."""
    rows: dict[tuple, list[dict]] = {}
    for run in runs:
        rows.setdefault((run["formation"], run["nodes"], run["hidden"]), []).append(run)
    out = []
    for (formation, nodes, hidden), same in rows.items():
        row = dict(same[0])
        row.pop("repeat", None)
        for name, value in same[0].items():
            if isinstance(value, float):
                row[name] = statistics.median(r[name] for r in same)
        rounds = [r["round_s"] for r in same]
        row.update(round_s_min=min(rounds), round_s_max=max(rounds), repeats=len(same))
        out.append(row)
    ddp = {(r["nodes"], r["hidden"]): r["round_s"] for r in out if r["formation"] == "ddp"}
    for row in out:
        row["vs_ddp"] = row["round_s"] / ddp[row["nodes"], row["hidden"]] if (row["nodes"], row["hidden"]) in ddp \
            else None
    return out


if __name__ == "__main__":
    main()

"""Does training go on while nodes keep dying? A swarm of 4 under a killer, next to a clean run of the same length.

    python bench/chaos.py [--nodes 4] [--duration 240] [--kill-every 15] [--json FILE]

Both runs are real swarms (coordinator and node processes on this machine) training the same char LSTM with DiLoCo
for the same wall time. In the chaos run a killer picks a random node every ``--kill-every`` seconds, kills it with
SIGKILL (mid-round or not, as a crash would) and starts it again at once with the same identity (state dir), so it
rejoins, downloads the swarm's state and catches up. At the end every node is stopped cleanly; the shared model of
the node with the most rounds is evaluated on the whole validation split (nats per character).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (BENCH_OPTIMIZER, LOCAL_TIMINGS, Swarm, bench_parser, cosine_schedule,  # noqa: E402
                    default_text, evaluate_state, final_checkpoint, lstm_config, print_table, stop_all, work_folder,
                    write_json)

from cotrain.config import RunConfig  # noqa: E402


def make_config(args) -> RunConfig:
    batch = 16
    return lstm_config(
        "chaos", args.data, args.hidden, batch_size=batch,
        optimizer=BENCH_OPTIMIZER,
        schedule=cosine_schedule(4000 * batch * args.nodes),  # over the swarm's samples: 4000 steps of every node
        averaging={"strategy": "diloco", "inner_steps": args.H, **LOCAL_TIMINGS, "round_wait": 10.0,
                   "allreduce_timeout": 20.0})


def train(args, swarm: Swarm, names: list[str], chaos: bool) -> tuple[float, int]:
    """Start the nodes, train for ``args.duration`` (under the killer if ``chaos``), stop them cleanly;
    -> (wall seconds, failures injected)."""
    rng = random.Random(args.seed)
    failures = 0

    def launch(i: int, first: bool):
        extra = ["--threads", "1", *(["--wait-peers", str(args.nodes)] if first else [])]
        return swarm.start_node(names[i], extra)

    nodes = {i: launch(i, first=True) for i in range(args.nodes)}
    started = time.monotonic()
    next_kill = started + args.kill_every
    while time.monotonic() - started < args.duration:
        time.sleep(0.5)
        for i, proc in nodes.items():
            if not proc.alive():
                raise RuntimeError(f"node-{i} exited by itself (code {proc.popen.returncode}); logs in {swarm.workdir}")
        # no kill in the last interval: the last victim has time to rejoin before everyone is stopped
        if chaos and time.monotonic() >= next_kill and time.monotonic() - started < args.duration - args.kill_every:
            victim = rng.randrange(args.nodes)
            nodes[victim].kill()
            failures += 1
            print(f"  t={time.monotonic() - started:5.0f}s  killed node-{victim} (kill -9), restarting it",
                  flush=True)
            nodes[victim] = launch(victim, first=False)
            next_kill += args.kill_every
    wall = time.monotonic() - started
    codes = dict(zip(nodes, stop_all(list(nodes.values()), 60)))
    if any(codes.values()):
        raise RuntimeError(f"node exit codes {codes}; logs in {swarm.workdir}")
    return wall, failures


def one_run(args, chaos: bool) -> dict:
    cfg = make_config(args)
    names = [f"node-{i}" for i in range(args.nodes)]
    with work_folder("cotrain-chaos-", keep=args.keep) as tmp:
        with Swarm(cfg, tmp) as swarm:
            wall, failures = train(args, swarm, names, chaos)
        final = final_checkpoint(tmp, names)
        metrics = evaluate_state(cfg, final.model_state())
    row = dict(run="chaos" if chaos else "clean", failures_injected=failures, rounds_completed=final.round,
               val_loss=metrics["val_loss"], wall_s=wall)
    print(f"  {row['run']:5}: {failures} failures, {final.round} rounds, val_loss {row['val_loss']:.4f}", flush=True)
    return row


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--duration", type=float, default=240.0, help="seconds of training per run")
    parser.add_argument("--kill-every", type=float, default=15.0, help="seconds between kills")
    parser.add_argument("--H", type=int, default=20, help="local steps per round")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0, help="seed of the killer's choices")
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders (logs)")
    parser.add_argument("--json", default=None, metavar="FILE", help="write the figures to FILE")
    args = parser.parse_args()
    if args.nodes < 2:
        parser.error("--nodes: at least 2")
    if args.duration <= 0 or args.kill_every <= 0:
        parser.error("--duration and --kill-every: must be > 0")
    args.data = args.data or default_text()

    print(f"chaos bench: {args.nodes} nodes for {args.duration:.0f}s, a kill every {args.kill_every:.0f}s", flush=True)
    chaos = one_run(args, chaos=True)
    clean = one_run(args, chaos=False)
    print_table(f"{args.nodes} nodes, {args.duration:.0f}s each: chaos against clean",
                ["run", "failures_injected", "rounds_completed", "val_loss", "wall_s"],
                [[r["run"], r["failures_injected"], r["rounds_completed"], r["val_loss"], r["wall_s"]]
                 for r in (chaos, clean)])
    write_json(args.json, {"failures_injected": chaos["failures_injected"],
                           "rounds_completed": chaos["rounds_completed"], "val_loss": chaos["val_loss"],
                           "clean_val_loss": clean["val_loss"], "clean_rounds_completed": clean["rounds_completed"],
                           "nodes": args.nodes, "duration_s": args.duration, "kill_every_s": args.kill_every})
    return 0


if __name__ == "__main__":
    sys.exit(main())

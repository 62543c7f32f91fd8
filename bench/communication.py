"""How many bytes does the swarm need? Data-parallel training against DiLoCo rounds with compressed updates.

    python bench/communication.py [--nodes 3] [--samples 57600] [--json FILE]

Every run trains the same char LSTM on the same data (tinyshakespeare) for the same total samples, as a real
swarm of coordinator and node processes on this machine:

- baseline: ``sync`` with uncompressed fp32 gradients averaged after every local batch (data-parallel training);
- ``diloco`` with H in {10, 50, 100} local steps per round, times compression in {none, fp16, int8, int4, topk,
  powersgd}, and the runs that aim at 1000x fewer bytes: H=150 (4 rounds in the default budget) with int8 and int4.

Columns: bytes each node actually sent for averaging (counted on the wire by the nodes), validation loss of the
shared model (nats per character), compute utilization (fraction of the nodes' wall time spent computing), and
the bytes ratio against the baseline.

The outer step defaults to lr 1.0 and Nesterov momentum 0.5 here rather than the product's DiLoCo defaults (0.7,
0.9, tuned in the paper for hundreds of rounds): this budget gives 4 to 60 rounds, too few for momentum 0.9 to
build up. Measured in-process on the bench's model (3 replicas, no compression, against data-parallel training with
the same samples): at H=125 and 500 steps a node, 0.7/0.9 ended 3.2% above the baseline's loss, 1.0/0.5 0.3%
below it; at H=150 and 600 steps, 1.0/0.5 0.4% below. ``--outer-lr 0.7 --outer-momentum 0.9``
runs the product's defaults. The defaults use a smaller LSTM (1 x 128) than bench/quality.py so that the
16 runs fit in about half an hour on 2 cores; ``--hidden 256 --layers 2 --seq-len 128 --samples 72000`` runs the
BASELINES.md model.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import bench_parser, default_text, lstm_config, print_table, run_swarm, write_json  # noqa: E402

from cotrain.config import RunConfig  # noqa: E402

COMPRESSIONS = ("none", "fp16", "int8", "int4", "topk", "powersgd")


def make_config(args, strategy: str, inner_steps: int, compression: str, steps_per_node: int) -> RunConfig:
    return lstm_config(
        "comm", args.data, args.hidden, embed_dim=64, layers=args.layers, seq_len=args.seq_len,
        batch_size=args.batch_size,
        optimizer={"lr": 3e-3, "min_lr": 3e-4, "decay_steps": steps_per_node, "grad_clip": 1.0},
        averaging={"strategy": strategy, "inner_steps": inner_steps, "outer_lr": args.outer_lr,
                   "outer_momentum": args.outer_momentum,
                   "matchmaking_time": 2.0, "request_timeout": 1.5, "progress_interval": 0.5,
                   "target_group_size": args.nodes, "round_wait": 0.0 if strategy == "sync" else 30.0},
        compression={"kind": compression, "topk_fraction": args.topk_fraction, "powersgd_rank": args.rank})


def one_run(args, strategy: str, inner_steps: int, compression: str) -> dict:
    steps_per_node = args.samples // (args.batch_size * args.nodes)
    rounds = max(1, steps_per_node // inner_steps)
    cfg = make_config(args, strategy, inner_steps, compression, rounds * inner_steps)
    run = run_swarm(cfg, args.nodes, ["--max-rounds", str(rounds)])
    sent = [n["bytes_sent"] for n in run.nodes]
    util = [n["compute_s"] / n["wall_s"] for n in run.nodes if n["wall_s"] > 0]
    row = dict(strategy=strategy, H=inner_steps, compression=compression,
               bytes_per_node=sum(sent) / len(sent), val_loss=run.metrics["val_loss"], wall_s=run.wall_s,
               compute_utilization=sum(util) / max(1, len(util)), samples=run.samples,
               partial_rounds=sum(n["partial_rounds"] for n in run.nodes))
    print(f"  {strategy:6} H={inner_steps:<3} {compression:8} bytes/node {row['bytes_per_node']:>12,.0f} "
          f"val_loss {row['val_loss']:.4f} util {row['compute_utilization']:.2f} wall {row['wall_s']:.0f}s",
          flush=True)
    return row


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--samples", type=int, default=57_600,
                        help="sequences in total, per run (default: 600 steps of each of 3 nodes)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--outer-lr", type=float, default=1.0)
    parser.add_argument("--outer-momentum", type=float, default=0.5)
    parser.add_argument("--topk-fraction", type=float, default=0.01)
    parser.add_argument("--rank", type=int, default=4, help="PowerSGD rank")
    parser.add_argument("--H", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--compression", nargs="+", default=list(COMPRESSIONS), choices=COMPRESSIONS)
    parser.add_argument("--also", nargs="*", default=["150:int8", "150:int4"], metavar="H:CODEC",
                        help="runs beyond the grid (default: the ones that aim at 1000x fewer bytes)")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    args.data = args.data or default_text()
    grid = list(itertools.product(args.H, args.compression))
    for item in args.also:
        h, _, codec = item.partition(":")
        if not h.isdigit() or int(h) < 1 or codec not in COMPRESSIONS:
            parser.error(f"--also: expected H:CODEC with CODEC one of {', '.join(COMPRESSIONS)}, got {item!r}")
        if (int(h), codec) not in grid:
            grid.append((int(h), codec))

    print("baseline: sync, fp32 gradients every step", flush=True)
    base = one_run(args, "sync", 1, "none")
    runs = []
    for inner_steps, compression in grid:
        row = one_run(args, "diloco", inner_steps, compression)
        row["bytes_ratio"] = base["bytes_per_node"] / max(1.0, row["bytes_per_node"])
        runs.append(row)
    rows = [["sync (baseline)", 1, "none", base["bytes_per_node"], base["val_loss"], 1.0,
             base["compute_utilization"], base["wall_s"], 1.0]]
    rows += [[r["strategy"], r["H"], r["compression"], r["bytes_per_node"], r["val_loss"],
              r["val_loss"] / base["val_loss"], r["compute_utilization"], r["wall_s"], r["bytes_ratio"]] for r in runs]
    print_table(f"communication: {args.nodes} nodes, LSTM {args.layers}x{args.hidden}, {args.samples} sequences",
                ["strategy", "H", "compression", "bytes/node", "val loss", "loss vs base", "compute util", "wall s",
                 "bytes ratio"], rows)
    ok = [r for r in runs if r["bytes_ratio"] >= 1000 and r["val_loss"] <= 1.02 * base["val_loss"]]
    names = ", ".join(f"H={r['H']} {r['compression']}" for r in ok) or "none"
    print(f"\nruns with >= 1000x fewer bytes and val loss within 2% of the baseline: {names}")
    write_json(args.json, {"baseline": {k: base[k] for k in ("bytes_per_node", "val_loss", "wall_s")},
                           "runs": [{k: r[k] for k in ("strategy", "H", "compression", "bytes_per_node", "val_loss",
                                                        "wall_s", "compute_utilization", "bytes_ratio")}
                                    for r in runs]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How many bytes does the swarm need? Data-parallel training against DiLoCo rounds with compressed updates.

    python bench/communication.py [--nodes 3] [--samples 57600] [--json FILE]

Every run trains the same char LSTM on the same data (tinyshakespeare) for the same total samples, as a real
swarm of coordinator and node processes on this machine:

- baseline: ``sync`` with uncompressed fp32 gradients averaged after every local batch (data-parallel training);
- ``diloco`` with H in {10, 50, 100} local steps per round, times compression in {none, fp16, int8, int4, topk,
  powersgd}, and the runs that aim at 1000x fewer bytes: H=150 (4 rounds in the default budget) with int8 and int4;
- with ``--sync-also``, more ``sync`` rows: other codecs, and ``averaging.overlap`` (each step's gradients averaged
  while the next step computes, applied a step late), e.g. ``--sync-also fp16 none:overlap fp16:overlap``.

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

    python bench/communication.py --long [--rounds 20] [--long-runs H:CODEC:OUTER ...] [--json FILE]

The long mode is the proof over a real run: an LSTM 2 x 512 (3.4M parameters; sequences of 32, batches of 16),
3 nodes, ``--rounds`` outer rounds (20) of every compressed row, against data-parallel fp32 training (``sync``,
H = 1) with the same samples. Its rows: dense DiLoCo (fp32, Nesterov outer step), and the sparse codec (64 of every
4096 values, 2 bits), top-k (1%) and PowerSGD (rank 4) under the outer error feedback (``averaging.outer =
"error_feedback"``: the unsent part, decayed by 0.95 a round, in place of outer momentum, outer SGD at lr 2
(``--feedback-lr``); kept in the local model, ``--error-buffer separate`` keeps it apart as SparseLoCo does), and
dense DiLoCo under the same outer step, to tell the codec's effect from the outer step's. Every row reports
bits per parameter per round, counted on the wire: the bytes a node sent averaging (the all-reduce pieces it
served), times 8, over the parameters and the rounds (for data-parallel training every step is a round). The JSON
has the short mode's structure plus a top-level ``params`` and, per run, ``rounds``, ``outer`` and
``bits_per_param_per_round``.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (BENCH_OPTIMIZER, LOCAL_TIMINGS, bench_parser, cosine_schedule, default_text,  # noqa: E402
                    lstm_config, print_table, run_swarm, write_json)

from cotrain.config import RunConfig  # noqa: E402
from cotrain.tasks import build_task  # noqa: E402

COMPRESSIONS = ("none", "fp16", "int8", "int4", "topk", "powersgd", "sparse")
SHORT_GRID = ("none", "fp16", "int8", "int4", "topk", "powersgd")
LONG_RUNS = ("30:none:nesterov", "30:none:error_feedback", "30:sparse:error_feedback", "30:topk:error_feedback",
             "30:powersgd:error_feedback")
OUTERS = ("nesterov", "error_feedback")


def make_config(args, strategy: str, inner_steps: int, compression: str, steps_per_node: int,
                outer: str = "nesterov", overlap: bool = False) -> RunConfig:
    feedback = outer == "error_feedback"
    return lstm_config(
        "comm", args.data, args.hidden, embed_dim=64, layers=args.layers, seq_len=args.seq_len,
        batch_size=args.batch_size,
        optimizer=BENCH_OPTIMIZER,
        # a cosine over the swarm's samples: steps_per_node steps of every node
        schedule=cosine_schedule(steps_per_node * args.batch_size * args.nodes),
        averaging={"strategy": strategy, "inner_steps": inner_steps,
                   "outer_lr": args.feedback_lr if feedback else args.outer_lr,
                   "outer_momentum": args.outer_momentum, "outer": outer, "error_decay": args.error_decay,
                   "error_buffer": args.error_buffer, "overlap": overlap,
                   # the sparse all-gather averages each position over its senders: mean (this bench's peers are
                   # trusted; clipped_mean is the robust choice), and so do the others here, to compare like with like
                   "aggregation": "mean", **LOCAL_TIMINGS,
                   "target_group_size": args.nodes, "round_wait": 0.0 if strategy == "sync" else 30.0},
        compression={"kind": compression, "topk_fraction": args.topk_fraction, "powersgd_rank": args.rank,
                     "sparse_chunk": args.sparse_chunk, "sparse_topk": args.sparse_topk,
                     "sparse_bits": args.sparse_bits})


def count_params(cfg: RunConfig) -> int:
    return sum(p.numel() for p in build_task(cfg).build_model().parameters())


def one_run(args, strategy: str, inner_steps: int, compression: str, outer: str = "nesterov",
            rounds: int = 0, overlap: bool = False) -> dict:
    steps_per_node = args.samples // (args.batch_size * args.nodes)
    rounds = rounds or max(1, steps_per_node // inner_steps)
    cfg = make_config(args, strategy, inner_steps, compression, rounds * inner_steps, outer, overlap)
    run = run_swarm(cfg, args.nodes, ["--max-rounds", str(rounds)])
    sent = [n["bytes_sent"] for n in run.nodes]
    util = [n["compute_s"] / n["wall_s"] for n in run.nodes if n["wall_s"] > 0]
    done = int(run.final["metadata"].get("round", rounds)) if run.final else rounds
    params = count_params(cfg)
    row = dict(strategy=strategy, H=inner_steps, compression=compression, outer=outer, overlap=overlap,
               bytes_per_node=sum(sent) / len(sent), val_loss=run.metrics["val_loss"], wall_s=run.wall_s,
               compute_utilization=sum(util) / max(1, len(util)), samples=run.samples,
               partial_rounds=sum(n["partial_rounds"] for n in run.nodes), rounds=done, params=params)
    row["bits_per_param_per_round"] = 8 * row["bytes_per_node"] / (params * max(1, done))
    print(f"  {strategy:6} H={inner_steps:<3} {compression:8} {outer:14} bytes/node {row['bytes_per_node']:>12,.0f} "
          f"bits/param/round {row['bits_per_param_per_round']:.3f} val_loss {row['val_loss']:.4f} "
          f"rounds {done} util {row['compute_utilization']:.3f} wall {row['wall_s']:.0f}s", flush=True)
    return row


def reused_baseline(args, parser, steps: int) -> dict:
    """The baseline row of an earlier ``--long --json`` run with the same model and samples (the baseline alone
    takes 10-15 minutes on 2 cores; the rows to compare with it take 2-3 each)."""
    try:
        earlier = json.loads(Path(args.baseline_json).read_text())
        base = dict(earlier["baseline"])
        params, samples = int(earlier["params"]), int(earlier["samples"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        parser.error(f"--baseline-json: cannot read a --long run's figures from {args.baseline_json}: {e}")
    cfg = make_config(args, "sync", 1, "none", steps)
    if params != count_params(cfg) or samples != args.samples or int(base.get("rounds", 0)) != steps:
        parser.error(f"--baseline-json: {args.baseline_json} is of {params} parameters, {samples} sequences and "
                     f"{base.get('rounds')} steps; this run has {count_params(cfg)}, {args.samples} and {steps}")
    print(f"baseline: reused from {args.baseline_json}", flush=True)
    base.update(params=params, reused_from=str(args.baseline_json))
    return base


def long_mode(args, parser) -> int:
    """The proof over a real run (see the module's docstring)."""
    specs = []
    for item in args.long_runs:
        parts = item.split(":")
        if (len(parts) != 3 or not parts[0].isdigit() or int(parts[0]) < 1 or parts[1] not in COMPRESSIONS
                or parts[2] not in OUTERS):
            parser.error(f"--long-runs: expected H:CODEC:OUTER (CODEC one of {', '.join(COMPRESSIONS)}, OUTER one "
                         f"of {', '.join(OUTERS)}), got {item!r}")
        specs.append((int(parts[0]), parts[1], parts[2]))
    # equal samples: every row trains rounds x H steps a node, at the largest H; the baseline as many steps
    steps = args.rounds * max(h for h, _, _ in specs)
    args.samples = steps * args.batch_size * args.nodes
    print(f"long mode: LSTM {args.layers}x{args.hidden}, {args.nodes} nodes, {steps} steps a node "
          f"({args.samples} sequences)", flush=True)
    if args.baseline_json:
        base = reused_baseline(args, parser, steps)
    else:
        print("baseline: sync, fp32 gradients every step", flush=True)
        base = one_run(args, "sync", 1, "none", rounds=steps)
    runs = []
    for h, codec, outer in specs:
        row = one_run(args, "diloco", h, codec, outer, rounds=steps // h)
        row["bytes_ratio"] = base["bytes_per_node"] / max(1.0, row["bytes_per_node"])
        runs.append(row)
    # dense DiLoCo at the same H: with its Nesterov outer step, and with the same outer step as the row
    dense = {(r["H"], r["outer"]): r for r in runs if r["compression"] == "none"}

    def vs(r, outer):
        other = dense.get((r["H"], outer))
        return r["val_loss"] / other["val_loss"] if other else float("nan")

    rows = [["sync (baseline)", 1, "none", "-", base["rounds"], base["bytes_per_node"],
             base["bits_per_param_per_round"], base["val_loss"], 1.0, "-", "-", base["wall_s"], 1.0]]
    for r in runs:
        rows.append([r["strategy"], r["H"], r["compression"], r["outer"], r["rounds"], r["bytes_per_node"],
                     r["bits_per_param_per_round"], r["val_loss"], r["val_loss"] / base["val_loss"],
                     vs(r, "nesterov"), vs(r, r["outer"]), r["wall_s"], r["bytes_ratio"]])
    params = base["params"]
    print_table(f"communication, long: {args.nodes} nodes, LSTM {args.layers}x{args.hidden} ({params:,} parameters), "
                f"{args.samples} sequences", ["strategy", "H", "compression", "outer", "rounds", "bytes/node",
                                              "bits/param/round", "val loss", "loss vs base", "vs dense DiLoCo",
                                              "vs dense, same outer", "wall s", "bytes ratio"], rows)
    ok = [r for r in runs if r["bytes_ratio"] >= 3000 and r["val_loss"] <= 1.01 * base["val_loss"]
          and r["rounds"] >= 20]
    print("\nruns with >= 3000x fewer bytes, val loss within 1% of the baseline and >= 20 rounds: "
          + (", ".join(f"H={r['H']} {r['compression']}" for r in ok) or "none"))
    keys = ("strategy", "H", "compression", "outer", "bytes_per_node", "val_loss", "wall_s", "compute_utilization",
            "bytes_ratio", "rounds", "bits_per_param_per_round", "partial_rounds")
    write_json(args.json, {"params": params, "samples": args.samples, "error_buffer": args.error_buffer,
                           "feedback_lr": args.feedback_lr,
                           "baseline": {k: base[k] for k in ("bytes_per_node", "val_loss", "wall_s", "rounds",
                                                             "bits_per_param_per_round", "compute_utilization",
                                                             "reused_from")
                                        if k in base},
                           "runs": [{k: r[k] for k in keys} for r in runs]})
    return 0


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
    parser.add_argument("--compression", nargs="+", default=list(SHORT_GRID), choices=COMPRESSIONS)
    parser.add_argument("--also", nargs="*", default=["150:int8", "150:int4"], metavar="H:CODEC",
                        help="runs beyond the grid (default: the ones that aim at 1000x fewer bytes)")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    parser.add_argument("--overlap", action="store_true",
                        help="the DiLoCo rows of the short grid with averaging.overlap (the baseline stays plain sync)")
    parser.add_argument("--sync-also", nargs="*", default=[], metavar="CODEC[:overlap]",
                        help="sync rows beside the baseline, e.g. 'fp16 none:overlap fp16:overlap' (overlap: each "
                             "step's gradients are averaged while the next step computes, and applied a step late)")
    parser.add_argument("--sparse-chunk", type=int, default=4096)
    parser.add_argument("--sparse-topk", type=int, default=64)
    parser.add_argument("--sparse-bits", type=int, default=2)
    parser.add_argument("--feedback-lr", type=float, default=2.0,
                        help="outer lr of the runs with averaging.outer = error_feedback (SparseLoCo: 1; in-process on "
                             "the long mode's model, 20 rounds of H=30, sparse with the buffer in the model: 2 "
                             "ended 4.3%% below dense DiLoCo, 3 1.9%% below)")
    parser.add_argument("--error-decay", type=float, default=0.95)
    parser.add_argument("--error-buffer", choices=("model", "separate"), default="model",
                        help="where the outer error feedback keeps what was not sent (averaging.error_buffer)")
    parser.add_argument("--long", action="store_true",
                        help="the proof over a real run: LSTM 2x512, >= 20 rounds a row (see above)")
    parser.add_argument("--rounds", type=int, default=20, help="--long: outer rounds of the rows at the largest H")
    parser.add_argument("--long-runs", nargs="+", default=list(LONG_RUNS), metavar="H:CODEC:OUTER")
    parser.add_argument("--baseline-json", default=None, metavar="FILE",
                        help="--long: take the baseline row from an earlier --long run's --json (same model and "
                             "samples) instead of running it again")
    args = parser.parse_args()
    args.data = args.data or default_text()
    if args.long:
        defaults = {"hidden": 128, "layers": 1, "seq_len": 64, "batch_size": 32}
        long_sizes = {"hidden": 512, "layers": 2, "seq_len": 32, "batch_size": 16}
        for name, value in long_sizes.items():  # the long mode's model unless the sizes were given
            if getattr(args, name) == defaults[name]:
                setattr(args, name, value)
        return long_mode(args, parser)
    grid = list(itertools.product(args.H, args.compression))
    for item in args.also:
        h, _, codec = item.partition(":")
        if not h.isdigit() or int(h) < 1 or codec not in COMPRESSIONS:
            parser.error(f"--also: expected H:CODEC with CODEC one of {', '.join(COMPRESSIONS)}, got {item!r}")
        if (int(h), codec) not in grid:
            grid.append((int(h), codec))

    sync_rows = []
    for item in args.sync_also:
        codec, _, how = item.partition(":")
        if codec not in COMPRESSIONS or how not in ("", "overlap"):
            parser.error(f"--sync-also: expected CODEC or CODEC:overlap with CODEC one of {', '.join(COMPRESSIONS)}, "
                         f"got {item!r}")
        sync_rows.append((codec, how == "overlap"))

    print("baseline: sync, fp32 gradients every step", flush=True)
    base = one_run(args, "sync", 1, "none")
    runs = []
    for codec, overlap in sync_rows:
        row = one_run(args, "sync", 1, codec, overlap=overlap)
        row["bytes_ratio"] = base["bytes_per_node"] / max(1.0, row["bytes_per_node"])
        runs.append(row)
    for inner_steps, compression in grid:
        row = one_run(args, "diloco", inner_steps, compression, overlap=args.overlap)
        row["bytes_ratio"] = base["bytes_per_node"] / max(1.0, row["bytes_per_node"])
        runs.append(row)
    rows = [["sync (baseline)", 1, "none", base["bytes_per_node"], base["val_loss"], 1.0,
             base["compute_utilization"], base["wall_s"], 1.0]]
    rows += [[r["strategy"] + (" overlap" if r["overlap"] else ""), r["H"], r["compression"], r["bytes_per_node"], r["val_loss"],
              r["val_loss"] / base["val_loss"], r["compute_utilization"], r["wall_s"], r["bytes_ratio"]] for r in runs]
    print_table(f"communication: {args.nodes} nodes, LSTM {args.layers}x{args.hidden}, {args.samples} sequences",
                ["strategy", "H", "compression", "bytes/node", "val loss", "loss vs base", "compute util", "wall s",
                 "bytes ratio"], rows)
    ok = [r for r in runs if r["bytes_ratio"] >= 1000 and r["val_loss"] <= 1.02 * base["val_loss"]]
    names = ", ".join(f"H={r['H']} {r['compression']}" for r in ok) or "none"
    print(f"\nruns with >= 1000x fewer bytes and val loss within 2% of the baseline: {names}")
    write_json(args.json, {"baseline": {k: base[k] for k in ("bytes_per_node", "val_loss", "wall_s",
                                                             "compute_utilization")},
                           "runs": [{k: r[k] for k in ("strategy", "H", "compression", "bytes_per_node", "val_loss",
                                                        "wall_s", "compute_utilization", "bytes_ratio", "overlap")}
                                    for r in runs]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

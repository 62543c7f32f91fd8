"""Does averaging in the background hide the round? Each row runs twice, without and with ``averaging.overlap``.

    python bench/overlap.py [--nodes 3] [--samples 28800] [--rows sync:1 diloco:10 diloco:50] [--json FILE]

Every run is a real swarm of coordinator and node processes on this machine (the cores divided between the nodes),
training the same char LSTM on the same data for the same total samples as bench/communication.py's default
model (LSTM 1 x 128, sequences of 64, batches of 32, fp32 contributions). With overlap the node hands the round's
meeting and all-reduce to a thread and takes the next round's local steps meanwhile; the averaged update lands
one round late (cotrain.averaging.overlap).

Columns: wall time, compute utilization (the nodes' time in forward/backward/optimizer over their wall time),
validation loss of the shared model (nats per character), and the overlapped row against the same row without
overlap (loss ratio, wall ratio). The JSON: ``{"runs": [{"strategy", "H", "overlap", "wall_s",
"compute_utilization", "val_loss", "rounds", "partial_rounds", "loss_vs_plain", "wall_vs_plain"}]}``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import bench_parser, default_text, print_table, write_json  # noqa: E402
from communication import one_run  # noqa: E402


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--samples", type=int, default=28_800, help="sequences in total, per run")
    parser.add_argument("--rows", nargs="+", default=["sync:1", "diloco:10", "diloco:50"], metavar="STRATEGY:H")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    args.data = args.data or default_text()
    # what communication.one_run reads from a parsed command line: its default model, fp32, Nesterov 1.0 / 0.5
    for name, value in dict(batch_size=32, seq_len=64, hidden=128, layers=1, outer_lr=1.0, outer_momentum=0.5,
                            topk_fraction=0.01, rank=4, sparse_chunk=4096, sparse_topk=64, sparse_bits=2,
                            feedback_lr=2.0, error_decay=0.95, error_buffer="model").items():
        setattr(args, name, value)
    rows = []
    for item in args.rows:
        strategy, _, h = item.partition(":")
        if strategy not in ("sync", "diloco") or not h.isdigit() or int(h) < 1:
            parser.error(f"--rows: expected STRATEGY:H with STRATEGY sync or diloco, got {item!r}")
        rows.append((strategy, int(h)))
    runs = []
    for strategy, h in rows:
        plain = one_run(args, strategy, h, "none")
        overlapped = one_run(args, strategy, h, "none", overlap=True)
        overlapped["loss_vs_plain"] = overlapped["val_loss"] / plain["val_loss"]
        overlapped["wall_vs_plain"] = overlapped["wall_s"] / plain["wall_s"]
        plain["loss_vs_plain"] = plain["wall_vs_plain"] = 1.0
        runs += [plain, overlapped]
    print_table(f"overlap: {args.nodes} nodes, LSTM {args.layers}x{args.hidden}, {args.samples} sequences",
                ["strategy", "H", "overlap", "rounds", "partial", "wall s", "compute util", "val loss",
                 "loss vs plain", "wall vs plain"],
                [[r["strategy"], r["H"], "yes" if r["overlap"] else "no", r["rounds"], r["partial_rounds"],
                  r["wall_s"], r["compute_utilization"], r["val_loss"], r["loss_vs_plain"], r["wall_vs_plain"]]
                 for r in runs])
    keys = ("strategy", "H", "overlap", "wall_s", "compute_utilization", "val_loss", "rounds", "partial_rounds",
            "loss_vs_plain", "wall_vs_plain")
    write_json(args.json, {"nodes": args.nodes, "samples": args.samples,
                           "runs": [{k: r[k] for k in keys} for r in runs]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A mixture of experts against a dense model of the trainer's size, at equal samples (issue 56's reference rows).

    python bench/dmoe.py [--samples 60000] [--rows local_moe dense] [--json FILE] [--markdown FILE] [--quick]

Both rows are the user's plain loop (bench/longrun.py's ``plain_mixed``: 16 streams over the whole training split,
the run config's optimizer, clip and schedule) on the built-in corpus or ``--data``, in this process:

- ``local_moe``: ``model.kind = "moe_lstm"`` with the ``[moe]`` defaults, every expert in this process
  (:class:`cotrain.moe.mixture.LocalExperts`): the reference a decentralized mixture is measured against;
- ``dense``: the trainer's part of it alone, an LSTM of the same embedding, width and layers without experts.

The decentralized rows (``dmoe``: 2 trainers and 4 expert hosts; ``dmoe_faults``: a host killed at a third of the
run and another started at two thirds) need the expert hosts, which are not built yet (docs/design/moe.md): this
bench offers only the rows it can run.

Per row: the validation BPC curve, samples a second, seconds a step, the expert calls and steps that failed (none
in one process), the parameters in all and in the largest process. ``--quick``: 8,000 samples a row, the edit loop.

JSON: ``{"runs": [{"name", "curve": [[samples, val_bpc], ...], "final_val_bpc", "samples", "samples_per_s",
"step_s", "failed_calls", "failed_steps", "params_total", "params_largest_process"}], "meta"}``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cotrain.config import RunConfig  # noqa: E402

from common import bench_parser, interruptible, print_table, run_meta, train_plain, write_json, write_page  # noqa: E402

ROWS = ("local_moe", "dense")
QUICK_SAMPLES = 8_000


def row_config(name: str, data) -> RunConfig:
    """The run config's defaults (its corpus, or ``data``) with the row's model: the mixture, or its trainer's part
    alone (the default LSTM's embedding, width and layers)."""
    cfg = RunConfig()
    sections = {"data": {"source": data}} if data else {}
    if name == "local_moe":
        sections["model"] = {"kind": "moe_lstm"}
        sections["moe"] = {"experts": "local"}
    return cfg.with_overrides(**sections)


def run_row(name: str, args) -> dict:
    run = train_plain(name, row_config(name, args.data), args.samples, args.eval_every)
    return dict(name=name, curve=run.curve, final_val_bpc=run.curve[-1][1], samples=run.samples,
                samples_per_s=round(run.samples / run.step_s, 2), step_s=round(run.step_s / run.steps, 4),
                failed_calls=0, failed_steps=0, params_total=run.params, params_largest_process=run.params)


COLUMNS = ["row", "samples", "final BPC", "vs dense", "samples/s", "step s", "failed calls", "failed steps",
           "params", "largest process"]


def table(runs: list[dict]) -> list[list]:
    dense = next((r["final_val_bpc"] for r in runs if r["name"] == "dense"), None)
    return [[r["name"], r["samples"], r["final_val_bpc"], round(r["final_val_bpc"] / dense, 4) if dense else "-",
             r["samples_per_s"], r["step_s"], r["failed_calls"], r["failed_steps"], f"{r['params_total']:,}",
             f"{r['params_largest_process']:,}"] for r in runs]


def write_markdown(path, results: dict) -> None:
    if not path:
        return
    m = results["meta"]
    lines = ["# Mixture of experts: `bench/dmoe.py`", "",
             f"- `{m.get('command', '')}` at commit {m.get('commit', '?')}, {m.get('date', '')}, {m.get('machine', '')}",
             "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(v) for v in r) + " |" for r in table(results["runs"])]
    lines += [""] + [f"- **{r['name']}**: " + ", ".join(f"{s:,}: {b:.3f}" for s, b in r["curve"])
                     for r in results["runs"]]
    write_page(path, lines)


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--samples", type=int, default=60_000, help="samples a row trains")
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--eval-every", type=int, default=8000)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SAMPLES:,} samples a row")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args()
    if args.quick:
        args.samples, args.eval_every = QUICK_SAMPLES, QUICK_SAMPLES // 2
    results = {"runs": [], "meta": run_meta()}
    with interruptible():
        for name in args.rows:
            results["runs"].append(run_row(name, args))
            write_json(args.json, results)
    print_table(f"mixture of experts against dense, {args.samples:,} samples a row", COLUMNS, table(results["runs"]))
    write_markdown(args.markdown, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

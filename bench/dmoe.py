"""A mixture of experts against a dense model of the trainer's size, at equal samples (issue 56's reference rows).

    python bench/dmoe.py [--samples 60000] [--rows local_moe dense] [--json FILE] [--markdown FILE] [--quick]

Both rows are the user's plain loop (bench/longrun.py's ``plain_mixed``: 16 streams over the whole training split,
the run config's optimizer, clip and schedule) on the built-in corpus or ``--data``, in this process:

- ``local_moe``: ``model.kind = "moe_lstm"`` with the ``[moe]`` defaults, every expert in this process
  (:class:`cotrain.moe.mixture.LocalExperts`): the reference a decentralized mixture is measured against;
- ``dense``: the trainer's part of it alone, an LSTM of the same embedding, width and layers without experts.

The decentralized rows are a swarm on this machine, the run config's defaults with the experts on hosts
(``moe.experts = "hosted"``): a coordinator, 2 trainers (``cotrain node join``, the machine's CPUs divided between
them) and 4 expert hosts (``cotrain expert serve``, 4 experts each); the curve is the coordinator's evaluations,
made with the experts on their hosts:

- ``dmoe``: the swarm as it is;
- ``dmoe_faults``: one host killed (SIGKILL) at a third of the samples and another started at two thirds.

Per row: the validation BPC curve, samples a second, seconds a step, the expert calls and steps that failed (none
in one process), the parameters in all and in the largest process. ``--quick``: 8,000 samples a row, the edit loop.

JSON: ``{"runs": [{"name", "curve": [[samples, val_bpc], ...], "final_val_bpc", "samples", "samples_per_s",
"step_s", "failed_calls", "failed_steps", "params_total", "params_largest_process"}], "meta"}``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cotrain.config import RunConfig  # noqa: E402

from common import (bench_parser, interruptible, print_table, run_meta, samples_trained, train_plain,  # noqa: E402
                    work_folder, write_json, write_page)

ROWS = ("local_moe", "dmoe", "dmoe_faults", "dense")
TRAINERS, HOSTS = 2, 4
QUICK_SAMPLES = 8_000


def row_config(name: str, data) -> RunConfig:
    """The run config's defaults (its corpus, or ``data``) with the row's model: the mixture (its experts in this
    process, or on hosts), or its trainer's part alone (the default LSTM's embedding, width and layers)."""
    cfg = RunConfig()
    sections = {"data": {"source": data}} if data else {}
    if name != "dense":
        sections["model"] = {"kind": "moe_lstm"}
        sections["moe"] = {"experts": "local" if name == "local_moe" else "hosted"}
    return cfg.with_overrides(**sections)


def run_row(name: str, args) -> dict:
    if name.startswith("dmoe"):
        return run_dmoe(name, args)
    run = train_plain(name, row_config(name, args.data), args.samples, args.eval_every)
    return dict(name=name, curve=run.curve, final_val_bpc=run.curve[-1][1], samples=run.samples,
                samples_per_s=round(run.samples / run.step_s, 2), step_s=round(run.step_s / run.steps, 4),
                failed_calls=0, failed_steps=0, params_total=run.params, params_largest_process=run.params)


def run_dmoe(name: str, args) -> dict:
    """The swarm of :data:`TRAINERS` trainers and :data:`HOSTS` hosts until the trainers' samples add up to
    ``--samples`` (``dmoe_faults``: host-0 killed at a third, host-4 started at two thirds), then an evaluation of the
    last round by the coordinator, with the experts still on their hosts."""
    import math
    import os
    import signal

    from cotrain.cli.launch import start_expert_host, stop_all, wait_for
    from cotrain.cli.local_swarm import Swarm
    from cotrain.coordinator.store import read_evals
    from cotrain.models import build_model, count_parameters
    from cotrain.moe.assignment import run_experts
    from cotrain.moe.mixture import FeedForward

    cfg = row_config(name, args.data)
    experts = len(run_experts(cfg.moe.grid, cfg.moe.layers))
    per_host = -(-experts // HOSTS)
    trainers = [f"trainer-{i}" for i in range(TRAINERS)]
    with work_folder(f"cotrain-dmoe-{name}-", keep=args.keep) as work:
        with Swarm(cfg, work, nodes=TRAINERS, zygote=True) as swarm:
            hosts = [start_expert_host(swarm.address, swarm.token, f"host-{i}", work / f"host-{i}", per_host,
                                       zygote=swarm.zygote) for i in range(HOSTS)]
            try:
                started = time.monotonic()
                for trainer in trainers:
                    swarm.start_node(trainer, ["--wait-peers", str(TRAINERS)])
                faults = {"kill": args.samples // 3, "start": 2 * args.samples // 3} if name == "dmoe_faults" else {}

                def enough() -> bool:
                    done = samples_trained(swarm, work, trainers)
                    if "kill" in faults and done >= faults["kill"]:
                        os.kill(hosts[0].pid, signal.SIGKILL)
                        print(f"{name}: host-0 killed at {done} samples", flush=True)
                        del faults["kill"]
                    if "start" in faults and done >= faults["start"]:
                        hosts.append(start_expert_host(swarm.address, swarm.token, f"host-{HOSTS}",
                                                       work / f"host-{HOSTS}", per_host, zygote=swarm.zygote))
                        print(f"{name}: host-{HOSTS} started at {done} samples", flush=True)
                        del faults["start"]
                    return done >= args.samples

                wait_for(enough, args.row_timeout, interval=1.0, what=f"{name} to train {args.samples} samples")
                wall = time.monotonic() - started
                rows = [r for r in swarm.node_rows() if r["name"] in trainers]
                final_round = max(int(r.get("round", 0)) for r in rows)

                def evaluated() -> bool:  # the checkpointer takes the state from the trainers: they train on
                    evals = read_evals(swarm.state_dir)
                    return bool(evals) and evals[-1].round >= final_round and math.isfinite(evals[-1].val_bpc)

                wait_for(evaluated, 600, interval=1.0, what=f"{name}'s last round to be evaluated")
                evals = read_evals(swarm.state_dir)
                swarm.stop_nodes()
            finally:
                stop_all(hosts, 30)
    curve = sorted([int(e.metrics.get("samples_total", 0)), round(e.val_bpc, 4)] for e in evals
                   if math.isfinite(e.val_bpc))
    trainer_params = count_parameters(build_model(cfg))
    expert_params = count_parameters(FeedForward(cfg.model.hidden_size, cfg.moe.expert_hidden))
    samples = sum(int(r.get("samples_local", 0)) for r in rows)
    steps = sum(int(r.get("step", 0)) for r in rows)
    compute = sum(float(r.get("compute_s", 0.0)) for r in rows)
    print(f"{name}: final {curve[-1][1]:.4f} BPC at {curve[-1][0]} samples", flush=True)
    return dict(name=name, curve=curve, final_val_bpc=curve[-1][1], samples=samples,
                samples_per_s=round(samples / wall, 2), step_s=round(compute / max(1, steps), 4),
                failed_calls=sum(int(r.get("expert_calls_failed", 0)) for r in rows),
                failed_steps=sum(int(r.get("steps_skipped", 0)) for r in rows),
                params_total=trainer_params + experts * expert_params,
                params_largest_process=max(trainer_params, per_host * expert_params))


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
    parser.add_argument("--row-timeout", type=float, default=4 * 3600.0, help="seconds a swarm row may take")
    parser.add_argument("--keep", action="store_true", help="keep the swarm rows' work folders")
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

"""Which model and which inner optimizer should a swarm train? Linear recurrences against the LSTM, Muon and ROOT
against AdamW, and layer-wise adaptive rates for a collaborative batch that grows with the swarm.

    python bench/models.py [--wall 391] [--swarm-samples 24000] [--sync-samples 24000] [--json FILE]

The data and the training recipe are bench/quality.py's (tinyshakespeare from ../shared/data, bytes, TBPTT 128
with the state carried, AdamW 3e-3 cosine to 3e-4, clip 1, the output bias from the byte frequencies). Three
tables, one run after another on this machine:

1. **single process, equal wall time**: each model (``--models``) with each optimizer (``--optimizers``) trains
   in a plain loop in this process for ``--wall`` seconds with every core (cosine over the time), batch 32. The
   table gives validation BPC on the whole validation split, training bytes per second and parameters. The LSTM
   2x256 row is the reference (the issue's: 2.07 BPC in 391 s on the machine where it was measured).
2. **3-node DiLoCo swarm, equal samples**: real nodes under a real coordinator, splitting the batch of 32 as in
   bench/quality.py (H = ``--inner-steps``, outer lr 1.0, momentum 0.5): the LSTM with AdamW (at 3e-3 and at
   Muon's 1e-2), Muon and ROOT, and the best linear recurrence of table 1 (or ``--swarm-model``) with AdamW and
   Muon (``--swarm-runs``).
3. **sync, a 4x larger collaborative batch, equal samples**: 3 nodes of batch 32 average every step (a
   collaborative batch of 96, AdamW) against 3 nodes that accumulate 4 micro-batches per round (384) with AdamW
   (lr x2, the square-root rule), LAMB, LARS and TVLARS.

``--json FILE`` writes ``{"runs": [{"model", "optimizer", "params", "val_bpc", "bytes_per_s", "wall_s", "steps",
"samples"}], "swarm": [...], "sync": [...], "settings": {...}}``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import default_text, print_table, write_json  # noqa: E402
from quality import run_lm, run_plain  # noqa: E402

#: models of about 0.9M parameters (the LSTM 2x256 with a 256-byte vocabulary has 0.93M)
MODELS = {
    "lstm": {"kind": "lstm", "embed_dim": 64, "hidden_size": 256, "num_layers": 2, "dropout": 0.1},
    "lru": {"kind": "lru", "embed_dim": 64, "hidden_size": 256, "num_layers": 2, "state_size": 128,
            "mlp_ratio": 2, "dropout": 0.1},
    "hgrn2": {"kind": "hgrn2", "embed_dim": 64, "hidden_size": 224, "num_layers": 2, "expand_ratio": 8,
              "mlp_ratio": 2, "dropout": 0.1},
    "mingru": {"kind": "mingru", "embed_dim": 64, "hidden_size": 256, "num_layers": 2, "mlp_ratio": 2,
               "dropout": 0.1},
}

#: each optimizer's settings here; lr is the peak of the cosine (min_lr a tenth of it). Muon and ROOT at AdamW's
#: 3e-3 ended well above it (300 steps of the LSTM: 3.07 and 3.09 against 2.76 BPC); 1e-2 suits both, and AdamW
#: reaches the same at 1e-2 (adamw_1e-2, so that a gain is the optimizer's, not its lr's). LAMB: 1e-2. LARS and
#: TVLARS with eta 1e-3: about 5
OPTIMIZERS = {
    "adamw": {"kind": "adamw", "lr": 3e-3},
    "adamw_1e-2": {"kind": "adamw", "lr": 1e-2},
    "muon": {"kind": "muon", "lr": 1e-2},
    "root": {"kind": "root", "lr": 1e-2},
    "lamb": {"kind": "lamb", "lr": 1e-2},
    "lars": {"kind": "lars", "lr": 5.0},
    # phi falls around step 20 over about 20 steps: within the 62 rounds of the 4x batch (24,000 samples)
    "tvlars": {"kind": "tvlars", "lr": 5.0, "tvlars_delay": 20, "tvlars_decay": 0.2},
}


def optimizer_settings(name: str, lr_scale: float = 1.0) -> dict:
    settings = dict(OPTIMIZERS[name])
    settings["lr"] *= lr_scale
    settings["min_lr"] = settings["lr"] / 10
    return settings


def single_rows(data: str, models: list[str], optimizers: list[str], wall_s: float, threads: int) -> list[dict]:
    rows = []
    for model in models:
        for opt in optimizers:
            run = run_plain(data, wall_s=wall_s, threads=threads,
                            overrides={"model": MODELS[model], "optimizer": optimizer_settings(opt)})
            rows.append(dict(model=model, optimizer=opt, params=run["params"], val_bpc=run["val_bpc"],
                             bytes_per_s=run["bytes_per_s"], wall_s=run["wall_s"], steps=run["steps"],
                             samples=run["samples"]))
            print(f"  {model} {opt}: {rows[-1]['val_bpc']:.4f} BPC, {rows[-1]['bytes_per_s']:.0f} bytes/s",
                  flush=True)
    return rows


def swarm_rows(data: str, runs: list[tuple[str, str]], nodes: int, samples: int, inner_steps: int) -> list:
    rows = []
    for name, opt in runs:
        run = run_lm(data, nodes, samples, inner_steps, 1.0, 0.5,
                     overrides={"model": MODELS[name], "optimizer": optimizer_settings(opt)})
        rows.append(dict(model=name, optimizer=opt, nodes=nodes, samples=run["samples"], val_bpc=run["val_bpc"],
                         wall_s=run["wall_s"], inner_steps=inner_steps, batch_per_node=run["batch_size"]))
        print(f"  swarm {name} {opt}: {run['val_bpc']:.4f} BPC", flush=True)
    return rows


def sync_rows(data: str, model: str, optimizers: list[str], nodes: int, samples: int, grow: int) -> list:
    """3 nodes x batch 32 averaging every step, then the same nodes accumulating ``grow`` micro-batches a round."""
    rows = []
    runs = [("adamw", 1, 1.0)] + [(o, grow, grow ** 0.5 if o == "adamw" else 1.0) for o in optimizers]
    for opt, micro, lr_scale in runs:
        run = run_lm(data, nodes, samples, micro, 1.0, 0.0, batch_size=32 * nodes, overrides={
            "model": MODELS[model], "optimizer": optimizer_settings(opt, lr_scale),
            "averaging": {"strategy": "sync", "target_group_size": nodes}})
        rows.append(dict(model=model, optimizer=opt, nodes=nodes, collaborative_batch=nodes * 32 * micro,
                         lr=OPTIMIZERS[opt]["lr"] * lr_scale, samples=run["samples"], rounds=run["rounds"],
                         val_bpc=run["val_bpc"], wall_s=run["wall_s"]))
        print(f"  sync {opt} x{nodes * 32 * micro}: {run['val_bpc']:.4f} BPC", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="text file (default ../shared/data/tinyshakespeare.txt)")
    parser.add_argument("--wall", type=float, default=391.0, help="seconds of training per single-process row")
    parser.add_argument("--models", default="lstm,lru,hgrn2,mingru")
    parser.add_argument("--optimizers", default="adamw,muon")
    parser.add_argument("--threads", type=int, default=0, help="torch threads of the single rows (0: every core)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--swarm-samples", type=int, default=24_000, help="sequences of 128 bytes per swarm row")
    parser.add_argument("--inner-steps", type=int, default=10, help="the DiLoCo swarm's H")
    parser.add_argument("--swarm-model", default="", help="the swarm's linear recurrence (default: table 1's best)")
    parser.add_argument("--swarm-runs", default="lstm:adamw,lstm:adamw_1e-2,lstm:muon,lstm:root,BEST:adamw,BEST:muon",
                        help="model:optimizer pairs of the swarm table; BEST is the swarm's linear recurrence")
    parser.add_argument("--sync-samples", type=int, default=24_000, help="sequences of 128 bytes per sync row")
    parser.add_argument("--sync-model", default="lstm")
    parser.add_argument("--sync-optimizers", default="adamw,lamb,lars,tvlars",
                        help="the optimizers of the large collaborative batch")
    parser.add_argument("--grow", type=int, default=4, help="how many times larger the large collaborative batch is")
    parser.add_argument("--lr", action="append", default=[], metavar="NAME=LR",
                        help="another peak lr for one of the optimizers (repeatable), e.g. --lr lamb=0.03")
    parser.add_argument("--skip", default="", help="tables to leave out: single, swarm, sync (comma-separated)")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    data = args.data or default_text()
    for item in args.lr:
        name, _, value = item.partition("=")
        try:
            OPTIMIZERS[name]["lr"] = float(value)
        except (KeyError, ValueError):
            parser.error(f"--lr: expected NAME=LR with NAME one of {', '.join(OPTIMIZERS)}, got {item!r}")
    skip = set(filter(None, args.skip.split(",")))
    for name in args.models.split(",") + [args.sync_model] + list(filter(None, [args.swarm_model])):
        if name not in MODELS:
            parser.error(f"--models: unknown model {name!r} (known: {', '.join(MODELS)})")
    swarm_runs = [tuple(pair.split(":", 1)) for pair in args.swarm_runs.split(",") if pair]
    if any(len(pair) != 2 for pair in swarm_runs):
        parser.error("--swarm-runs: expected model:optimizer pairs")
    for name in (args.optimizers + "," + ",".join(o for _, o in swarm_runs) + "," + args.sync_optimizers).split(","):
        if name not in OPTIMIZERS:
            parser.error(f"optimizers: unknown optimizer {name!r} (known: {', '.join(OPTIMIZERS)})")
    out: dict = {"settings": {"wall_s": args.wall, "models": MODELS, "optimizers": OPTIMIZERS, "nodes": args.nodes,
                              "swarm_samples": args.swarm_samples, "sync_samples": args.sync_samples,
                              "inner_steps": args.inner_steps}, "runs": [], "swarm": [], "sync": []}
    reference = None
    if "single" not in skip:
        out["runs"] = single_rows(data, args.models.split(","), args.optimizers.split(","), args.wall, args.threads)
        reference = next((r for r in out["runs"] if r["model"] == "lstm" and r["optimizer"] == "adamw"), None)
        print_table(f"single process, {args.wall:.0f} s of training each (batch 32, TBPTT 128, every core)",
                    ["model", "optimizer", "params", "steps", "val BPC", "bytes/s", "BPC vs LSTM", "speed vs LSTM"],
                    [[r["model"], r["optimizer"], r["params"], r["steps"], r["val_bpc"], r["bytes_per_s"],
                      r["val_bpc"] / reference["val_bpc"] if reference else float("nan"),
                      r["bytes_per_s"] / reference["bytes_per_s"] if reference else float("nan")]
                     for r in out["runs"]])
    swarm_model = args.swarm_model
    if not swarm_model:
        linear = [r for r in out["runs"] if r["model"] != "lstm"]
        swarm_model = min(linear, key=lambda r: r["val_bpc"])["model"] if linear else "mingru"
    if "swarm" not in skip:
        runs = [(swarm_model if m == "BEST" else m, o) for m, o in swarm_runs]
        for m, _ in runs:
            if m not in MODELS:
                parser.error(f"--swarm-runs: unknown model {m!r} (known: {', '.join(MODELS)})")
        out["swarm"] = swarm_rows(data, runs, args.nodes, args.swarm_samples, args.inner_steps)
        base = out["swarm"][0]["val_bpc"]
        print_table(f"{args.nodes}-node DiLoCo swarm (H={args.inner_steps}), equal samples",
                    ["model", "optimizer", "samples", "val BPC", "wall s", "BPC vs LSTM AdamW"],
                    [[r["model"], r["optimizer"], r["samples"], r["val_bpc"], r["wall_s"], r["val_bpc"] / base]
                     for r in out["swarm"]])
    if "sync" not in skip:
        out["sync"] = sync_rows(data, args.sync_model, args.sync_optimizers.split(","), args.nodes,
                                args.sync_samples, args.grow)
        base = out["sync"][0]["val_bpc"]
        print_table(f"sync, {args.nodes} nodes, collaborative batch x{args.grow} at equal samples "
                    f"({args.sync_model})",
                    ["optimizer", "collab. batch", "lr", "rounds", "samples", "val BPC", "wall s", "BPC vs small"],
                    [[r["optimizer"], r["collaborative_batch"], r["lr"], r["rounds"], r["samples"], r["val_bpc"],
                      r["wall_s"], r["val_bpc"] / base] for r in out["sync"]])
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

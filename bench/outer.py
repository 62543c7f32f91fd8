"""Why a long DiLoCo run drifts, and what keeps it improving: in-process replicas of the demo's run, the arithmetic of
rounds alone (no swarm, no network), under different outer steps and lr schedules.

    python bench/outer.py [--replicas 2] [--H 40] [--rounds 60] [--variants default plain_avg ...] [--json FILE]

Every replica is the demo's model (the default run config: LSTM 2x256, byte-level, built-in corpus, AdamW 3e-3,
clip 1.0, batch 16 x 128 with the hidden state carried over the work unit) and trains the coordinator's work units in
turn (replica i takes units i, i + R, ...). Every H local steps the replicas average their pseudo-gradients (fp32,
equal weights: equal samples) and take the outer step. A variant names its outer lr and momentum and its inner lr
schedule; ``plain`` is one process with the same model, data order and settings, taking R x the steps of a replica
(equal samples). The table gives the validation BPC (the coordinator's evaluation: the first ``eval_bytes`` of the
validation split) every ``--eval-every`` rounds, its best and its last value.

JSON: ``{"runs": [{"name", "outer_lr", "outer_momentum", "schedule", "curve": [[samples, val_bpc], ...],
"best_val_bpc", "final_val_bpc"}]}``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import UnitLoop, bench_parser, print_table, swarm_config, write_json  # noqa: E402

from cotrain.data import Corpus  # noqa: E402
from cotrain.evaluation import evaluate_model  # noqa: E402
from cotrain.optim.schedule import Schedule, lr_factor  # noqa: E402

#: name -> (outer lr, outer momentum, schedule overrides)
VARIANTS = {
    "default_0.7_0.9": (0.7, 0.9, {"kind": "constant"}),
    "avg_1.0_0": (1.0, 0.0, {"kind": "constant"}),
    "nesterov_1.0_0.5": (1.0, 0.5, {"kind": "constant"}),
    "nesterov_0.7_0.9_cosine": (0.7, 0.9, {"kind": "cosine"}),
    "avg_1.0_0_cosine": (1.0, 0.0, {"kind": "cosine"}),
    "nesterov_1.0_0.5_cosine": (1.0, 0.5, {"kind": "cosine"}),
    "nesterov_0.7_0.5_cosine": (0.7, 0.5, {"kind": "cosine"}),
    "nesterov_0.7_0.9_wsd": (0.7, 0.9, {"kind": "wsd"}),
    "nesterov_1.0_0.5_wsd": (1.0, 0.5, {"kind": "wsd"}),
    "nesterov_1.0_0.5_invsqrt": (1.0, 0.5, {"kind": "inverse_sqrt", "timescale_samples": 8000}),
    "nesterov_0.7_0.9_invsqrt": (0.7, 0.9, {"kind": "inverse_sqrt", "timescale_samples": 8000}),
    "avg_1.0_0_invsqrt": (1.0, 0.0, {"kind": "inverse_sqrt", "timescale_samples": 8000}),
}

#: one process, no rounds: name -> (1.0, 0.0, its schedule)
PLAIN = {"plain": (1.0, 0.0, {"kind": "constant"}),
         "plain_invsqrt": (1.0, 0.0, {"kind": "inverse_sqrt", "timescale_samples": 8000})}


def run(name: str, args, corpus: Corpus, byte_counts) -> dict:
    alone = name.endswith("_alone")
    plain = name.startswith("plain") or alone
    outer_lr, mu, sched = PLAIN[name.removesuffix("_alone")] if plain else VARIANTS[name]
    replicas = 1 if plain else args.replicas
    cfg = swarm_config(data={"source": "builtin"})
    # a round's local steps: replica 0 takes --fast times H (a fast node), the others H
    steps = [args.H * args.fast] + [args.H] * (args.replicas - 1)
    if plain:  # the samples of the whole swarm, or of its fast node alone
        steps = [steps[0]] if alone else [sum(steps)]
    samples_total = sum(steps) * args.rounds * cfg.data.batch_size
    schedule = Schedule(horizon_samples=samples_total, warmup_samples=args.warmup_samples, **sched)
    reps = [UnitLoop(cfg, corpus, byte_counts, first=i, stride=replicas) for i in range(replicas)]
    norms = []  # per round: each replica's pseudo-gradient norm, cos(fast, rest), the outer step's norm
    glob = [p.detach().clone() for p in reps[0].model.parameters()]
    outer = torch.optim.SGD(glob, lr=outer_lr, momentum=mu, nesterov=mu > 0)
    curve, samples, started = [], 0, time.monotonic()

    def evaluate():
        model = reps[0].model
        with torch.no_grad():
            saved = [p.detach().clone() for p in model.parameters()]
            for p, g in zip(model.parameters(), glob):
                p.copy_(g)
            bpc = evaluate_model(cfg, model, corpus=corpus, max_bytes=cfg.coordinator.eval_bytes)["val_bpc"]
            for p, s in zip(model.parameters(), saved):
                p.copy_(s)
        curve.append([samples, round(bpc, 4)])
        print(f"{name}: {samples} samples  val {bpc:.4f}  lr {cfg.optimizer.lr * lr_factor(schedule, samples):.2e}"
              f"  {time.monotonic() - started:.0f}s", flush=True)

    evaluate()
    for r in range(args.rounds):
        lr = cfg.optimizer.lr * lr_factor(schedule, samples)  # the swarm's samples at the round's start
        taken = [0] * len(reps)
        for t in range(max(steps)):
            for i, rep in enumerate(reps):
                if t < steps[i]:
                    taken[i] += rep.step(lr)
        samples += sum(taken)
        if plain:
            with torch.no_grad():
                for g, p in zip(glob, reps[0].model.parameters()):
                    g.copy_(p)
        else:
            with torch.no_grad():
                deltas = [torch.cat([(g - p.detach()).flatten() for g, p in zip(glob, rep.model.parameters())])
                          for rep in reps]
                weights = [n / sum(taken) for n in taken]  # by samples, as the swarm weighs contributions
                before = torch.cat([g.flatten() for g in glob])
                for i, g in enumerate(glob):
                    g.grad = sum(w * (g - list(rep.model.parameters())[i].detach()) for w, rep in zip(weights, reps))
                outer.step()
                outer.zero_grad(set_to_none=True)
                moved = float((torch.cat([g.flatten() for g in glob]) - before).norm())
                rest = sum(deltas[1:]) / max(1, len(deltas) - 1) if len(deltas) > 1 else deltas[0]
                cos = float(torch.nn.functional.cosine_similarity(deltas[0], rest, dim=0))
                norms.append([round(float(d.norm()), 4) for d in deltas] + [round(cos, 4), round(moved, 4)])
                print(f"{name}: round {r}: pseudo-gradient norms {norms[-1][:-2]} (replica 0 first), "
                      f"cos(replica 0, the others' mean) {cos:.3f}, outer step {moved:.3f}", flush=True)
                for rep in reps:
                    for p, g in zip(rep.model.parameters(), glob):
                        p.copy_(g)
        if (r + 1) % args.eval_every == 0 or r + 1 == args.rounds:
            evaluate()
    bpcs = [b for _, b in curve[1:]]
    return dict(name=name, outer_lr=outer_lr, outer_momentum=mu, schedule=sched["kind"], curve=curve,
                best_val_bpc=min(bpcs), final_val_bpc=bpcs[-1], wall_s=round(time.monotonic() - started, 1),
                rounds=norms)


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--json", default=None)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--H", type=int, default=40)
    parser.add_argument("--fast", type=int, default=1,
                        help="replica 0 takes this many times H local steps a round (a fast node next to slow ones); "
                             "NAME_alone is then a plain loop with its steps only")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--warmup-samples", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variants", nargs="+", default=["plain", "default_0.7_0.9", "avg_1.0_0"],
                        choices=[*PLAIN, *(f"{p}_alone" for p in PLAIN), *VARIANTS])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    corpus = Corpus.from_source("builtin")
    byte_counts = corpus.byte_counts()
    runs = [run(name, args, corpus, byte_counts) for name in args.variants]
    print_table(f"{args.replicas} replicas, H={args.H}, {args.rounds} rounds",
                ["variant", "outer lr / momentum", "schedule", "best BPC", "final BPC", "final / best"],
                [[r["name"], f"{r['outer_lr']} / {r['outer_momentum']}", r["schedule"], f"{r['best_val_bpc']:.3f}",
                  f"{r['final_val_bpc']:.3f}", f"{r['final_val_bpc'] / r['best_val_bpc']:.3f}"] for r in runs])
    write_json(args.json, {"replicas": args.replicas, "H": args.H, "rounds": args.rounds, "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Shrink and perturb at small scale (Ash and Adams, "On Warm-Starting Neural Network Training", NeurIPS 2020).

    python bench/warmstart.py [--steps1 3000] [--steps2 5000] [--max-bytes 200000] [--json FILE]

A char LSTM trains on the first half of tinyshakespeare's training text; then training continues on all of it for
the same number of steps three ways, side by side: (a) from a fresh initialization, (b) from the first model as it
is (naive warm start), (c) from the first model shrunk and perturbed (theta <- 0.6 theta + 0.01 epsilon, epsilon
from the model's initializer). Prints the final and the best validation loss (evaluated every ``--eval-every``
steps) and the wall time of each. One process, one thread.

The paper's effect shows when the first model has converged on its half (it generalizes worse after it memorized
it); ``--max-bytes`` takes only the first N bytes of the text (200 kB by default: a 1x256 LSTM memorizes its
90 kB half in 3,000 steps), so that the whole bench runs in about 20 minutes on one core.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from common import default_text, print_table, swarm_config, write_json  # noqa: E402

from cotrain.config import RunConfig  # noqa: E402
from cotrain.data import Corpus, StreamBatches  # noqa: E402
from cotrain.evaluation import evaluate_model  # noqa: E402
from cotrain.models import build_model  # noqa: E402
from cotrain.warmstart import fresh_parameters, shrink_perturb  # noqa: E402


def train(model, corpus: Corpus, end: int, steps: int, cfg: RunConfig, seed: int, eval_every: int = 0,
          curve: list | None = None) -> float:
    """``steps`` of AdamW (cosine schedule) on the training text up to ``end``; with ``eval_every``, the validation
    loss every that many steps goes into ``curve`` as (step, loss) (time spent evaluating is not counted)."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optimizer.lr, weight_decay=cfg.optimizer.weight_decay)
    batches = StreamBatches(corpus.read, 0, end, cfg.data.batch_size, cfg.data.seq_len)
    started, state = time.monotonic(), None
    model.train()
    for step in range(steps):
        lr = cfg.optimizer.min_lr + 0.5 * (cfg.optimizer.lr - cfg.optimizer.min_lr) * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = lr
        x, y, new_epoch = batches.next_batch()
        if new_epoch:
            state = None
        logits, state = model(x, state)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optimizer.grad_clip)
        opt.step()
        state = model.detach_state(state)
        if eval_every and curve is not None and ((step + 1) % eval_every == 0 or step + 1 == steps):
            paused = time.monotonic()
            curve.append((step + 1, val_loss(model, corpus, cfg)))
            model.train()
            started += time.monotonic() - paused
    return time.monotonic() - started


def val_loss(model, corpus: Corpus, cfg: RunConfig) -> float:
    """The run's validation loss (the coordinator's evaluation) over the whole validation split."""
    return evaluate_model(cfg, model, corpus=corpus)["val_loss"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="text file (default ../shared/data/tinyshakespeare.txt)")
    parser.add_argument("--steps1", type=int, default=3000, help="steps on the first half")
    parser.add_argument("--steps2", type=int, default=5000, help="steps on all of it, for each of the three")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--max-bytes", type=int, default=200_000,
                        help="use only the first N bytes of the text (0: all of it)")
    parser.add_argument("--eval-every", type=int, default=500, help="validation loss every N steps of phase 2")
    parser.add_argument("--shrink", type=float, default=0.6)
    parser.add_argument("--perturb", type=float, default=0.01)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    cfg = swarm_config(
        run={"seed": 0},
        model={"kind": "lstm", "embed_dim": 64, "hidden_size": args.hidden, "num_layers": 1, "dropout": 0.0},
        data={"source": args.data or default_text(), "seq_len": 64, "batch_size": 32, "max_bytes": args.max_bytes},
        optimizer={"lr": 3e-3, "min_lr": 3e-4}, device="cpu")
    corpus = Corpus.from_source(cfg.data.source, cfg.data.max_bytes, val_fraction=0.1)
    half = corpus.train.end // 2

    first = build_model(cfg)
    t1 = train(first, corpus, half, args.steps1, cfg, seed=1)
    first_loss = val_loss(first, corpus, cfg)
    print(f"first model: {args.steps1} steps on half the training text in {t1:.0f}s, val loss {first_loss:.4f}",
          flush=True)

    results = {}
    fresh = build_model(cfg.with_overrides(run={"seed": 100}))
    naive = copy.deepcopy(first)
    sp = build_model(cfg)
    noise = fresh_parameters(lambda: build_model(cfg), seed=200)
    sp.load_state_dict(shrink_perturb(dict(first.named_parameters()), noise, args.shrink, args.perturb))
    for name, model in (("fresh", fresh), ("naive", naive), ("shrink_perturb", sp)):
        curve: list = []
        wall = train(model, corpus, corpus.train.end, args.steps2, cfg, seed=2, eval_every=args.eval_every,
                     curve=curve)
        final = curve[-1][1] if curve else val_loss(model, corpus, cfg)
        best = min((loss for _, loss in curve), default=final)
        results[name] = {"val_loss": final, "best_val_loss": best, "wall_s": wall, "curve": curve}
        print(f"  {name:15} val loss {final:.4f} (best {best:.4f})  ({wall:.0f}s)", flush=True)
    print_table(f"continue on all the training text for {args.steps2} steps (LSTM 1x{args.hidden})",
                ["start", "final val loss", "best val loss", "final val BPC", "vs fresh", "wall s"],
                [[k, v["val_loss"], v["best_val_loss"], v["val_loss"] / math.log(2),
                  f"{v['val_loss'] / results['fresh']['val_loss']:.3f}x", v["wall_s"]] for k, v in results.items()])
    write_json(args.json, dict(results, first={"val_loss": first_loss, "wall_s": t1, "steps": args.steps1},
                               steps2=args.steps2, shrink=args.shrink, perturb=args.perturb,
                               max_bytes=args.max_bytes, hidden=args.hidden))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

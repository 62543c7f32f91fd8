"""What does a late average cost DiLoCo? In-process replicas with the average landing k local steps into the next
round, as ``averaging.overlap`` makes it land when a round takes k steps' time.

    python bench/delay.py [--H 10] [--rounds 30] [--delays 0 3 9] [--seeds 0 1] [--json FILE]

Three replicas of a byte-level LSTM (1 x 128, sequences of 32, batches of 16, AdamW 3e-3 cosine to 3e-4, clip 1)
train on tinyshakespeare, each on its own random batches, in one process on one thread (no swarm: only the
arithmetic of the rounds). Every round they average their pseudo-gradients (fp32, equal weights) and take DiLoCo's
outer step (SGD with Nesterov momentum, ``--outer``). With a delay k > 0 the replicas take k steps of the next
round before the average lands, and then keep what they learned meanwhile (cotrain.averaging.overlap's
``carry_local_progress``), either from where they were ("naive") or from the outer step of their own
pseudo-gradient alone ("eager", what cotrain's DiLoCo does). The last round's average lands at once in every run,
so all runs train the same samples. The table gives the shared model's validation loss (nats per byte, the first
32 KiB of the validation split) and its ratio to k = 0 with the same seed.

The JSON: ``{"runs": [{"outer_lr", "outer_momentum", "H", "rounds", "delay", "mode", "seed", "val_loss",
"vs_no_delay"}]}``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import bench_parser, default_text, print_table, write_json  # noqa: E402

from cotrain.averaging.overlap import carry_local_progress  # noqa: E402
from cotrain.models.rnn_lm import RNNLanguageModel  # noqa: E402

REPLICAS, BATCH, SEQ = 3, 16, 32


def outer_step(global_params, momentum, average, lr, mu):
    """DiLoCo's outer step, in place: torch's SGD with Nesterov momentum ``mu`` (plain SGD when 0)."""
    opt = torch.optim.SGD(global_params, lr=lr, momentum=mu, nesterov=mu > 0)
    if mu > 0:
        for g, m in zip(global_params, momentum):
            opt.state[g]["momentum_buffer"] = m
    for g, d in zip(global_params, average):
        g.grad = d.clone()
    opt.step()
    for g in global_params:
        g.grad = None


def run(text: np.ndarray, args, delay: int, mode: str, seed: int, lr: float, mu: float) -> float:
    n = len(text)
    train, val = text[: int(n * 0.9)], text[int(n * 0.9):]
    torch.manual_seed(seed)
    shared = RNNLanguageModel("lstm", 64, 128, 1, 0.0)
    replicas = [RNNLanguageModel("lstm", 64, 128, 1, 0.0) for _ in range(REPLICAS)]
    for r in replicas:
        r.load_state_dict(shared.state_dict())
    steps = args.H * args.rounds
    opts = [torch.optim.AdamW(r.parameters(), 3e-3, weight_decay=0.0) for r in replicas]
    scheds = [torch.optim.lr_scheduler.LambdaLR(
        o, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))) for o in opts]
    rngs = [np.random.default_rng(seed * 10 + i) for i in range(REPLICAS)]
    glob = [p.detach().clone() for p in shared.parameters()]
    momentum = [torch.zeros_like(g) for g in glob]

    def params(r):
        return list(r.parameters())

    def step_all():
        for r, o, sc, rng in zip(replicas, opts, scheds, rngs):
            idx = rng.integers(0, len(train) - SEQ - 1, BATCH)
            x = torch.from_numpy(np.stack([train[i:i + SEQ + 1] for i in idx]).astype(np.int64))
            logits, _ = r(x[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1))
            o.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(r.parameters(), 1.0)
            o.step()
            sc.step()

    pending = None  # (average, the points each replica went on from)
    for rnd in range(args.rounds):
        for s in range(args.H):
            if pending is not None and s == delay:
                average, starts = pending
                outer_step(glob, momentum, average, lr, mu)
                with torch.no_grad():
                    for r, start in zip(replicas, starts):
                        carry_local_progress(params(r), start, glob)
                pending = None
            step_all()
        with torch.no_grad():
            deltas = [[g - p.detach() for g, p in zip(glob, params(r))] for r in replicas]
            average = [sum(ds) / REPLICAS for ds in zip(*deltas)]
        if delay == 0 or rnd == args.rounds - 1:
            outer_step(glob, momentum, average, lr, mu)
            with torch.no_grad():
                for r in replicas:
                    for p, g in zip(params(r), glob):
                        p.copy_(g)
            continue
        starts = []
        for r, d in zip(replicas, deltas):
            if mode == "eager":  # the outer step this replica's own pseudo-gradient alone would give
                guess = [g.clone() for g in glob]
                outer_step(guess, [m.clone() for m in momentum], d, lr, mu)
                with torch.no_grad():
                    for p, x in zip(params(r), guess):
                        p.copy_(x)
                starts.append(guess)
            else:  # naive: from where it was
                starts.append([p.detach().clone() for p in params(r)])
        pending = (average, starts)
    with torch.no_grad():
        for p, g in zip(shared.parameters(), glob):
            p.copy_(g)
        v = torch.from_numpy(val[:32768].astype(np.int64))
        v = v[: (len(v) - 1) // 128 * 128 + 1]
        logits, _ = shared(v[:-1].reshape(-1, 128))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 256), v[1:].reshape(-1, 128).reshape(-1)).item()


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--H", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--delays", type=int, nargs="+", default=[0, 3, 9], help="steps; each below H")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--outer", nargs="+", default=["0.7:0.9", "1.0:0.5"], metavar="LR:MOMENTUM")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if any(not 0 <= k < args.H for k in args.delays):
        parser.error(f"--delays: each must be in [0, H), got {args.delays} with H={args.H}")
    outers = []
    for item in args.outer:
        lr, _, mu = item.partition(":")
        try:
            outers.append((float(lr), float(mu)))
        except ValueError:
            parser.error(f"--outer: expected LR:MOMENTUM, got {item!r}")
    torch.set_num_threads(1)
    text = np.frombuffer(Path(args.data or default_text()).read_bytes(), dtype=np.uint8)
    runs = []
    for lr, mu in outers:
        for seed in args.seeds:
            base = None
            for k in sorted(set(args.delays)):
                for mode in (["none"] if k == 0 else ["naive", "eager"]):
                    loss = run(text, args, k, mode, seed, lr, mu)
                    base = loss if k == 0 else base
                    row = dict(outer_lr=lr, outer_momentum=mu, H=args.H, rounds=args.rounds, delay=k, mode=mode,
                               seed=seed, val_loss=loss, vs_no_delay=loss / base if base else float("nan"))
                    runs.append(row)
                    print(f"  outer {lr}/{mu} seed {seed} delay {k} {mode:5}: val loss {loss:.4f}", flush=True)
    print_table(f"a late average: {REPLICAS} replicas, H={args.H}, {args.rounds} rounds",
                ["outer lr/momentum", "seed", "delay (steps)", "mode", "val loss", "vs no delay"],
                [[f"{r['outer_lr']}/{r['outer_momentum']}", r["seed"], r["delay"], r["mode"], r["val_loss"],
                  r["vs_no_delay"]] for r in runs])
    write_json(args.json, {"runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

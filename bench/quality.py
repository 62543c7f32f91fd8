"""Does the swarm learn as well as one machine? Validation BPC of a plain PyTorch loop, a single node and a 3-node
swarm at equal total samples, side by side, and a world model trained by a swarm whose dream-trained controller is
tried in the real environment.

    python bench/quality.py [--samples 72000] [--nodes 3] [--inner-steps 10] [--json FILE]

The language-model runs use the model, data and budget of ../shared/BASELINES.md (a char LSTM 2x256 on
tinyshakespeare, TBPTT 128, AdamW 3e-3 cosine to 3e-4, clip 1, 72,000 sequences of 128 bytes in total):

- plain: a PyTorch loop in this process over the same model and data (cotrain's model and stream batches, 32
  streams over the whole training split), every core: what the node's machinery costs, if anything;
- single: one real node under a real coordinator, every core, batches of 32;
- reference: the issue's plain 2x384 LSTM (1.9M parameters; 2.07 BPC in 10 minutes where it was measured), as a
  plain loop for the single node's wall time with the cosine over that time: does the node match it per minute?
  Twice: as the issue describes it (a character vocabulary, PyTorch's initialisation), and with cotrain's byte
  model and initial output bias (what the reference would reach with that one change).
- swarm: 3 real nodes (one torch thread each, sharing this machine's cores: no speed-up is possible here) that split
  the batch of 32 as data-parallel training does (11 sequences each, 33 in all), so that they take as many steps
  as the single node for the same samples, and average every H steps (DiLoCo, outer lr 1.0 momentum 0.5); by
  default twice, without and with ``averaging.overlap`` (``--overlap off|on|both``). Each node stops at its share
  of the steps (``--max-steps``); the table also gives the wall time per sample against the single node's, and the
  JSON each swarm's compute utilization (the nodes' compute_s / wall_s).

Why split the batch: at this budget the loss depends on the number of sequential steps more than on the batch.
Nodes that each keep batches of 32 take a third of the steps; measured in-process (3 replicas, ideal averaging),
they end 10-20% above the single node whatever the outer step (H=50 0.7/0.9: 2.82 BPC, H=10 plain averaging: 2.65,
against 2.32 for one replica; measured before the output bias started from the byte frequencies).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (BENCH_OPTIMIZER, LOCAL_TIMINGS, cosine_schedule, default_text, print_table,  # noqa: E402
                    run_swarm, swarm_config, write_json)

from cotrain.config import RunConfig  # noqa: E402


#: the plain loop's wall-time mode: a cosine over this many "samples", evaluated at the fraction of the time spent
WALL_SAMPLES = 10**9


def lm_config(data: str, batch_size: int, total_samples: int, inner_steps: int, outer_lr: float,
              outer_momentum: float, **sections: dict) -> RunConfig:
    """The language-model run: a cosine from lr to min_lr over ``total_samples`` sequences of the whole swarm (all
    nodes together; 0: a constant lr); ``sections`` add to it as :func:`~cotrain.cli.local_swarm.swarm_config`
    merges them."""
    return swarm_config(dict(
        run={"name": "quality", "seed": 0},
        model={"kind": "lstm", "embed_dim": 64, "hidden_size": 256, "num_layers": 2, "dropout": 0.1},
        data={"source": data, "seq_len": 128, "batch_size": batch_size, "val_fraction": 0.1},
        optimizer=BENCH_OPTIMIZER,
        schedule=cosine_schedule(total_samples) if total_samples else {"kind": "constant", "warmup_samples": 0},
        averaging={"inner_steps": inner_steps, "outer_lr": outer_lr, "outer_momentum": outer_momentum,
                   **LOCAL_TIMINGS},
        # units of about a third of the training text: a swarm node gets one each, a single node takes them in
        # turn, and the recurrent state is carried across long streams as in the plain LSTM of BASELINES.md
        coordinator={"checkpoint_interval_s": 3600.0, "unit_bytes": 320_000},
        device="cpu",
    ), sections)


def run_plain(data: str, total_sequences: int = 0, wall_s: float = 0.0, hidden_size: int = 256,
              batch_size: int = 32, chars: bool = False, overrides: dict | None = None,
              threads: int = 0) -> dict:
    """A plain PyTorch loop in this process over cotrain's model and stream batches (32 streams over the whole
    training split), no coordinator, no DHT, every core; the same optimizer and schedule as the nodes. The budget is
    ``total_sequences`` (cosine over those samples) or ``wall_s`` seconds of training (cosine over the time: the
    issue's reference LSTM, 2x384, run for the single node's wall time; the schedule's horizon is then
    :data:`WALL_SAMPLES`, evaluated at the fraction of ``wall_s`` spent).

    ``chars``: the reference as the issue describes it, a plain character model: a vocabulary of the characters in
    the training text (65 on tinyshakespeare; unseen ones read as the first), PyTorch's default initialisation (no
    output bias from the byte frequencies). Bits per character equal bits per byte on ASCII text.

    ``overrides``: config sections to replace (``{"model": {...}, "optimizer": {...}}``, bench/models.py);
    ``threads``: torch threads (0: torch's default, every core)."""
    import torch

    from cotrain.data import Corpus, StreamBatches
    from cotrain.evaluation import evaluate_model
    from cotrain.optim import build_optimizer
    from cotrain.optim.schedule import Schedule, lr_factor
    from cotrain.tasks import build_task

    steps = total_sequences // batch_size if total_sequences else 1 << 62
    cfg = lm_config(data, batch_size, steps * batch_size if total_sequences else WALL_SAMPLES, 1, 1.0, 0.0)
    cfg = cfg.with_overrides(model={"hidden_size": hidden_size})
    if overrides:
        cfg = cfg.with_overrides(**overrides)
    opt = cfg.optimizer
    schedule = Schedule.from_config(cfg)
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(cfg.run.seed)  # dropout's draws, and the char model's initial weights
    torch.set_flush_denormal(True)
    corpus = Corpus.from_source(data, val_fraction=cfg.data.val_fraction)
    task = build_task(cfg)
    text = corpus
    if chars:
        from cotrain.models import RNNLanguageModel

        text = CharText(corpus)
        m = cfg.model
        model = RNNLanguageModel(m.kind, m.embed_dim, hidden_size, m.num_layers, m.dropout, vocab_size=len(text.used))
    else:
        model = task.build_model(corpus.byte_counts())  # as a node builds it from what the coordinator sends
    optimizer = build_optimizer(model, opt)
    batches = StreamBatches(text.read, corpus.train.start, corpus.train.end, batch_size, cfg.data.seq_len)
    started, state, step = time.monotonic(), None, 0
    while step < steps:
        elapsed = time.monotonic() - started
        if wall_s and elapsed >= wall_s:
            break
        x, y, new_epoch = batches.next_batch()
        state = None if new_epoch else state
        for group in optimizer.param_groups:
            group["lr"] = opt.lr * lr_factor(schedule, elapsed / wall_s * WALL_SAMPLES if wall_s
                                             else step * batch_size)
        loss, state, _ = task.step(model, (x, y), state, torch.device("cpu"))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt.grad_clip)
        optimizer.step()
        state = model.detach_state(state)
        step += 1
    wall = time.monotonic() - started
    result = evaluate_model(cfg, model, corpus=text)
    return dict(nodes=1, val_bpc=result["val_bpc"], val_loss=result["val_loss"], wall_s=wall,
                samples=step * batch_size, batch_size=batch_size, hidden_size=hidden_size, steps=step,
                bytes_per_s=step * batch_size * cfg.data.seq_len / wall,
                params=sum(p.numel() for p in model.parameters()))


class CharText:
    """A corpus read as a plain character model reads it: each byte value that occurs in the training text is
    replaced by its index among those values (unseen ones by 0). Reads like a :class:`cotrain.data.Corpus`, so that
    the run's evaluation reads it too."""

    def __init__(self, corpus):
        counts = corpus.byte_counts()
        self.used = [b for b in range(256) if counts[b]]
        self.table = bytes(self.used.index(b) if counts[b] else 0 for b in range(256))
        self.corpus, self.train, self.val = corpus, corpus.train, corpus.val

    def read(self, offset: int, length: int) -> bytes:
        return self.corpus.read(offset, length).translate(self.table)


def run_lm(data: str, nodes: int, total_sequences: int, inner_steps: int, outer_lr: float,
           outer_momentum: float, batch_size: int = 32, overrides: dict | None = None) -> dict:
    """A single node (``nodes`` = 1) with batches of ``batch_size``, or a swarm whose nodes split that batch (as
    data-parallel training keeps the global batch): each takes ``batch_size / nodes`` sequences a step, so the
    swarm takes as many steps as the single node for the same samples.

    ``overrides``: config sections to replace (bench/models.py). With ``averaging.strategy = "sync"`` a round is
    ``inner_steps`` micro-batches of every node (the collaborative batch: nodes x batch x inner_steps). Either way
    the lr follows a cosine over the swarm's samples (rounds x inner_steps x per-node batch x nodes)."""
    per_node = max(1, round(batch_size / nodes))
    steps_per_node = total_sequences // (per_node * nodes)
    rounds = max(1, steps_per_node // inner_steps)
    cfg = lm_config(data, per_node, rounds * inner_steps * per_node * nodes, inner_steps, outer_lr, outer_momentum)
    if overrides:
        cfg = cfg.with_overrides(**overrides)
    if nodes == 1:
        # a lone node trains plainly: outer lr 1 without momentum makes its round a no-op (DiLoCo's 0.7/0.9
        # outer step on its own pseudo-gradient cost 0.22 BPC: 2.556 against 2.335)
        cfg = cfg.with_overrides(averaging={"outer_lr": 1.0, "outer_momentum": 0.0})
    # a single node uses every core (torch's default threads), as the plain loop does; swarm nodes one thread each.
    # --max-steps alone holds every node to its share of the samples: a node that reaches a round's end keeps
    # training while it waits for slower peers, so --max-rounds alone let the swarm take 1.42x the samples; and a
    # node ends its round when a peer begins averaging, a step or two short of H (with overlap the fastest one
    # never waits), so --max-rounds with --max-steps stopped the swarm 6% short of them
    run = run_swarm(cfg, nodes, ["--max-steps", str(rounds * inner_steps),
                                 *(["--threads", "0"] if nodes == 1 else [])])
    util = [n["compute_s"] / n["wall_s"] for n in run.nodes if n.get("wall_s", 0) > 0]
    return dict(nodes=nodes, val_bpc=run.metrics["val_bpc"], val_loss=run.metrics["val_loss"], wall_s=run.wall_s,
                samples=run.samples, rounds=rounds, inner_steps=inner_steps, batch_size=per_node,
                bytes_sent_per_node=run.bytes_sent_per_node,
                compute_utilization=sum(util) / len(util) if util else None)


def run_world_model(nodes: int, rounds: int, env_id: str) -> dict:
    from cotrain.evaluation import evaluate_state

    cfg = swarm_config(dict(
        run={"name": "quality-wm", "seed": 0},
        model={"kind": "mdn_rnn", "hidden_size": 64, "num_layers": 1, "num_mixtures": 5},
        env={"id": env_id, "episodes": 64, "horizon": 50, "eval_episodes": 64},
        data={"batch_size": 16},
        optimizer={"lr": 3e-3, "min_lr": 3e-3},
        schedule={"kind": "constant", "warmup_samples": 0},  # a constant lr, as before the [schedule] section
        averaging={"inner_steps": 50, **LOCAL_TIMINGS},
        coordinator={"checkpoint_interval_s": 3600.0},
        device="cpu",
    ))
    run = run_swarm(cfg, nodes, ["--max-rounds", str(rounds)], evaluate=False)
    state = {k[len("model."):]: v for k, v in run.final["tensors"].items() if k.startswith("model.")}
    metrics = evaluate_state(cfg, state, controller=True)  # as the coordinator with coordinator.eval_controller
    return dict(env=env_id, nodes=nodes, val_nll=metrics["nll"], normalized_mse=metrics["normalized_mse"],
                controller_return=metrics["controller_return"], random_return=metrics["random_return"],
                wall_s=run.wall_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="text file (default ../shared/data/tinyshakespeare.txt)")
    parser.add_argument("--samples", type=int, default=72_000, help="sequences of 128 bytes in total, per side")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--inner-steps", type=int, default=10, help="DiLoCo H of the swarm")
    parser.add_argument("--outer-lr", type=float, default=1.0, help="the swarm's outer learning rate")
    parser.add_argument("--outer-momentum", type=float, default=0.5, help="the swarm's outer Nesterov momentum")
    parser.add_argument("--overlap", choices=("off", "on", "both"), default="both",
                        help="the swarm with averaging.overlap off, on, or both (two swarm rows)")
    parser.add_argument("--skip-plain", action="store_true", help="no plain PyTorch loop at the same samples")
    parser.add_argument("--skip-reference", action="store_true",
                        help="no 2x384 reference LSTM (the issue's: 2.07 BPC in 10 minutes) for the single node's "
                             "wall time")
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--wm-rounds", type=int, default=20)
    parser.add_argument("--skip-lm", action="store_true")
    parser.add_argument("--skip-world-model", action="store_true")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    data = args.data or default_text()
    out: dict = {}
    if not args.skip_lm:
        rows = []
        if not args.skip_plain:
            plain = run_plain(data, args.samples)
            out["plain"] = {k: plain[k] for k in ("val_bpc", "wall_s", "samples")}
            rows.append(["plain PyTorch loop", 1, 32, plain["samples"], plain["val_bpc"], plain["wall_s"]])
        single = run_lm(data, 1, args.samples, 50, 1.0, 0.0)  # a lone node's rounds change nothing: H is moot
        if not args.skip_reference:
            for label, chars in (("plain char", True), ("cotrain init", False)):
                ref = run_plain(data, wall_s=single["wall_s"], hidden_size=384, chars=chars)
                out["reference_2x384_" + ("chars" if chars else "bytes")] = {
                    k: ref[k] for k in ("val_bpc", "wall_s", "samples")}
                rows.append([f"reference LSTM 2x384 ({label}), same wall time", 1, 32, ref["samples"],
                             ref["val_bpc"], ref["wall_s"]])
        out["single"] = {k: single[k] for k in ("val_bpc", "wall_s", "samples")}
        rows.append(["single node", 1, single["batch_size"], single["samples"], single["val_bpc"], single["wall_s"]])
        for overlap in {"off": (False,), "on": (True,), "both": (False, True)}[args.overlap]:
            swarm = run_lm(data, args.nodes, args.samples, args.inner_steps, args.outer_lr, args.outer_momentum,
                           overrides={"averaging": {"overlap": overlap}})
            out["swarm_overlap" if overlap else "swarm"] = dict(
                {k: swarm[k] for k in ("nodes", "val_bpc", "wall_s", "samples", "batch_size", "inner_steps",
                                       "compute_utilization")},
                wall_vs_single=swarm["wall_s"] / single["wall_s"],
                wall_per_sample_vs_single=(swarm["wall_s"] / swarm["samples"]) / (single["wall_s"] / single["samples"]))
            rows.append([f"swarm (DiLoCo H={swarm['inner_steps']}{', overlap' if overlap else ''})", swarm["nodes"],
                         swarm["batch_size"], swarm["samples"], swarm["val_bpc"], swarm["wall_s"]])
        # the swarm's budget is whole rounds of every node (a little under the single node's samples): the time per
        # sample compares them at equal samples
        print_table("language model (char LSTM 2x256, tinyshakespeare)",
                    ["run", "nodes", "batch/node", "samples", "val BPC", "wall s", "BPC vs single", "wall vs single",
                     "wall/sample vs single"],
                    [row + [row[4] / single["val_bpc"], row[5] / single["wall_s"],
                            (row[5] / row[3]) / (single["wall_s"] / single["samples"])] for row in rows])
    if not args.skip_world_model:
        wm = run_world_model(args.nodes, args.wm_rounds, args.env)
        out["world_model"] = {"val_nll": wm["val_nll"], "controller_return": wm["controller_return"],
                              "random_return": wm["random_return"], "env": wm["env"],
                              "normalized_mse": wm["normalized_mse"], "wall_s": wm["wall_s"]}
        print_table(f"world model (MDN-RNN, {wm['env']}, {wm['nodes']}-node swarm)",
                    ["val NLL", "MSE / copy-last", "controller return", "random return", "wall s"],
                    [[wm["val_nll"], wm["normalized_mse"], wm["controller_return"], wm["random_return"],
                      wm["wall_s"]]])
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

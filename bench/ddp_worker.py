"""One rank of the data-parallel baseline of bench/wan.py: torch.distributed (gloo) with DistributedDataParallel.

    python bench/ddp_worker.py --config run.toml --rank R --world-size N --master ADDR:PORT --t0 T \
        --budget-s S --target-val-loss L --eval-every K --out evals.jsonl

It trains exactly what a cotrain node of the same run config trains: the same model and initial weights
(``build_model``, from ``run.seed``), the same contiguous shard of the training split as the
coordinator would assign to the R-th of N nodes, the same batches (``StreamBatches``, hidden state carried across
batches), the same AdamW, learning-rate schedule (the run's ``[schedule]`` at the samples of all the ranks
together, as a node takes it at the swarm's samples) and gradient clipping. Gradients are averaged after every step.

Rank 0 evaluates the validation loss (``eval_bytes`` of the validation split, as the coordinator does) every K
steps and appends ``{"time", "eval_s", "step", "val_loss", "loss"}`` to ``--out``; ranks stop together once the
validation loss is at or below the target, or once the budget is spent. Time is measured from ``--t0`` (the
moment the launcher started the ranks) minus the time rank 0 spent evaluating.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from cotrain.config import RunConfig
from cotrain.data import Corpus
from cotrain.optim import build_optimizer
from cotrain.evaluation import evaluate_model
from cotrain.models import build_model
from cotrain.optim.schedule import Schedule, lr_factor  # the run's schedule, as the nodes take it
from cotrain.tasks import build_task


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the run config (TOML) the cotrain side ran")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--master", required=True, help="rank 0's HOST:PORT (the rendezvous store)")
    parser.add_argument("--t0", type=float, required=True, help="time.time() when the ranks were launched")
    parser.add_argument("--budget-s", type=float, required=True)
    parser.add_argument("--target-val-loss", type=float, required=True)
    parser.add_argument("--eval-every", type=int, default=25, help="steps between two evaluations on rank 0")
    parser.add_argument("--out", default=None, help="rank 0: append the evaluations to this JSON-lines file")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    cfg = RunConfig.load(args.config)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank,
                            world_size=args.world_size, timeout=timedelta(seconds=300))
    task = build_task(cfg)
    corpus = Corpus.from_source(cfg.data.source, cfg.data.max_bytes, cfg.data.val_fraction)
    model = build_model(cfg, corpus.byte_counts())  # the initial weights a cotrain node starts from
    ddp = DistributedDataParallel(model)
    opt_cfg = cfg.optimizer
    schedule = Schedule.from_config(cfg)
    optimizer = build_optimizer(model, opt_cfg)  # the run's inner optimizer, as a node builds it
    share = corpus.train.size // args.world_size  # a contiguous shard per rank, as DistributedSampler would
    start = corpus.train.start + args.rank * share
    batches = task.train_data(corpus.read, start, start + share, cfg.run.seed)
    out = open(args.out, "a") if args.rank == 0 and args.out else None
    device = torch.device("cpu")

    state, step, eval_total = None, 0, 0.0
    flag = torch.zeros(1)
    while True:
        batch, reset_state = batches.next()
        if reset_state:
            state = None
        for group in optimizer.param_groups:
            group["lr"] = opt_cfg.lr * lr_factor(schedule, step * cfg.data.batch_size * args.world_size)
        loss, state, _ = task.step(ddp, batch, state, device)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients over the ranks here
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt_cfg.grad_clip)
        optimizer.step()
        state = model.detach_state(state)
        step += 1
        if step % args.eval_every:
            continue
        if args.rank == 0:
            started = time.time()
            val_loss = evaluate_model(cfg, model, corpus=corpus, max_bytes=cfg.coordinator.eval_bytes)["val_loss"]
            eval_s = time.time() - started
            eval_total += eval_s
            elapsed = started - args.t0 - (eval_total - eval_s)
            if out is not None:
                out.write(json.dumps(dict(time=started, eval_s=eval_s, elapsed_s=elapsed, step=step,
                                          val_loss=val_loss, loss=loss.item())) + "\n")
                out.flush()
            print(f"step {step} elapsed {elapsed:.1f}s loss {loss.item():.3f} val_loss {val_loss:.4f}", flush=True)
            done = val_loss <= args.target_val_loss or time.time() - args.t0 - eval_total >= args.budget_s
            flag.fill_(1.0 if done else 0.0)
        dist.broadcast(flag, src=0)
        if flag.item():
            break
    if out is not None:
        out.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a user would run instead of cotrain, side by side with it: the same model, data, budget and cores.

    python bench/peers.py [--runs single ddp ...] [--samples 24000] [--eval-every 50] [--target-val-bpc X]
                          [--worker-batch 32] [--H 50] [--overlap] [--json FILE]

One row after another on this machine (``../shared/BASELINES.md``'s setup at its side-by-side budget):

- ``single``: one plain PyTorch process, no communication, every core (torch threads = this machine's CPUs, or
  ``--single-threads``);
- ``ddp``: torch DistributedDataParallel, gloo, 3 processes (gradients averaged every step, global batch 96);
- ``hivemind_diloco``: 3 peers of DiLoCo on hivemind's ``DecentralizedAverager`` (bench/hivemind_peer.py): H local
  AdamW steps (``--H``, 50), then the pseudo-gradients are averaged in fp16 and every peer takes an outer Nesterov
  SGD step (lr 0.7, momentum 0.9: BASELINES.md's);
- ``hivemind_optimizer``: 3 peers of ``hivemind.Optimizer`` (bench/hivemind_peer.py), target batch 96, fp16 gradient
  compression, its documented defaults otherwise (state averaging every epoch, uncompressed);
- ``cotrain_diloco``: a real coordinator and 3 ``cotrain node join`` processes, DiLoCo with the same H, outer
  step and fp16 compression as the hivemind DiLoCo row;
- ``cotrain_sync``: the same swarm with ``averaging.strategy = "sync"``, one micro-batch per round (data-parallel
  training: the collaborative batch 96 of ``hivemind.Optimizer``), fp16 gradients.

``--worker-batch 11`` makes every 3-worker row split the single process's batch of 32 (11 sequences a worker, 33
in all: DDP's global batch, hivemind.Optimizer's target batch and cotrain's alike), so that each worker takes as
many steps as the single process, as data-parallel training keeps the global batch; ``--overlap`` runs the cotrain
rows with ``averaging.overlap``.

Common to every row: tinyshakespeare (``--data``), first 90% train / last 10% validation; cotrain's byte-level char
LSTM (embedding 64, 2 layers x 256, dropout 0.1, 256-value byte vocabulary with the output bias started from the
training text's byte frequencies: 938,240 parameters; BASELINES.md's peer rows used a 65-character vocabulary,
876,929 parameters), the same initial weights (cotrain's ``build_model`` from seed 0), TBPTT 128 with the state
carried, 32 streams per worker, AdamW 3e-3 (betas 0.9/0.99) cosine to 3e-4 over the row's samples (all workers
together, no warmup: ``[schedule]`` kind "cosine"), gradient clipping at 1.0. The budget is ``--samples`` sequences
of 128 bytes in total: the single process takes samples / 32 steps; each of the 3 workers of the other rows a third
of that (its contiguous third of the training text, as DistributedSampler would give; a cotrain node gets the
coordinator's work units); the DiLoCo rows round it down to whole rounds; a hivemind.Optimizer peer finishes the
global step (epoch of 96) in progress when it has taken its share, and stops once the swarm has taken the epochs
that the budget makes (see bench/hivemind_peer.py; ``samples`` reports what every row took). The 3 workers of a row
each take 1 torch thread and share this machine's cores, so a row shows the cost of its communication, not a
speed-up. The averaging rows all match with 3.0 s of matchmaking and 2.0 s request timeouts (cotrain's defaults,
within hivemind's documented 3-5 s for local runs) and form groups of up to 3; cotrain averages with the plain
weighted mean (``aggregation = "mean"``), as hivemind does, and keeps its defaults otherwise (group formation,
overlap).

What each figure is:

- ``wall_s``: from the launch of the row's processes (imports, rendezvous, DHT bootstrap included; cotrain's
  coordinator already runs) to the end of the last worker's last training step (its last averaging included).
- ``val_bpc``: bits per byte (= per character on this ASCII text) of the row's final model on the whole validation
  split, measured the one way for every row: ``cotrain.evaluation.evaluate_state`` (nats / ln 2, 8 streams, state
  carried). Final model: the single process's; rank 0's (DDP); peer 0's global parameters after the last round
  (hivemind DiLoCo); the parameters of the hivemind.Optimizer peer with the most epochs (peer 0's unless it ended
  out of sync); the node copy with the most rounds (cotrain).
- ``time_to_target_s``: the first time, counted like ``wall_s``, at which the row's model had val BPC <=
  ``--target-val-bpc`` (default: the single row's final BPC x 1.02), null if never. Worker 0 saves its model every
  ``--eval-every`` local steps (DiLoCo: at the first round end past each multiple) with the time; cotrain's
  coordinator saves the swarm's state after each round (it checks every 2 s, every 5 s for sync, whose rounds are
  single steps) and the checkpoints past each multiple are used. All are evaluated after the row has finished (in
  the bench's process, one thread), so evaluation takes none of the row's time or cores; a cotrain checkpoint's
  time is when the coordinator had it (up to that interval after the round).
- ``bytes_per_node``: what a worker sent averaging, mean over the workers. ddp: computed, not measured: a ring
  all-reduce of the fp32 gradients, 2 (n - 1) / n x 4 bytes x parameters per step. hivemind: measured, the
  ``AveragingData`` messages (all-reduce parts and averaged parts, for hivemind.Optimizer its gradient and its
  state averaging) a peer's averagers handed to the libp2p daemon (protobuf bytes; libp2p's framing and encryption,
  the DHT and matchmaking not counted). cotrain: the nodes' own count of the all-reduce pieces they served
  (``bytes_sent``). State transfers are reported apart (``state_bytes_per_node``: hivemind's ``DownloadData`` served
  to lagging peers; cotrain's state served, which here is mostly the bench's checkpoints).
- ``compute_utilization``: the fraction of a worker's training time (first step to last) spent computing, mean over
  the workers: forward and backward, and where the worker runs its own optimizer the clipping and its step (cotrain:
  its nodes' ``compute_s / wall_s``, as bench/communication.py). ddp: the time backward() waited after its last
  gradient bucket was handed to gloo is taken out (measured with a timing wrapper around DDP's default all-reduce
  hook). hivemind.Optimizer: ``opt.step()`` is not compute (accumulation, averaging, the global step, state
  downloads). Data loading is not compute.

Every 30 s a running row prints where its first worker is; the logs are in the work folder (``--keep`` keeps it).
``--json FILE`` writes ``{"target_val_bpc": ..., "runs": [{"name", "wall_s", "time_to_target_s", "val_bpc",
"bytes_per_node", "compute_utilization", ...}], "setup": {...}}`` (each run also has ``wall_vs_single``,
``samples``, ``steps_per_worker``, ``state_bytes_per_node``, ``bytes_how`` and its ``evals``). A row that fails is
kept with null figures and its ``error``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (Interrupted, Swarm, bench_parser, default_text, final_checkpoint, interruptible,  # noqa: E402
                    print_table, stop_all, stopped_on_exit, work_folder, write_json)
from quality import lm_config  # noqa: E402

from cotrain.config import RunConfig  # noqa: E402

HERE = Path(__file__).resolve().parent
ROWS = ("single", "ddp", "hivemind_diloco", "hivemind_optimizer", "cotrain_diloco", "cotrain_sync")
WORKERS = 3
BATCH = 32
#: every averaging row's matchmaking: cotrain's defaults, and within hivemind's documented 3-5 s for local runs
MATCHMAKING_S, REQUEST_TIMEOUT_S = 3.0, 2.0


# ---- the run config every row trains -------------------------------------------------------------------------------
def run_config(data: str, total_samples: int, inner_steps: int = 1, outer_lr: float = 0.7,
               outer_momentum: float = 0.9, strategy: str = "diloco", checkpoint_interval_s: float = 2.0,
               batch: int = BATCH, overlap: bool = False) -> RunConfig:
    """bench/quality.py's model, data and optimizer (``batch`` sequences a worker), cosine over ``total_samples``
    sequences of the whole row (every worker's together: steps a worker x ``batch`` x workers; 0: a constant lr);
    for the cotrain rows the averaging, fp16 compression, and a coordinator that keeps a checkpoint of every round
    it sees (no evaluation of its own: the bench evaluates them afterwards)."""
    return lm_config(
        data, batch, total_samples, inner_steps, outer_lr, outer_momentum,
        averaging={"strategy": strategy, "overlap": overlap, "aggregation": "mean", "target_group_size": WORKERS,
                   "matchmaking_time": MATCHMAKING_S, "request_timeout": REQUEST_TIMEOUT_S,
                   "round_wait": 0.0 if strategy == "sync" else 30.0},
        compression={"kind": "fp16"},
        coordinator={"checkpoint_interval_s": checkpoint_interval_s, "keep_checkpoints": 1_000_000,
                     "eval_every_rounds": 1_000_000_000, "eval_bytes": 1024})


# ---- one worker process (single, ddp; hivemind_peer.py's modes build on it) ----------------------------------------
def worker_parser(doc: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the run config (TOML): model, data, optimizer")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--steps", type=int, required=True, help="local steps to take")
    parser.add_argument("--eval-every", type=int, default=50, help="rank 0: save the model every this many steps")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", required=True, help="folder shared by the row's workers: results, snapshots")
    return parser


class Worker:
    """What every worker of the single, ddp and hivemind rows does alike: build cotrain's model with the run's
    initial weights, read its shard of the training split (rank R of N: the R-th contiguous N-th) in batches of
    streams with the state carried, count compute time, save rank 0's model every ``eval_every`` steps with the
    time (evaluated by the bench afterwards), and write ``worker-R.json`` at the end."""

    def __init__(self, args):
        import torch

        from cotrain.averaging.dht import kill_me_with_parent
        from cotrain.data import Corpus
        from cotrain.models import build_model
        from cotrain.optim.schedule import Schedule
        from cotrain.tasks import build_task

        kill_me_with_parent()  # a bench killed with -9 takes its workers along
        torch.set_num_threads(args.threads)
        try:
            torch.set_num_interop_threads(args.threads)
        except RuntimeError:
            pass
        torch.set_flush_denormal(True)
        self.args, self.rank, self.world = args, args.rank, args.world_size
        self.out = Path(args.out)
        self.cfg = RunConfig.load(args.config)
        self.schedule = Schedule.from_config(self.cfg)
        self.task = build_task(self.cfg)
        corpus = Corpus.from_source(self.cfg.data.source, self.cfg.data.max_bytes, self.cfg.data.val_fraction)
        self.model = build_model(self.cfg, corpus.byte_counts())  # every worker the same initial weights
        torch.manual_seed(self.cfg.run.seed + self.rank)  # dropout's draws, each worker its own
        share = corpus.train.size // self.world
        start = corpus.train.start + self.rank * share
        self.batches = self.task.train_data(corpus.read, start, start + share, self.cfg.run.seed)
        self.device = torch.device("cpu")
        self.state = None
        self.compute_s = 0.0
        self.t_first: Optional[float] = None
        self.next_snapshot = args.eval_every
        self.snapshots: list[dict] = []

    def next_batch(self):
        batch, reset = self.batches.next()
        if reset:
            self.state = None
        return batch

    @contextmanager
    def computing(self):
        started = time.time()
        if self.t_first is None:
            self.t_first = started
        try:
            yield
        finally:
            self.compute_s += time.time() - started

    def loss(self, net, batch):
        """Forward through ``net`` (the model or a wrapper of it), the state carried; -> the loss tensor."""
        loss, state, _ = self.task.step(net, batch, self.state, self.device)
        self.state = self.model.detach_state(state)
        return loss

    def lr(self, samples: float) -> float:
        """The run's lr after ``samples`` sequences of the whole row (every worker's together)."""
        from cotrain.optim.schedule import lr_factor

        return self.cfg.optimizer.lr * lr_factor(self.schedule, samples)

    def local_step(self, net, optimizer, step: int, after_backward: Callable[[], None] = lambda: None):
        """One plain step: lr from the run's schedule where the row is when every worker has taken ``step`` steps
        (``step`` x batch x workers samples), forward, backward, clip, step."""
        import torch

        batch = self.next_batch()
        with self.computing():
            for group in optimizer.param_groups:
                group["lr"] = self.lr(step * self.cfg.data.batch_size * self.world)
            loss = self.loss(net, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            after_backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optimizer.grad_clip)
            optimizer.step()
        return loss.item()

    def after_step(self, step: int, loss: float, last: Optional[bool] = None) -> None:
        """Rank 0: save the model when ``step`` reached the next multiple of ``eval_every`` or is the ``last`` (by
        default: the ``--steps``-th); everyone: a progress line now and then."""
        import torch

        last = step >= self.args.steps if last is None else last
        if self.rank == 0 and (step >= self.next_snapshot or last):
            now = time.time()
            path = self.out / f"snapshot-{step:06d}.pt"
            torch.save({n: p.detach().clone() for n, p in self.model.named_parameters()}, path)
            self.snapshots.append(dict(path=str(path), time=now, step=step))
            while self.next_snapshot <= step:
                self.next_snapshot += self.args.eval_every
        if step % max(1, self.args.eval_every) == 0 or last:
            print(f"step {step}/{self.args.steps} loss {loss:.3f}", flush=True)

    def barrier(self, name: str, timeout: float = 300.0) -> bool:
        """Wait until every worker of the row got here (a file each in the shared folder); False on timeout."""
        (self.out / f"{name}-{self.rank}.ready").touch()
        deadline = time.time() + timeout
        while len(list(self.out.glob(f"{name}-*.ready"))) < self.world:
            if time.time() > deadline:
                print(f"barrier {name}: timed out after {timeout:.0f}s", flush=True)
                return False
            time.sleep(0.1)
        return True

    def finish(self, t_end: float, steps: int, **extra) -> None:
        result = dict(rank=self.rank, steps=steps, samples=steps * self.cfg.data.batch_size, t_first=self.t_first,
                      t_end=t_end, compute_s=self.compute_s, snapshots=self.snapshots, **extra)
        tmp = self.out / f"worker-{self.rank}.json.tmp"
        tmp.write_text(json.dumps(result))
        tmp.replace(self.out / f"worker-{self.rank}.json")


def single_worker(args) -> int:
    from cotrain.optim import build_optimizer

    w = Worker(args)
    optimizer = build_optimizer(w.model, w.cfg.optimizer)
    for step in range(args.steps):
        loss = w.local_step(w.model, optimizer, step)
        w.after_step(step + 1, loss)
    w.finish(time.time(), args.steps, bytes_sent=0, state_bytes_sent=0)
    return 0


def ddp_worker(args) -> int:
    """One rank of torch DDP (gloo), DDP's default all-reduce of fp32 gradients every step, with a timing wrapper:
    backward()'s wait after the last bucket was handed to gloo is not counted as compute."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    from cotrain.optim import build_optimizer

    w = Worker(args)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank,
                            world_size=args.world_size, timeout=timedelta(seconds=300))
    try:
        ddp = DistributedDataParallel(w.model)
        last_bucket = [0.0]

        def timed_allreduce(state, bucket):
            last_bucket[0] = time.time()
            return default_hooks.allreduce_hook(state, bucket)  # state None: the default group, as DDP's own

        ddp.register_comm_hook(None, timed_allreduce)
        waited = [0.0]

        def after_backward():
            waited[0] += time.time() - last_bucket[0]

        optimizer = build_optimizer(w.model, w.cfg.optimizer)
        for step in range(args.steps):
            loss = w.local_step(ddp, optimizer, step, after_backward)
            w.after_step(step + 1, loss)
        t_end = time.time()
        w.compute_s -= waited[0]
        params = sum(p.numel() for p in w.model.parameters())
        n = args.world_size
        sent = 2 * (n - 1) / n * 4 * params * args.steps  # ring all-reduce of fp32 gradients: computed
        w.finish(t_end, args.steps, bytes_sent=sent, state_bytes_sent=0, comm_wait_s=waited[0])
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def worker_main(argv: list[str]) -> int:
    parser = worker_parser("a worker of bench/peers.py (single, ddp)")
    parser.add_argument("--mode", choices=("single", "ddp"), required=True)
    parser.add_argument("--master", default="", help="ddp: rank 0's HOST:PORT")
    args = parser.parse_args(argv)
    return single_worker(args) if args.mode == "single" else ddp_worker(args)


# ---- the launcher ----------------------------------------------------------------------------------------------------
class Setup:
    def __init__(self, args, data: str, threads: int):
        self.data, self.samples, self.eval_every, self.H = data, args.samples, args.eval_every, args.H
        self.outer_lr, self.outer_momentum = args.outer_lr, args.outer_momentum
        self.timeout = args.row_timeout_s
        self.single_threads = threads
        self.single_steps = args.samples // BATCH
        self.worker_batch, self.overlap = args.worker_batch, args.overlap
        self.steps = args.samples // (self.worker_batch * WORKERS)  # per worker of the 3-worker rows
        self.h = min(self.H, self.steps)  # a short smoke run has fewer steps than H
        self.rounds = self.steps // self.h
        self.diloco_steps = self.rounds * self.h


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_progress(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("step ")]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def run_workers(name: str, setup: Setup, folder: Path, argv_of: Callable[[int], list[str]], world: int) -> dict:
    """Start ``world`` worker processes (``argv_of(rank)``), wait until all exit, gather their results."""
    from wan import NsProc  # a command in its own process group, logged to a file

    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with stopped_on_exit(timeout=30) as procs:
        for rank in range(world):
            procs.append(NsProc(f"{name}-{rank}", argv_of(rank), folder / f"worker-{rank}.log"))
        deadline, last_print = t0 + setup.timeout, time.time()
        while any(p.alive() for p in procs) and time.time() < deadline:
            if any(p.popen.poll() not in (None, 0) for p in procs):
                break
            if time.time() - last_print >= 30:
                last_print = time.time()
                print(f"  {name}: {time.time() - t0:5.0f}s, rank 0 at {last_progress(folder / 'worker-0.log')}",
                      flush=True)
            time.sleep(0.5)
        timed_out = any(p.alive() for p in procs)
        codes = stop_all(procs, timeout=30)
    if timed_out or any(codes):
        failed = next((p for p, c in zip(procs, codes) if c), procs[0])
        why = f"timed out after {setup.timeout:.0f}s" if timed_out else f"exit codes {codes}"
        raise RuntimeError(f"{name}: {why}; last lines of {failed.name}:\n{failed.tail(1500)}")
    results = [json.loads((folder / f"worker-{r}.json").read_text()) for r in range(world)]
    wall = max(r["t_end"] for r in results) - t0
    util = [r["compute_s"] / (r["t_end"] - r["t_first"]) for r in results if r["t_end"] > (r["t_first"] or 0)]
    snapshots = [dict(s, elapsed_s=s["time"] - t0) for s in results[0]["snapshots"]]
    ahead = max(results, key=lambda r: r.get("epochs", 0))
    if snapshots and ahead.get("epochs", 0) > results[0].get("epochs", 0):  # hivemind.Optimizer: peer 0 lagged
        snapshots[-1] = dict(path=ahead["final_path"], time=ahead["t_end"], step=ahead["final_step"],
                             elapsed_s=ahead["t_end"] - t0, from_rank=ahead["rank"])
    return dict(wall_s=wall, steps_per_worker=round(sum(r["steps"] for r in results) / world),
                samples=sum(r["samples"] for r in results),
                bytes_per_node=sum(r["bytes_sent"] for r in results) / world,
                state_bytes_per_node=sum(r.get("state_bytes_sent", 0) for r in results) / world,
                compute_utilization=sum(util) / len(util) if util else None,
                snapshots=snapshots, final=snapshots[-1] if snapshots else None,
                workers=[{k: v for k, v in r.items() if k != "snapshots"} for r in results])


def worker_argv(script: Path, config: Path, rank: int, world: int, steps: int, setup: Setup, folder: Path,
                threads: int, extra: list[str]) -> list[str]:
    head = [sys.executable, str(script)] + (["worker"] if script.name == "peers.py" else [])
    return [*head, "--config", str(config), "--rank", str(rank), "--world-size", str(world), "--steps", str(steps),
            "--eval-every", str(setup.eval_every), "--threads", str(threads), "--out", str(folder), *extra]


def run_single(setup: Setup, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "run.toml"
    config.write_text(run_config(setup.data, setup.single_steps * BATCH).to_toml())
    row = run_workers("single", setup, folder, lambda r: worker_argv(
        HERE / "peers.py", config, r, 1, setup.single_steps, setup, folder, setup.single_threads,
        ["--mode", "single"]), 1)
    return dict(row, workers_n=1, bytes_how="none")


def run_ddp(setup: Setup, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "run.toml"
    config.write_text(run_config(setup.data, setup.steps * setup.worker_batch * WORKERS,
                                 batch=setup.worker_batch).to_toml())
    master = f"127.0.0.1:{free_port()}"
    row = run_workers("ddp", setup, folder, lambda r: worker_argv(
        HERE / "peers.py", config, r, WORKERS, setup.steps, setup, folder, 1,
        ["--mode", "ddp", "--master", master]), WORKERS)
    return dict(row, workers_n=WORKERS, bytes_how="computed (ring, fp32)")


def run_hivemind(mode: str, setup: Setup, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "run.toml"
    diloco = mode == "diloco"
    steps = setup.diloco_steps if diloco else setup.steps
    # the optimizer row's cosine runs over its epochs (global steps of worker_batch x WORKERS samples): as many
    # samples in all
    config.write_text(run_config(setup.data, steps * setup.worker_batch * WORKERS, batch=setup.worker_batch).to_toml())
    extra = ["--mode", mode, "--matchmaking-time", str(MATCHMAKING_S), "--request-timeout", str(REQUEST_TIMEOUT_S)]
    if diloco:
        extra += ["--H", str(setup.h), "--outer-lr", str(setup.outer_lr), "--outer-momentum", str(setup.outer_momentum)]
    else:
        extra += ["--target-batch-size", str(setup.worker_batch * WORKERS)]
    row = run_workers(f"hivemind_{mode}", setup, folder, lambda r: worker_argv(
        HERE / "hivemind_peer.py", config, r, WORKERS, steps, setup, folder, 1, extra), WORKERS)
    return dict(row, workers_n=WORKERS, bytes_how="measured (AveragingData msgs)")


def run_cotrain(strategy: str, setup: Setup, folder: Path) -> dict:
    """A real coordinator and 3 nodes (one torch thread each: :class:`Swarm`'s shares of 2 cores), each held to its
    share of the samples with --max-steps, as bench/quality.py's run_lm."""
    from cotrain.checkpoint import load_checkpoint
    from cotrain.cli.launch import wait_for

    diloco = strategy == "diloco"
    h = setup.h if diloco else 1
    rounds = setup.rounds if diloco else setup.steps
    steps = rounds * h
    # the schedule follows the swarm's samples, sync's and DiLoCo's alike; a checkpoint download holds parameters
    # and AdamW's state, and sync has a new round every step: a check every 5 s rather than 2 keeps their cost down
    cfg = run_config(setup.data, steps * setup.worker_batch * WORKERS, h, setup.outer_lr, setup.outer_momentum,
                     strategy, checkpoint_interval_s=2.0 if diloco else 5.0, batch=setup.worker_batch,
                     overlap=setup.overlap)
    names = [f"node-{i}" for i in range(WORKERS)]
    folder.mkdir(parents=True, exist_ok=True)
    with Swarm(cfg, folder, nodes=WORKERS) as swarm:
        t0 = time.time()
        procs = [swarm.start_node(name, ["--wait-peers", str(WORKERS),
                                         "--max-steps", str(steps)]) for name in names]
        last_print = time.time()

        def finished():
            nonlocal last_print
            if time.time() - last_print >= 30:
                last_print = time.time()
                status = folder / names[0] / "status.json"
                step = json.loads(status.read_text()).get("step", 0) if status.exists() else 0
                print(f"  cotrain_{strategy}: {time.time() - t0:5.0f}s, node-0 at step {step}/{steps}", flush=True)
            return not any(p.alive() for p in procs)

        wait_for(finished, setup.timeout, interval=0.5, what=f"cotrain_{strategy}'s nodes to finish")
        codes = swarm.stop_nodes()
        rows = swarm.node_rows()
    if any(codes):
        raise RuntimeError(f"cotrain_{strategy}: node exit codes {codes}; logs in {folder}")
    ends = []
    for name in names:
        status = folder / name / "status.json"
        if status.exists():
            ends.append(json.loads(status.read_text())["time"])
    wall = (max(ends) if ends else time.time()) - t0
    util = [float(r["compute_s"]) / float(r["wall_s"]) for r in rows if float(r.get("wall_s", 0)) > 0]
    # the coordinator's checkpoints, by round: the first past each multiple of eval_every local steps
    found = []
    for path in (folder / "coordinator" / "checkpoints").glob("round-*.safetensors"):
        m = re.fullmatch(r"round-(\d+)\.safetensors", path.name)
        if m:
            found.append((int(m.group(1)) * h, path))
    snapshots, next_step = [], setup.eval_every
    for step, path in sorted(found):
        if step >= next_step and step < steps:
            ckpt = load_checkpoint(path)
            snapshots.append(dict(path=str(path), time=float(ckpt.metadata["time"]), step=step,
                                  elapsed_s=float(ckpt.metadata["time"]) - t0))
            while next_step <= step:
                next_step += setup.eval_every
    final = final_checkpoint(folder, names)
    snapshots.append(dict(path=None, state=final.model_state(), step=final.round * h, elapsed_s=wall))
    return dict(wall_s=wall, steps_per_worker=steps, workers_n=WORKERS,
                samples=sum(int(r.get("samples_local", 0)) for r in rows),
                bytes_per_node=sum(float(r.get("bytes_sent", 0)) for r in rows) / max(1, len(rows)),
                state_bytes_per_node=sum(float(r.get("state_bytes_sent", 0)) for r in rows) / max(1, len(rows)),
                compute_utilization=sum(util) / len(util) if util else None, snapshots=snapshots,
                final=snapshots[-1], bytes_how="counted by the nodes",
                workers=[{k: r.get(k) for k in ("name", "step", "round", "bytes_sent", "state_bytes_sent",
                                                "compute_s", "wall_s", "partial_rounds", "samples_local")}
                         for r in rows])


RUNNERS: dict[str, Callable[[Setup, Path], dict]] = {
    "single": run_single,
    "ddp": run_ddp,
    "hivemind_diloco": lambda setup, folder: run_hivemind("diloco", setup, folder),
    "hivemind_optimizer": lambda setup, folder: run_hivemind("optimizer", setup, folder),
    "cotrain_diloco": lambda setup, folder: run_cotrain("diloco", setup, folder),
    "cotrain_sync": lambda setup, folder: run_cotrain("sync", setup, folder),
}


def evaluate_row(row: dict, cfg: RunConfig, corpus) -> None:
    """Evaluate the row's saved models on the whole validation split (in this process, after the row): ``evals``
    and the final ``val_bpc``."""
    import torch

    from cotrain.evaluation import evaluate_state

    evals = []
    for snap in row.pop("snapshots"):
        state = snap.get("state")
        if state is None:
            path = snap["path"]
            if path.endswith(".safetensors"):
                from cotrain.checkpoint import load_checkpoint

                state = load_checkpoint(Path(path)).model_state()
            else:
                state = torch.load(path)
        started = time.time()
        bpc = evaluate_state(cfg, state, corpus=corpus)["val_bpc"]
        evals.append(dict(step=snap["step"], elapsed_s=snap["elapsed_s"], val_bpc=bpc,
                          eval_s=time.time() - started))
    row["evals"] = evals
    row["val_bpc"] = evals[-1]["val_bpc"] if evals else None
    row.pop("final", None)


def time_to_target(row: dict, target: float) -> Optional[float]:
    hit = [e["elapsed_s"] for e in row.get("evals", []) if e["val_bpc"] <= target]
    return min(hit) if hit else None


KEYS = ("wall_s", "time_to_target_s", "val_bpc", "bytes_per_node", "compute_utilization")


def main() -> int:
    if sys.argv[1:2] == ["worker"]:
        return worker_main(sys.argv[2:])
    parser = bench_parser(__doc__)
    parser.add_argument("--runs", nargs="+", choices=ROWS, default=list(ROWS), help="rows to run (in this order)")
    parser.add_argument("--samples", type=int, default=24_000, help="sequences of 128 bytes in total, per row")
    parser.add_argument("--eval-every", type=int, default=50,
                        help="local steps between two saved models of a row (evaluated afterwards)")
    parser.add_argument("--target-val-bpc", type=float, default=None,
                        help="time-to-target threshold (default: the single row's final BPC x 1.02; required "
                             "without the single row)")
    parser.add_argument("--H", type=int, default=50, help="DiLoCo rows: local steps per round")
    parser.add_argument("--worker-batch", type=int, default=BATCH,
                        help="sequences a step for each worker of the 3-worker rows (11: they split the single "
                             "process's batch of 32 and take as many steps as it does)")
    parser.add_argument("--overlap", action="store_true",
                        help="cotrain rows: averaging.overlap (rounds averaged while the next round's steps run)")
    parser.add_argument("--outer-lr", type=float, default=0.7, help="DiLoCo rows: outer Nesterov lr")
    parser.add_argument("--outer-momentum", type=float, default=0.9, help="DiLoCo rows: outer Nesterov momentum")
    parser.add_argument("--single-threads", type=int, default=0,
                        help="torch threads of the single row (0: this machine's CPUs). On a machine that other "
                             "programs keep busy, 2 threads on 2 cores stall at times (steps of 0.6 s took up to 9 s); "
                             "1 avoids that")
    parser.add_argument("--row-timeout-s", type=float, default=3600.0, help="a row still running then is stopped")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, saved models)")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    runs = [r for r in ROWS if r in args.runs]
    if args.target_val_bpc is None and "single" not in runs:
        parser.error("--target-val-bpc is required when the single row does not run")
    if args.worker_batch < 1 or args.samples < args.worker_batch * WORKERS or args.eval_every < 1 or args.H < 1:
        parser.error(f"--samples must be at least {args.worker_batch * WORKERS}; --worker-batch, --eval-every and "
                     "--H at least 1")
    data = args.data or default_text()

    from cotrain.cli.launch import machine_cpus
    from cotrain.data import Corpus

    import torch

    torch.set_num_threads(1)  # this process only evaluates, between the rows: one thread is steady on a busy machine
    setup = Setup(args, data, args.single_threads or machine_cpus())
    print(f"{len(runs)} row(s), {args.samples} sequences of 128 bytes each: single {setup.single_steps} steps of "
          f"{BATCH} with {setup.single_threads} thread(s); 3 workers x {setup.steps} steps of {setup.worker_batch} "
          f"(DiLoCo: {setup.rounds} rounds of H={setup.h}) with 1 thread each", flush=True)
    eval_cfg = run_config(data, 0)
    corpus = Corpus.from_source(data, eval_cfg.data.max_bytes, eval_cfg.data.val_fraction)
    results: dict[str, dict] = {}
    interrupted = False
    try:
        with interruptible(), work_folder("cotrain-peers-", keep=args.keep) as work:
            for name in runs:
                print(f"{name}: running", flush=True)
                try:
                    row = RUNNERS[name](setup, work / name)
                    evaluate_row(row, eval_cfg, corpus)
                except Exception as e:  # noqa: BLE001 - one failed row must not lose the others
                    print(f"  {name} failed: {e}", file=sys.stderr, flush=True)
                    row = dict(error=str(e)[-2000:])
                results[name] = row
                if "error" not in row:
                    print(f"  {name}: wall {row['wall_s']:.1f}s, val BPC {row['val_bpc']:.4f}, "
                          f"{row['bytes_per_node']:,.0f} bytes/node", flush=True)
    except Interrupted:
        print("interrupted: the rows so far", file=sys.stderr)
        interrupted = True
        if not results:
            return 130

    target = args.target_val_bpc
    if target is None:
        single = results.get("single", {})
        target = single["val_bpc"] * 1.02 if single.get("val_bpc") is not None else math.nan
    single_wall = results.get("single", {}).get("wall_s")
    out_runs = []
    for name, row in results.items():
        row["time_to_target_s"] = time_to_target(row, target) if "evals" in row else None
        row["wall_vs_single"] = (row["wall_s"] / single_wall) if single_wall and row.get("wall_s") else None
        entry = {"name": name, **{k: row.get(k) for k in KEYS}}
        entry.update({k: row[k] for k in ("wall_vs_single", "samples", "steps_per_worker", "state_bytes_per_node",
                                           "bytes_how", "evals", "error", "workers") if k in row})
        out_runs.append(entry)

    def cell(v, fmt="{:.4g}"):
        return "-" if v is None else (fmt.format(v) if isinstance(v, float) else v)

    print_table(f"peers side by side: char LSTM 2x256, byte vocabulary (BPC = bits per byte), {args.samples} "
                f"sequences of 128, target val BPC {target:.4f}",
                ["run", "workers", "steps/worker", "wall s", "vs single", "time to target s", "val BPC",
                 "bytes/node", "bytes", "state bytes/node", "compute util"],
                [[r["name"], results[r["name"]].get("workers_n", "-"), cell(r.get("steps_per_worker")),
                  cell(r["wall_s"], "{:.1f}"), cell(r.get("wall_vs_single"), "{:.2f}"),
                  cell(r["time_to_target_s"], "{:.1f}") if "error" not in r else "failed",
                  cell(r["val_bpc"], "{:.4f}"), cell(r["bytes_per_node"], "{:.4g}"), r.get("bytes_how", "-"),
                  cell(r.get("state_bytes_per_node"), "{:.4g}"), cell(r["compute_utilization"], "{:.2f}")]
                 for r in out_runs])
    write_json(args.json, {"target_val_bpc": None if math.isnan(target) else target, "runs": out_runs,
                           "setup": dict(samples=args.samples, eval_every=args.eval_every, H=setup.h,
                                         outer_lr=args.outer_lr, outer_momentum=args.outer_momentum,
                                         workers=WORKERS, batch_per_worker=setup.worker_batch,
                                         single_batch=BATCH, overlap=setup.overlap, seq_len=128,
                                         single_threads=setup.single_threads, data=data,
                                         vocabulary="bytes (256)")})
    if interrupted:
        return 130
    return 0 if all("error" not in r for r in results.values()) and len(results) == len(runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())

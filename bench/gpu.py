"""What one accelerator gives the swarm's models: training throughput and memory of every model kind at two sizes
and two precisions, what four of them learn in the same wall time, and a 2-node swarm sharing the device.

    python bench/gpu.py [--device cuda] [--data FILE] [--json FILE] [--markdown FILE]   # about 6 minutes on a GPU
    python bench/gpu.py --device cpu --quick --json /tmp/gpu-quick.json                 # the edit loop, on a CPU

1. **Throughput.** Every language model kind (lstm, gru, fast_slow, mingru, lru, hgrn2) at size "256" and "1024",
   in fp32 and in bf16 autocast (the node's own :class:`~cotrain.node.precision_step.StepPrecision`): tokens per
   second of a whole training step as a node takes it (forward under autocast, backward, gradient clip, AdamW step),
   at batch ``--batch`` x ``--seq-len`` bytes (64 x 512), the hidden state carried from step to step. Sizes: the
   LSTM and GRU have 2 layers of 256 or 3 of 1024; the linear recurrences (mingru, lru, hgrn2) one layer more, each
   with its MLP of ratio 2, since a block of theirs (mixer and MLP) holds fewer weights than an LSTM layer (as the
   measurements of issue 45 were taken); fast_slow has its two fast cells and its slow cell all of the size's
   width. Everything else is the run config's default (embedding 64, dropout 0.1, hgrn2's expand ratio 8). A row
   builds its model and optimizer, takes ``--warmup`` steps (kernels chosen, allocator settled), timing the last
   to size the timed region: as many steps as fill ``--row-seconds``, at least 3 and at most ``--steps``. The
   device is synchronized before and after the timed region only, so the figure includes whatever the step leaves
   queued. The batches are bytes of the text, put on the device beforehand and cycled: the figure is the model's,
   not the data pipeline's. Peak memory is ``torch.cuda.max_memory_allocated`` over the row (parameters, gradients,
   AdamW's moments, activations); on a CPU torch counts no peak, so it is null there. ``params``: the model's
   parameter count.
2. **Equal wall time.** lstm, hgrn2, mingru and lru at 512 wide (the LSTM 2 layers, the others 3) each train for
   ``--seconds`` on the text (fp32, the same batches as above, the run's AdamW and clip, the lr a cosine over the
   time from ``optimizer.lr`` to ``optimizer.min_lr``), then :mod:`cotrain.evaluation` gives the validation BPC on
   the first ``--eval-bytes`` of the validation split (default ``coordinator.eval_bytes``, what the coordinator
   evaluates of a checkpoint).
3. **Swarm.** A coordinator and 2 nodes on this machine (the run config's defaults, ``device`` as given), trained
   for ``--swarm-seconds`` once both nodes report samples: samples per second (both nodes' samples over that
   window, from their heartbeats' ``samples_local`` and ``wall_s``), compute utilization (the nodes' ``compute_s``
   over their wall time in the window: the rest is rounds, data and waiting), and the validation BPC of the shared
   model the nodes left with.

``--quick``: batch 8 x 128, size "256" only, 2 warmup steps and at most 5 timed, 5 s of equal-time training, a
30 s swarm, 16 KB evaluated. ``--data``: default ../shared/data/tinyshakespeare.txt when it exists, else the run
config's built-in corpus. On a CPU shared with other work, ``--threads 1``.

JSON (``--json``, rewritten after every row): ``{"gpu": str, "runs": [{"model", "size", "params", "precision",
"tokens_per_s", "peak_mem_gb"}], "equal_time": [{"model", "seconds", "val_bpc"}], "swarm": {"nodes",
"samples_per_s", "compute_utilization", "val_bpc"}, "meta": {...}}``; "gpu" names the device measured (a CUDA
device's name, or "cpu: <model name>"); "meta" has the command, commit, date, machine, torch version, the settings,
each row's details (layers, steps timed, steps trained) and any row that failed.
"""

from __future__ import annotations

import math
import platform
import sys
import time
from pathlib import Path
from typing import Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (SHARED_DATA, Swarm, bench_parser, final_checkpoint, interruptible, print_table,  # noqa: E402
                    run_meta, swarm_config, wait_for, work_folder, write_json, write_page)

from cotrain.config import RunConfig  # noqa: E402
from cotrain.data import Corpus  # noqa: E402
from cotrain.evaluation import evaluate_model, model_from_state  # noqa: E402
from cotrain.models import build_model, count_parameters  # noqa: E402
from cotrain.node.precision_step import StepPrecision  # noqa: E402
from cotrain.optim import build_optimizer  # noqa: E402
from cotrain.tasks import build_task  # noqa: E402

KINDS = ("lstm", "gru", "fast_slow", "mingru", "lru", "hgrn2")
LINEAR = ("mingru", "lru", "hgrn2")
#: size name -> (width, layers of the LSTM and GRU); the linear recurrences take one layer more
SIZES = {"256": (256, 2), "1024": (1024, 3)}
PRECISIONS = ("fp32", "bf16")
EQUAL_TIME_KINDS = ("lstm", "hgrn2", "mingru", "lru")
EQUAL_TIME_WIDTH = 512
SWARM_NODES = 2
QUICK = dict(batch=8, seq_len=128, sizes=["256"], warmup=2, steps=5, row_seconds=1.0, seconds=5.0,
             swarm_seconds=30.0, eval_bytes=16384)

RUN_KEYS = ("model", "size", "params", "precision", "tokens_per_s", "peak_mem_gb")
EQUAL_KEYS = ("model", "seconds", "val_bpc")


def model_section(kind: str, width: int, lstm_layers: int) -> dict:
    """The run config's ``[model]`` of ``kind`` at ``width``: the LSTM's and GRU's ``lstm_layers``, one more for a
    linear recurrence (with its MLP of ratio 2), fast_slow's cells all ``width`` wide."""
    if kind == "fast_slow":
        return {"kind": kind, "fast_size": width, "slow_size": width}
    if kind in LINEAR:
        return {"kind": kind, "hidden_size": width, "num_layers": lstm_layers + 1, "mlp_ratio": 2}
    return {"kind": kind, "hidden_size": width, "num_layers": lstm_layers}


def layers_of(model) -> str:
    """A run config's model (``cfg.model``) in words, for the tables: its layers and width."""
    if model.kind == "fast_slow":
        return f"{model.fast_cells} fast x {model.fast_size} + slow x {model.slow_size}"
    return f"{model.num_layers} x {model.hidden_size}"


def default_data() -> str:
    path = SHARED_DATA / "tinyshakespeare.txt"
    return str(path) if path.exists() else "builtin"


def device_name(device: torch.device) -> str:
    """What "gpu" says: the CUDA device's name, else "<type>: <processor>"."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return f"{device.type}: {cpu or platform.processor() or 'unknown processor'}"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_config(args, model: dict) -> RunConfig:
    """The run config of a throughput or equal-time row: the defaults, ``model``, the bench's data and batch."""
    return swarm_config(run={"name": "gpu-bench"}, model=model, device=args.device,
                        data={"source": args.data, "seq_len": args.seq_len, "batch_size": args.batch})


def device_batches(corpus: Corpus, batch: int, seq_len: int, count: int, device: torch.device) -> list:
    """``count`` batches of ``batch`` streams of ``seq_len`` + 1 consecutive training bytes (inputs, targets), on
    ``device``: made before any timing, so that no step waits for the host."""
    need = count * batch * (seq_len + 1)
    train = corpus.train
    text = corpus.read(train.start, min(need, train.size))
    text = (text * (need // len(text) + 1))[:need]  # a small corpus repeats: the figures do not depend on the bytes
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long().view(count, batch, seq_len + 1).to(device)
    return [(chunk[:, :-1], chunk[:, 1:]) for chunk in data]


class Trainer:
    """A node's training step on one model: the run config's model (its output bias from the text's byte counts),
    AdamW and clip, the forward pass and backward through ``precision``'s StepPrecision as the node runs them, the
    hidden state carried from step to step and detached."""

    def __init__(self, cfg: RunConfig, corpus: Corpus, byte_counts, device: torch.device, precision: str):
        self.cfg, self.device = cfg, device
        self.task = build_task(cfg)
        self.model = build_model(cfg, byte_counts).to(device)
        self.optimizer = build_optimizer(self.model, cfg.optimizer)
        self.precision = StepPrecision(precision, device)  # type: ignore[arg-type]
        self.state = None

    def _local_step(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optimizer.grad_clip)
        self.optimizer.step()

    def step(self, batch, lr: Optional[float] = None) -> None:
        if lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        with self.precision.autocast():
            loss, state, _ = self.task.step(self.model, batch, self.state, self.device)
        self.optimizer.zero_grad(set_to_none=True)
        self.precision.backward_and_step(loss, self.optimizer, self._local_step)
        self.state = self.model.detach_state(state)


def throughput_row(args, corpus: Corpus, byte_counts, kind: str, size: str, precision: str) -> dict:
    device = torch.device(args.device)
    width, lstm_layers = SIZES[size]
    section = model_section(kind, width, lstm_layers)
    if device.type == "cuda":  # the row's peak alone: the previous row's cached blocks and peak left out
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    trainer = Trainer(bench_config(args, section), corpus, byte_counts, device, precision)
    batches = device_batches(corpus, args.batch, args.seq_len, 4, device)
    step_s = math.inf
    for i in range(args.warmup):
        started = time.perf_counter()
        trainer.step(batches[i % len(batches)])
        synchronize(device)  # outside the timed region: the last warmup step's time sizes it
        step_s = time.perf_counter() - started
    steps = max(3, min(args.steps, int(args.row_seconds / step_s) if step_s > 0 else args.steps))
    synchronize(device)
    started = time.perf_counter()
    for i in range(steps):
        trainer.step(batches[i % len(batches)])
    synchronize(device)
    elapsed = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None
    row = dict(model=kind, size=size, params=count_parameters(trainer.model), precision=precision,
               tokens_per_s=steps * args.batch * args.seq_len / elapsed, peak_mem_gb=peak,
               layers=layers_of(trainer.cfg.model), steps=steps, step_ms=elapsed / steps * 1e3)
    del trainer, batches
    return row


def equal_time_row(args, corpus: Corpus, byte_counts, kind: str) -> dict:
    """``kind`` at 512 wide trained for ``args.seconds`` in fp32, then its validation BPC."""
    device = torch.device(args.device)
    section = model_section(kind, EQUAL_TIME_WIDTH, SIZES["256"][1])
    cfg = bench_config(args, section)
    trainer = Trainer(cfg, corpus, byte_counts, device, "fp32")
    # more batches than the throughput rows cycle: a model trained on 4 batches would learn them, not the text
    count = max(1, min(256, corpus.train.size // (args.batch * (args.seq_len + 1))))
    batches = device_batches(corpus, args.batch, args.seq_len, count, device)
    peak, floor = cfg.optimizer.lr, cfg.optimizer.min_lr
    steps = 0
    synchronize(device)
    started = time.perf_counter()
    # the clock is read without synchronizing, so the host may run a few steps ahead of the device; the seconds
    # reported are those measured after the last step finished on the device
    while (elapsed := time.perf_counter() - started) < args.seconds:
        # a cosine over the time, not the samples: every model gets the same schedule of its wall time
        lr = floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * elapsed / args.seconds))
        trainer.step(batches[steps % len(batches)], lr)
        steps += 1
    synchronize(device)
    seconds = time.perf_counter() - started
    bpc = evaluate_model(cfg, trainer.model, corpus=corpus, max_bytes=args.eval_bytes)["val_bpc"]
    return dict(model=kind, seconds=round(seconds, 2), val_bpc=bpc, layers=layers_of(cfg.model),
                params=count_parameters(trainer.model), steps=steps, tokens=steps * args.batch * args.seq_len)


def swarm_rates(first: list[dict], last: list[dict]) -> tuple[float, float, float]:
    """From two snapshots of the nodes' heartbeat rows (``name``, ``samples_local``, ``compute_s``, ``wall_s``,
    running totals): (samples per second of the nodes together, their compute seconds over their wall seconds,
    the mean window in seconds). Each node's rate is over its own window; nodes missing from either snapshot, or
    whose figures did not move, are left out."""
    before = {r["name"]: r for r in first}
    rate = compute = wall = 0.0
    windows = []
    for r in last:
        b = before.get(r["name"])
        if b is None:
            continue
        dt = float(r.get("wall_s", 0)) - float(b.get("wall_s", 0))
        if dt <= 0:
            continue
        rate += (int(r.get("samples_local", 0)) - int(b.get("samples_local", 0))) / dt
        compute += float(r.get("compute_s", 0)) - float(b.get("compute_s", 0))
        wall += dt
        windows.append(dt)
    if not windows:
        raise ValueError("no node's heartbeat figures moved between the two snapshots")
    return rate, compute / wall, sum(windows) / len(windows)


def swarm_row(args) -> tuple[dict, dict]:
    """A 2-node swarm's figures, and the details for meta."""
    cfg = swarm_config(run={"name": "gpu-bench-swarm"}, data={"source": args.data}, device=args.device)
    names = [f"node-{i}" for i in range(SWARM_NODES)]
    with work_folder("cotrain-gpu-", keep=args.keep) as work, Swarm(cfg, work, nodes=SWARM_NODES) as swarm:
        started = time.monotonic()
        for name in names:
            swarm.start_node(name, ["--wait-peers", str(SWARM_NODES)])

        def alive() -> None:
            for proc in swarm.nodes:
                if not proc.alive():
                    raise RuntimeError(f"{proc.name} exited early; logs in {work} (run with --keep to keep them)")

        def training() -> list[dict]:
            rows = swarm.node_rows()
            return rows if len(rows) == SWARM_NODES and all(int(r.get("samples_local", 0)) > 0 for r in rows) \
                else []

        first = wait_for(training, args.swarm_timeout, interval=1.0, what="both nodes to train", procs=swarm.nodes)
        startup = time.monotonic() - started
        print(f"swarm: both nodes training after {startup:.0f}s; measuring {args.swarm_seconds:.0f}s", flush=True)
        deadline = time.monotonic() + args.swarm_seconds
        while time.monotonic() < deadline:
            alive()
            time.sleep(1.0)
        last = swarm.node_rows()
        codes = swarm.stop_nodes()
        if any(codes):
            raise RuntimeError(f"node exit codes {codes}; logs in {work} (run with --keep to keep them)")
        final = final_checkpoint(work, names)
    rate, utilization, window = swarm_rates(first, last)
    device = torch.device(args.device)
    corpus = Corpus.from_source(cfg.data.source, cfg.data.max_bytes, cfg.data.val_fraction)
    model = model_from_state(cfg, final.model_state(), corpus=corpus).to(device)
    bpc = evaluate_model(cfg, model, corpus=corpus, max_bytes=args.eval_bytes)["val_bpc"]
    figures = dict(nodes=SWARM_NODES, samples_per_s=rate, compute_utilization=utilization, val_bpc=bpc)
    details = dict(startup_s=round(startup, 1), window_s=round(window, 1), round=final.round,
                   samples_total=int(final.metadata.get("samples_total", 0)),
                   model=f"{cfg.model.kind} {layers_of(cfg.model)}",
                   batch=f"{cfg.data.batch_size} x {cfg.data.seq_len}",
                   nodes=[{k: r.get(k) for k in ("name", "samples_local", "compute_s", "wall_s", "round")}
                          for r in last])
    return figures, details


# ---- tables ---------------------------------------------------------------------------------------------------------
RUN_COLUMNS = ["model", "size", "layers", "params", "precision", "tokens/s", "step ms", "steps timed", "peak GB"]
EQUAL_COLUMNS = ["model", "layers", "params", "seconds", "steps", "tokens", "val BPC"]
SWARM_COLUMNS = ["nodes", "window s", "samples/s", "compute utilization", "val BPC"]


def run_cells(r: dict) -> list:
    return [r["model"], r["size"], r["layers"], r["params"], r["precision"], r["tokens_per_s"], r["step_ms"],
            r["steps"], "null" if r["peak_mem_gb"] is None else r["peak_mem_gb"]]


def equal_cells(r: dict) -> list:
    return [r["model"], r["layers"], r["params"], r["seconds"], r["steps"], r["tokens"], r["val_bpc"]]


def swarm_cells(s: dict, details: dict) -> list:
    return [s["nodes"], details["window_s"], s["samples_per_s"], s["compute_utilization"], s["val_bpc"]]


def titles(args, gpu: str) -> dict:
    return dict(runs=f"Training step throughput on {gpu}: batch {args.batch} x {args.seq_len} bytes (peak GB: null "
                     "on a CPU, where torch counts no peak)",
                equal=f"Equal wall time on {gpu}: {EQUAL_TIME_WIDTH} wide, fp32, {args.seconds:g}s each, then the "
                      "validation BPC",
                swarm=f"A {SWARM_NODES}-node swarm on {gpu}: the run config's defaults, {args.swarm_seconds:g}s "
                      "measured")


def markdown_table(columns: list, rows: list) -> list[str]:
    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)

    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(fmt(v) for v in row) + " |" for row in rows)]


def write_markdown(path: Optional[str], args, results: dict, runs: list, equal: list,
                   swarm_details: Optional[dict]) -> None:
    if not path:
        return
    meta, head = results["meta"], titles(args, results["gpu"])
    lines = ["# GPU bench: `bench/gpu.py`", "",
             (f"- `{meta['command']}` at commit {meta.get('commit') or '?'}, {meta['date']}, {meta['machine']}, "
              f"torch {meta['torch']}"), f"- device measured: {results['gpu']}", "",
             f"## {head['runs']}", "", *markdown_table(RUN_COLUMNS, [run_cells(r) for r in runs]), "",
             f"## {head['equal']}", "", *markdown_table(EQUAL_COLUMNS, [equal_cells(r) for r in equal]), "",
             f"## {head['swarm']}", ""]
    if results["swarm"] is not None and swarm_details is not None:
        lines += markdown_table(SWARM_COLUMNS, [swarm_cells(results["swarm"], swarm_details)])
    else:
        lines.append(f"not measured: {meta.get('swarm_error', 'skipped')}")
    if meta["errors"]:
        lines += ["", "## Rows that failed", "", *(f"- {e}" for e in meta["errors"])]
    write_page(path, lines)


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda (default where there is one), cuda:N or cpu")
    parser.add_argument("--quick", action="store_true",
                        help="the edit loop: batch 8 x 128, size 256 only, a few steps, 5 s equal-time rows, a 30 s "
                             "swarm")
    parser.add_argument("--batch", type=int, default=64, help="streams a step")
    parser.add_argument("--seq-len", type=int, default=512, help="bytes a stream a step")
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="throughput rows' models")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before a throughput row's timing")
    parser.add_argument("--steps", type=int, default=50, help="most timed steps a throughput row takes")
    parser.add_argument("--row-seconds", type=float, default=2.0,
                        help="about how long a throughput row's timed region lasts (at least 3 steps)")
    parser.add_argument("--seconds", type=float, default=45.0, help="training time of each equal-time row")
    parser.add_argument("--swarm-seconds", type=float, default=60.0,
                        help="seconds the swarm is measured, once both nodes train")
    parser.add_argument("--swarm-timeout", type=float, default=300.0, help="seconds the swarm may take to start")
    parser.add_argument("--parts", nargs="+", choices=["throughput", "equal_time", "swarm"],
                        default=["throughput", "equal_time", "swarm"])
    parser.add_argument("--eval-bytes", type=int, default=RunConfig().coordinator.eval_bytes,
                        help="validation bytes evaluated (default: what the coordinator evaluates, "
                             "coordinator.eval_bytes; 0: the whole split; --quick: 16384)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads of this process (0: torch's default). On a CPU shared with other work, "
                             "1 avoids threads that wait for each other: 2 threads on 2 busy cores took 15x the "
                             "time of 1 for a GRU step")
    parser.add_argument("--keep", action="store_true", help="keep the swarm's work folder (logs, state)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None, metavar="FILE", help="also write the tables as a Markdown page")
    args = parser.parse_args()
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    args.data = args.data or default_data()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: torch sees no CUDA device here (pass --device cpu)")
    gpu = device_name(device)
    head = titles(args, gpu)
    print(f"measuring on {gpu} (--device {args.device}), data {args.data}", flush=True)
    meta = dict(run_meta(args.device), device=args.device, errors=[],
                settings=dict(batch=args.batch, seq_len=args.seq_len, warmup=args.warmup, max_steps=args.steps,
                              row_seconds=args.row_seconds, data=args.data, quick=args.quick,
                              eval_bytes=args.eval_bytes, threads=torch.get_num_threads()),
                peak_mem_note=None if device.type == "cuda" else "null: torch counts no peak memory on a CPU")
    runs: list[dict] = []
    equal: list[dict] = []
    swarm_details: Optional[dict] = None
    results: dict = dict(gpu=gpu, runs=[], equal_time=[], swarm=None, meta=meta)

    def save() -> None:
        results["runs"] = [{k: r[k] for k in RUN_KEYS} for r in runs]
        results["equal_time"] = [{k: r[k] for k in EQUAL_KEYS} for r in equal]
        meta["runs"] = [{k: r[k] for k in ("model", "size", "precision", "layers", "steps", "step_ms")} for r in runs]
        meta["equal_time"] = [{k: r[k] for k in ("model", "layers", "params", "steps", "tokens")} for r in equal]
        meta["swarm"] = swarm_details
        write_json(args.json, results)

    corpus = Corpus.from_source(args.data, 0, RunConfig().data.val_fraction)
    byte_counts = corpus.byte_counts()
    torch.set_flush_denormal(True)
    with interruptible():
        if "throughput" in args.parts:
            for size in args.sizes:
                for kind in args.kinds:
                    for precision in PRECISIONS:
                        try:
                            row = throughput_row(args, corpus, byte_counts, kind, size, precision)
                        except (RuntimeError, torch.OutOfMemoryError) as e:  # one model's failure spares the rest
                            meta["errors"].append(f"{kind} {size} {precision}: {type(e).__name__}: {e}"[:500])
                            print(f"  {kind:9s} {size:>4s} {precision}: FAILED {e}"[:300], flush=True)
                            continue
                        runs.append(row)
                        peak = "" if row["peak_mem_gb"] is None else f", peak {row['peak_mem_gb']:.2f} GB"
                        print(f"  {kind:9s} {size:>4s} {precision}: {row['tokens_per_s']:,.0f} tokens/s "
                              f"({row['steps']} steps){peak}", flush=True)
                        save()
            print_table(head["runs"], RUN_COLUMNS, [run_cells(r) for r in runs])
        if "equal_time" in args.parts:
            for kind in EQUAL_TIME_KINDS:
                row = equal_time_row(args, corpus, byte_counts, kind)
                equal.append(row)
                print(f"  {kind:9s} {row['steps']} steps in {row['seconds']:.1f}s: val {row['val_bpc']:.4f} BPC",
                      flush=True)
                save()
            print_table(head["equal"], EQUAL_COLUMNS, [equal_cells(r) for r in equal])
        if "swarm" in args.parts:
            try:
                results["swarm"], swarm_details = swarm_row(args)
            except (RuntimeError, TimeoutError, ValueError, OSError) as e:
                meta["swarm_error"] = f"{type(e).__name__}: {e}"[:1000]
                print(f"swarm: FAILED {meta['swarm_error']}", file=sys.stderr, flush=True)
            save()
            if results["swarm"] is not None:
                print_table(head["swarm"], SWARM_COLUMNS, [swarm_cells(results["swarm"], swarm_details)])
    save()
    write_markdown(args.markdown, args, results, runs, equal, swarm_details)
    return 1 if meta["errors"] or meta.get("swarm_error") else 0


if __name__ == "__main__":
    raise SystemExit(main())

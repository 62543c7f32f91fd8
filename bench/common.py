"""What the benches share: running a real swarm (coordinator and node processes on 127.0.0.1: the tests' and the
benches' :class:`~cotrain.cli.local_swarm.Swarm`), their run configs (built by
:func:`~cotrain.cli.local_swarm.swarm_config`), evaluating what a swarm made, printing a table, writing ``--json``.

    cfg = lstm_config("mybench", data, hidden=128, averaging={"inner_steps": 20})
    with work_folder("cotrain-mybench-", keep=args.keep) as work, Swarm(cfg, work, nodes=3) as swarm:
        nodes = [swarm.start_node(f"node-{i}") for i in range(3)]  # each its share of this machine's CPUs
        ...                                  # swarm.health(), swarm.node_rows(), swarm.stop_nodes()
    # here every process the swarm started has been stopped, however the block ended (Ctrl-C and SIGTERM too)

``run_swarm`` runs a whole swarm to its end and evaluates the shared model; ``interruptible`` turns Ctrl-C, SIGTERM
and SIGHUP into :class:`Interrupted` for benches that answer them with a message and exit code 130.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence


from cotrain.checkpoint import load_checkpoint
from cotrain.config import RunConfig
from cotrain.evaluation import evaluate_state  # noqa: F401 - the benches' evaluation, re-exported
from cotrain.cli.launch import (Proc, cpu_shares, start_coordinator, start_node, stop_all,  # noqa: F401 - re-exported
                                uninterrupted, wait_for)
from cotrain.cli.local_swarm import Swarm, swarm_config  # noqa: F401 - re-exported

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)


# a bench stopped with SIGTERM (timeout, kill) or SIGHUP (its terminal closed) unwinds like Ctrl-C, so the clean-up
# below stops the coordinator and node processes it started instead of leaving them behind
for _sig in (signal.SIGTERM, signal.SIGHUP):
    if signal.getsignal(_sig) is signal.SIG_DFL:
        signal.signal(_sig, _exit_on_signal)


# ---- signals and clean-up ------------------------------------------------------------------------------------------
class Interrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP inside :func:`interruptible`; its text is the signal's name. A KeyboardInterrupt, so
    that no ``except Exception`` on the way swallows it."""


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def _stop_signals_to(handler) -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP go to ``handler`` inside the block; the previous handlers come back after it. In the
    main thread only, where Python runs signal handlers (elsewhere the block runs as it is)."""
    if not _main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


@contextmanager
def interruptible() -> Iterator[None]:
    """Inside the block, Ctrl-C, SIGTERM and SIGHUP print ``interrupted (SIGNAME); cleaning up`` and raise
    :class:`Interrupted`, once: further ones are ignored while the block unwinds and cleans up."""
    def on_signal(signum, frame):
        for s in STOP_SIGNALS:  # a second Ctrl-C must not cut the clean-up short
            signal.signal(s, signal.SIG_IGN)
        name = signal.Signals(signum).name
        print(f"\ninterrupted ({name}); cleaning up", file=sys.stderr, flush=True)
        raise Interrupted(name)

    with _stop_signals_to(on_signal):
        yield


@contextmanager
def work_folder(prefix: str = "cotrain-bench-", keep: bool = False, path: Optional[Path] = None) -> Iterator[Path]:
    """A work folder (``path``, or a new one in the temporary directory) that is removed when the block ends, unless
    ``keep`` or the block failed with an error: then its logs are kept, and where they are is printed."""
    folder = Path(path or tempfile.mkdtemp(prefix=prefix))
    folder.mkdir(parents=True, exist_ok=True)
    failed = False
    try:
        yield folder
    except Exception:
        failed = True
        raise
    finally:
        if keep or failed:
            print(f"work folder kept: {folder}", file=sys.stderr if failed else sys.stdout, flush=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def stopped_on_exit(timeout: float = 30.0) -> Iterator[list]:
    """A list to put started processes in; when the block ends, however it ends, every one is stopped
    (:func:`stop_all`), uninterrupted."""
    procs: list = []
    try:
        yield procs
    finally:
        with uninterrupted():
            stop_all(procs, timeout)


def lstm_config(name: str, data: str, hidden: int, *, embed_dim: int = 32, layers: int = 1, seq_len: int = 64,
                batch_size: int = 16, **sections: dict) -> RunConfig:
    """The benches' run: a byte-level LSTM (``layers`` x ``hidden``, no dropout) on the text ``data``, seed 0, on the
    CPU, checkpoints only at the end (``checkpoint_interval_s`` 3600); ``sections`` are the other sections of the
    run config as dicts (``optimizer=``, ``averaging=``, ``compression=``, ``coordinator=`` adding to the default
    above), merged as :func:`~cotrain.cli.local_swarm.swarm_config` merges them."""
    return swarm_config(dict(
        run={"name": name, "seed": 0},
        model={"kind": "lstm", "embed_dim": embed_dim, "hidden_size": hidden, "num_layers": layers, "dropout": 0.0},
        data={"source": data, "seq_len": seq_len, "batch_size": batch_size},
        coordinator={"checkpoint_interval_s": 3600.0},
        device="cpu",
    ), sections)


#: the benches' optimizer: lr 3e-3, down to 3e-4 where the schedule decays it (:func:`cosine_schedule`), gradients
#: clipped to norm 1
BENCH_OPTIMIZER = {"lr": 3e-3, "min_lr": 3e-4, "grad_clip": 1.0}

#: the averaging timings of a small swarm on this machine: matchmaking 2 s, requests 1.5 s, progress every 0.5 s
LOCAL_TIMINGS = {"matchmaking_time": 2.0, "request_timeout": 1.5, "progress_interval": 0.5}


def diloco_config(name: str, args, **sections: dict) -> RunConfig:
    """The run of the benches of an ``args.nodes``-node DiLoCo swarm (admission.py, byzantine.py): the LSTM of
    ``args.hidden`` on ``args.data``, batch 16, ``args.H`` inner steps, groups of every node, the lr decaying over
    ``args.rounds`` rounds of every node; ``sections`` add to it as in :func:`lstm_config`."""
    steps, batch = args.rounds * args.H, 16
    averaging = {"strategy": "diloco", "inner_steps": args.H, **LOCAL_TIMINGS, "target_group_size": args.nodes,
                 "round_wait": 30.0, **sections.pop("averaging", {})}
    return lstm_config(name, args.data, args.hidden, batch_size=batch, optimizer=BENCH_OPTIMIZER,
                       schedule=cosine_schedule(steps * batch * args.nodes),  # over the swarm's samples
                       averaging=averaging, **sections)


def cosine_schedule(total_samples: int) -> dict:
    """The run config's ``[schedule]`` of a bench that decays the lr over a run of known length: a cosine from
    ``optimizer.lr`` to ``optimizer.min_lr`` over ``total_samples`` samples of the whole swarm (all nodes together:
    steps a node x its batch x nodes), no warmup, as the benches' cosine over the local steps was."""
    return {"kind": "cosine", "horizon_samples": total_samples, "warmup_samples": 0}


#: how a UnitLoop reads the training split: "split", a user's plain loop (its streams over the whole split, the
#: hidden state carried through); "spread", the coordinator's work units as a node reads them (each unit's streams
#: spread over the split, cotrain.data.streams.stream_ranges); "contiguous", each unit's streams inside the unit
#: (how nodes read before the units were spread)
LAYOUTS = ("split", "spread", "contiguous")


class UnitLoop:
    """A plain training loop through the coordinator's work units as a node takes them: unit ``first``, then every
    ``stride``-th (the replicas of an in-process swarm), the hidden state carried within a unit, each unit read as
    ``layout`` says; the run config's model (its output bias from ``byte_counts``), optimizer and clip. The caller
    gives each step its lr."""

    def __init__(self, cfg: RunConfig, corpus, byte_counts, device="cpu", first: int = 0, stride: int = 1,
                 layout: str = "spread"):
        if layout not in LAYOUTS:
            raise ValueError(f"layout: one of {', '.join(LAYOUTS)}, got {layout!r}")
        self.layout = layout
        import torch

        from cotrain.models import build_model
        from cotrain.optim import build_optimizer
        from cotrain.tasks import build_task

        self.cfg, self.corpus, self.device, self.stride = cfg, corpus, torch.device(device), stride
        self.task = build_task(cfg)
        self.model = build_model(cfg, byte_counts).to(self.device)
        self.optimizer = build_optimizer(self.model, cfg.optimizer)
        self.units = 1 if layout == "split" else max(1, corpus.train.size // cfg.coordinator.unit_bytes)
        self.unit, self.samples = first, 0
        self._start_unit()

    def _start_unit(self) -> None:
        train = self.corpus.train
        if self.layout == "split":
            start, end = train.start, train.end
        else:
            start = train.start + (self.unit % self.units) * self.cfg.coordinator.unit_bytes
            end = min(train.end, start + self.cfg.coordinator.unit_bytes)
        split = (train.start, train.end) if self.layout == "spread" else None
        self.batches, self.state = self.task.train_data(self.corpus.read, start, end, 0, split=split), None

    def step(self, lr: float) -> int:
        """One local step at ``lr``; -> its samples."""
        import torch

        if self.batches.done:
            self.unit += self.stride
            self._start_unit()
        batch, reset = self.batches.next()
        if reset:
            self.state = None
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss, state, samples = self.task.step(self.model, batch, self.state, self.device)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optimizer.grad_clip)
        self.optimizer.step()
        self.state = self.model.detach_state(state)
        self.samples += samples
        return samples


@dataclass
class PlainRun:
    """A plain loop's run (:func:`train_plain`): its validation curve ([samples, BPC], ...) and what it took."""
    curve: list
    samples: int
    steps: int
    step_s: float  # seconds in the training steps, evaluations left out
    wall_s: float
    params: int


def train_plain(name: str, cfg: RunConfig, samples: int, eval_every: int, device: str = "cpu",
                layout: str = "split") -> PlainRun:
    """The user's plain loop (:class:`UnitLoop`, the run config's schedule) to ``samples``, evaluated every
    ``eval_every`` samples and at the end (the coordinator's evaluation); each evaluation is printed with ``name``."""
    import torch

    from cotrain.data import Corpus
    from cotrain.evaluation import evaluate_model
    from cotrain.models import count_parameters
    from cotrain.optim.schedule import Schedule, lr_factor

    corpus = Corpus.from_source(cfg.data.source, cfg.data.max_bytes, cfg.data.val_fraction)
    loop = UnitLoop(cfg, corpus, corpus.byte_counts(), device, layout=layout)
    schedule = Schedule.from_config(cfg)
    curve, steps, stepping, next_eval, started = [], 0, 0.0, 0, time.monotonic()

    def evaluate() -> None:
        bpc = evaluate_model(cfg, loop.model, corpus=corpus, max_bytes=cfg.coordinator.eval_bytes)["val_bpc"]
        curve.append([loop.samples, round(bpc, 4)])
        print(f"{name}: {loop.samples} samples  val {bpc:.4f} BPC  {time.monotonic() - started:.0f}s", flush=True)

    while loop.samples < samples:
        if loop.samples >= next_eval:
            evaluate()
            next_eval += eval_every
        began = time.monotonic()
        loop.step(cfg.optimizer.lr * lr_factor(schedule, loop.samples))
        stepping += time.monotonic() - began
        steps += 1
    evaluate()
    if loop.device.type == "cuda":
        torch.cuda.synchronize(loop.device)
    return PlainRun(curve, loop.samples, steps, stepping, time.monotonic() - started, count_parameters(loop.model))


def bench_parser(doc: str) -> argparse.ArgumentParser:
    """A bench's argument parser: its docstring as the description, and ``--data`` (None: :func:`default_text`)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="text file (default ../shared/data/tinyshakespeare.txt)")
    return parser


def default_text() -> str:
    path = SHARED_DATA / "tinyshakespeare.txt"
    if not path.exists():
        raise SystemExit(f"bench data {path} is missing: pass --data PATH (a text file)")
    return str(path)


@dataclass
class SwarmRun:
    wall_s: float
    nodes: list[dict]  # final metrics each node reported when it left
    final: Optional[dict]  # the node's copy of the shared model with the most rounds: tensors, metadata
    metrics: dict = field(default_factory=dict)  # evaluation of ``final``

    @property
    def samples(self) -> int:
        return sum(int(n.get("samples_local", 0)) for n in self.nodes)

    @property
    def bytes_sent_per_node(self) -> float:
        """What the nodes sent averaging (all-reduce pieces), mean over the nodes."""
        return sum(float(n.get("bytes_sent", 0)) for n in self.nodes) / max(1, len(self.nodes))


def samples_trained(swarm, work: Path, names: Optional[Sequence[str]] = None) -> int:
    """The samples a running swarm's nodes (those ``names``, or all) trained, as they last reported; a RuntimeError
    naming the first node that exited early (its log is in ``work``)."""
    for proc in swarm.nodes:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited early; logs in {work}")
    return sum(int(r.get("samples_local", 0)) for r in swarm.node_rows() if names is None or r["name"] in names)


def final_checkpoint(workdir: Path, names: Sequence[str]):
    """The last state the named nodes saved (``last.safetensors`` in their state dirs) with the most rounds."""
    return max((load_checkpoint(Path(workdir) / name / "last.safetensors") for name in names), key=lambda c: c.round)


def run_swarm(cfg: RunConfig, nodes: int, node_args: Sequence[str], workdir: Optional[Path] = None,
              timeout: float = 3600.0, keep: bool = False, evaluate: bool = True,
              per_node_args: Optional[dict[int, Sequence[str]]] = None) -> SwarmRun:
    """Start a coordinator and ``nodes`` nodes, dividing this machine's CPUs between them (:class:`Swarm`'s
    ``nodes``), with ``node_args`` (e.g. --max-rounds) and ``per_node_args[i]`` for node i, wait until all have left,
    and evaluate the shared model the nodes ended with on the whole validation split."""
    names = [f"node-{i}" for i in range(nodes)]
    with work_folder("cotrain-bench-", keep=keep, path=workdir) as tmp:
        with Swarm(cfg, tmp, nodes=nodes) as swarm:
            started = time.monotonic()
            procs = [swarm.start_node(name, ["--wait-peers", str(nodes), *node_args,
                                             *(per_node_args or {}).get(i, ())]) for i, name in enumerate(names)]
            for proc in procs:
                wait_for(lambda: not proc.alive(), timeout, interval=1.0, what=f"{proc.name} to finish")
            wall = time.monotonic() - started
            codes = swarm.stop_nodes()
            if any(codes):
                raise RuntimeError(f"node exit codes {codes}; logs in {tmp}")
            rows = swarm.node_rows()
        final = final_checkpoint(tmp, names)
        result = SwarmRun(wall, rows, {"tensors": final.tensors, "metadata": final.metadata})
        if evaluate:
            result.metrics = evaluate_state(cfg, final.model_state())
    return result


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    def fmt(v):
        if isinstance(v, float):
            return "nan" if math.isnan(v) else (f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}")
        return str(v)

    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def write_json(path: Optional[str], data: dict) -> None:
    if path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")  # whole or not at all: a reader never sees half a file
        part.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(part, target)
        print(f"\nfigures written to {path}")


def write_page(path: Optional[str], lines: Sequence[str]) -> None:
    """A results page (Markdown lines), written whole or not at all."""
    if path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        part.write_text("\n".join(lines) + "\n")
        os.replace(part, target)
        print(f"page written to {path}")


def run_meta(device: str = "cpu") -> dict:
    """Where and when the figures come from: the command, the commit, the date and the machine."""
    import platform

    import torch

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() else None
    return {"command": f"python bench/{Path(sys.argv[0]).name} " + " ".join(sys.argv[1:]), "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{os.cpu_count()} CPUs ({cpu})" + (f", {gpu}" if gpu else ""), "torch": torch.__version__}

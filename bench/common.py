"""What the benches share: running a real swarm (coordinator and node processes on 127.0.0.1), evaluating what it
made, printing a table, writing ``--json``."""

from __future__ import annotations

import json
import math
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import torch

from cotrain.checkpoint import load_checkpoint
from cotrain.config import RunConfig
from cotrain.coordinator.store import Store
from cotrain.cli.launch import start_coordinator, start_node, wait_for
from cotrain.models import build_model
from cotrain.client import CoordinatorClient
from cotrain.tasks import build_task

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


# a bench stopped with SIGTERM (timeout, kill) unwinds like Ctrl-C, so run_swarm's cleanup stops the coordinator and
# node processes it started instead of leaving them behind
if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)


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


def run_swarm(cfg: RunConfig, nodes: int, node_args: Sequence[str], workdir: Optional[Path] = None,
              timeout: float = 3600.0, keep: bool = False, evaluate: bool = True,
              per_node_args: Optional[dict[int, Sequence[str]]] = None) -> SwarmRun:
    """Start a coordinator and ``nodes`` nodes with ``node_args`` (e.g. --max-rounds) and ``per_node_args[i]`` for
    node i, wait until all have left, and evaluate the shared model the nodes ended with on the whole validation
    split."""
    tmp = Path(workdir or tempfile.mkdtemp(prefix="cotrain-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "run.toml").write_text(cfg.to_toml())
    state = tmp / "coordinator"
    token = Store(state).create_token("bench")
    coordinator, address = start_coordinator(state, tmp / "run.toml")
    procs = []
    started = time.monotonic()
    try:
        procs = [start_node(address, token, f"node-{i}", tmp / f"node-{i}",
                            extra=["--threads", "1", "--wait-peers", str(nodes), *node_args,
                                   *(per_node_args or {}).get(i, ())]) for i in range(nodes)]
        for proc in procs:
            wait_for(lambda: not proc.alive(), timeout, interval=1.0, what=f"{proc.name} to finish")
        wall = time.monotonic() - started
        codes = [p.stop(30) for p in procs]
        if any(codes):
            raise RuntimeError(f"node exit codes {codes}; logs in {tmp}")
        client = CoordinatorClient(address, insecure=True)
        health = client.health()
        client.close()
    finally:
        for p in procs:
            p.stop(10)
        coordinator.stop(30)
    from cotrain.status import message_to_dict

    rows = [dict(message_to_dict(n.metrics), name=n.node_name) for n in health.nodes]
    finals = [load_checkpoint(tmp / f"node-{i}" / "last.safetensors") for i in range(nodes)]
    final = max(finals, key=lambda c: c.round)
    result = SwarmRun(wall, rows, {"tensors": final.tensors, "metadata": final.metadata})
    if evaluate:
        result.metrics = evaluate_state(cfg, final.model_state())
    if not keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def evaluate_state(cfg: RunConfig, state: Optional[dict], max_bytes: int = 0) -> dict:
    from cotrain.data import Corpus

    torch.manual_seed(cfg.run.seed)
    task = build_task(cfg)
    model = build_model(cfg)
    if state is not None:
        model.load_state_dict(state)
    corpus = None
    if task.needs_corpus:
        corpus = Corpus.from_source(cfg.data.source, cfg.data.max_bytes, cfg.data.val_fraction)
    return task.evaluate(model, corpus, max_bytes=max_bytes)


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
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=1, sort_keys=True))
        print(f"\nfigures written to {path}")

"""Keeps checkpoints of the shared model and evaluates them, without stopping any node.

Every ``checkpoint_interval_s`` it reads the swarm's progress from the DHT; when the swarm has finished a round
that is not checkpointed yet, it downloads the global state from the peer with the most progress (hivemind's state
download, the same path a joining node takes), writes it atomically to ``state_dir/checkpoints``, records it in
the store, and hands it to the :class:`Evaluator` (every ``eval_every_rounds`` rounds; on a Ray fleet as a task), whose
results go into the run's metrics, with the swarm's samples at that checkpoint (``samples_total``) and the schedule's
inner lr there (``lr``): the dashboard's learning curve.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Optional

import torch

from cotrain.averaging import Exchange, ProgressBoard, download_state, pick_donors
from cotrain.checkpoint import save_checkpoint
from cotrain.config import RunConfig
from cotrain.memory import release_freed_memory
from cotrain.optim.schedule import Schedule, lr_factor
from cotrain.outage import Outage
from cotrain.coordinator.evaluator import Evaluator
from cotrain.coordinator.store import Store
from cotrain.coordinator.swarm_health import SwarmSummary

logger = logging.getLogger(__name__)

#: at most this many checkpoints' samples kept for evaluations still to come (a Ray task that failed never comes)
SAMPLES_KEPT = 64


class Checkpointer(threading.Thread):
    def __init__(self, cfg: RunConfig, run_id: str, model: torch.nn.Module, exchange: Exchange,
                 board: ProgressBoard, store: Store, summary: SwarmSummary, evaluator: Evaluator):
        super().__init__(name="checkpointer", daemon=True)
        self.cfg, self.run_id, self.model, self.exchange = cfg, run_id, model, exchange
        self.board, self.store, self.summary, self.evaluator = board, store, summary, evaluator
        self.folder = store.state_dir / "checkpoints"
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self.failures = Outage("checkpoint", logger)
        self.schedule = Schedule.from_config(cfg)
        #: round -> the swarm's samples at its checkpoint, for the evaluations not recorded yet (a Ray task's comes
        #: back ticks later, and not necessarily in round order)
        self.samples_at: dict[int, int] = {}
        checkpoints = store.checkpoints()
        self.last_round = checkpoints[0].round if checkpoints else -1
        if checkpoints:
            summary.latest_checkpoint, summary.latest_checkpoint_round = checkpoints[0].path, checkpoints[0].round
        evals = store.evals()
        if evals:
            last = evals[-1]
            summary.val_round, summary.val_loss, summary.val_bpc = last.round, last.val_loss, last.val_bpc
            summary.val_metrics = last.metrics

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.tick()
                self.failures.succeeded()
            except (OSError, sqlite3.Error) as e:  # a full disk, a busy store, a peer that went away mid-download
                self.failures.failed(e, action="retrying next interval")
            except Exception as e:  # noqa: BLE001 - a bug: logged with its traceback, and the next interval tries again
                self.failures.failed(e, expected=False, action="retrying next interval")
            # a checkpoint's download, file and evaluation are tens of MB of short-lived buffers in the middle of
            # the heap, which glibc keeps by itself: the coordinator's memory grew 13% an hour in a soak
            release_freed_memory()
            self.wake.wait(self.cfg.coordinator.checkpoint_interval_s)
            self.wake.clear()

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()

    def tick(self) -> Optional[Path]:
        for round_number, metrics in self.evaluator.collect():
            self._record_eval(round_number, metrics)
        stale_after = 3 * self.cfg.averaging.progress_interval + 1.0
        donors = pick_donors(time.time(), "", self.board.read_all() or [], stale_after)
        if not donors or donors[0].round <= self.last_round:
            return None
        result = download_state(self.exchange, donors, timeout=120.0, run_id=self.run_id)
        if result is None:
            return None
        metadata, state = result[0].metadata, result[0].tensors
        round_number = int(metadata.get("round", 0))
        if round_number <= self.last_round:
            return None
        names = [n for n, _ in self.model.named_parameters()]
        params = list(self.model.parameters())
        if any(f"model.{n}" not in state or state[f"model.{n}"].shape != p.shape for n, p in zip(names, params)):
            logger.warning("a peer sent state that does not fit this run's model; ignored")
            return None
        samples_total = int(metadata.get("samples_total", 0))
        path = self.folder / f"round-{round_number:06d}.safetensors"
        sha = save_checkpoint(path, state, dict(run_id=self.run_id, round=round_number, samples_total=samples_total,
                                                strategy=metadata.get("strategy", ""), config_toml=self.cfg.to_toml(),
                                                time=time.time()))
        self.store.add_checkpoint(round_number, str(path), sha, samples_total)
        self.last_round = round_number
        self.summary.latest_checkpoint, self.summary.latest_checkpoint_round = str(path), round_number
        logger.info("checkpoint of round %d written to %s", round_number, path)
        self._prune()
        if self.evaluator.due(round_number):
            self._remember_samples(round_number, samples_total)
        for evaluated, metrics in self.evaluator.submit(round_number, path.read_bytes):
            self._record_eval(evaluated, metrics)
        return path

    def _remember_samples(self, round_number: int, samples_total: int) -> None:
        self.samples_at[round_number] = samples_total
        for old in sorted(self.samples_at)[:-SAMPLES_KEPT]:
            del self.samples_at[old]

    def _samples_of(self, round_number: int) -> Optional[int]:
        """The swarm's samples at the checkpoint of ``round_number``: remembered when it was saved, else from its
        row in the store while it is kept; None when neither knows."""
        samples = self.samples_at.pop(round_number, None)
        if samples is None:
            samples = next((c.samples_total for c in self.store.checkpoints() if c.round == round_number), None)
        return samples

    def _record_eval(self, round_number: int, metrics: dict) -> None:
        samples = self._samples_of(round_number)
        figures = metrics
        if samples is not None:
            lr = self.cfg.optimizer.lr * lr_factor(self.schedule, samples)
            metrics = dict(metrics, samples_total=int(samples), lr=float(lr))
        self.store.add_eval(round_number, metrics)
        s = self.summary
        if round_number < s.val_round:
            return  # a Ray task that finished after a later round's: kept in the history, not shown as latest
        s.val_loss, s.val_bpc, s.val_round, s.val_metrics = metrics["val_loss"], metrics["val_bpc"], round_number, metrics
        logger.info("round %d: validation %s%s", round_number, ", ".join(f"{k} {v:.4f}" for k, v in figures.items()),
                    "" if samples is None else f" (at {samples} samples of the swarm, lr {metrics['lr']:.3g})")

    def _prune(self) -> None:
        keep = self.cfg.coordinator.keep_checkpoints
        for old in self.store.checkpoints()[keep:]:
            for p in (Path(old.path), Path(old.path + ".sha256")):
                p.unlink(missing_ok=True)
            self.store.remove_checkpoint(old.path)

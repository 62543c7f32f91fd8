"""Evaluating the swarm's checkpoints: on the coordinator's own thread, or as Ray tasks on the operator's fleet.

Either way the work is :func:`evaluate_checkpoint`, a function of the run config and the checkpoint's bytes (so a
Ray task on another machine needs nothing from the coordinator's disk): validation loss and BPC for language
models; NLL, MSE against copying the last state, open-loop errors and reward error for world models, plus, with
``coordinator.eval_controller``, the return of a controller trained in the model's dream next to a random policy's.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

logger = logging.getLogger(__name__)

Result = tuple[int, dict]  # (round, metrics)


def evaluate_checkpoint(config_toml: str, data: bytes, max_bytes: int = 0, controller: bool = False) -> dict:
    import torch

    from cotrain.checkpoint import decode_checkpoint
    from cotrain.config import RunConfig
    from cotrain.data import Corpus
    from cotrain.tasks import build_task

    torch.set_num_threads(1)
    cfg = RunConfig.from_toml(config_toml)
    ckpt = decode_checkpoint(data)
    task = build_task(cfg)
    torch.manual_seed(cfg.run.seed)
    model = task.build_model()
    state = ckpt.model_state()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name not in state or state[name].shape != p.shape:
                raise ValueError(f"the checkpoint does not fit the run's model (parameter {name})")
            p.copy_(state[name])
    corpus = Corpus.from_source(cfg.data.source, cfg.data.max_bytes, cfg.data.val_fraction) if task.needs_corpus else None
    metrics = task.evaluate(model, corpus, max_bytes=max_bytes)
    if controller and cfg.model.is_world_model:
        from cotrain.tasks.controller import controller_vs_random

        model.eval()
        metrics.update(controller_vs_random(model, cfg.env.id, horizon=cfg.env.horizon, seed=cfg.run.seed))
    return metrics


class Evaluator:
    """Evaluates checkpoints every ``every_rounds`` rounds. Without a fleet, at once on the caller's thread;
    with one, as a Ray task whose result :meth:`collect` hands back when it is done (no one waits for it)."""

    def __init__(self, config_toml: str, max_bytes: int, every_rounds: int, controller: bool = False,
                 fleet=None):
        self.config_toml, self.max_bytes, self.every_rounds = config_toml, max_bytes, every_rounds
        self.controller, self.fleet = controller, fleet
        self.last_round: Optional[int] = None
        self.pending: list[tuple[int, object]] = []  # (round, Ray object ref)

    def due(self, round_number: int) -> bool:
        return self.last_round is None or round_number >= self.last_round + self.every_rounds

    def submit(self, round_number: int, load: Callable[[], bytes]) -> list[Result]:
        """Evaluate the checkpoint of ``round_number`` (its bytes from ``load()``) if due; -> the results finished
        now."""
        if self.due(round_number):
            self.last_round = round_number
            args = (self.config_toml, load(), self.max_bytes, self.controller)
            if self.fleet is None:
                return [(round_number, evaluate_checkpoint(*args))]
            self.pending.append((round_number, self.fleet.submit(evaluate_checkpoint, *args)))
            logger.info("round %d: evaluation submitted as a Ray task", round_number)
        return self.collect()

    def collect(self) -> list[Result]:
        """Results of the Ray tasks that have finished (a failed task is logged and dropped); none without a fleet."""
        out, still = [], []
        for round_number, ref in self.pending:
            if not self.fleet.done(ref):
                still.append((round_number, ref))
                continue
            try:
                out.append((round_number, self.fleet.result(ref)))
            except Exception as e:
                logger.warning("round %d: evaluation task failed: %r", round_number, e)
        self.pending = still
        return out


def evaluator_for(cfg, fleet=None) -> Evaluator:
    c = cfg.coordinator
    return Evaluator(cfg.to_toml(), c.eval_bytes, c.eval_every_rounds, c.eval_controller, fleet)

"""Evaluating the swarm's checkpoints: on the coordinator's own thread, or as Ray tasks on the operator's fleet.

Either way the work is :func:`evaluate_checkpoint`, a function of the run config and the checkpoint's bytes (so a
Ray task on another machine needs nothing from the coordinator's disk but the corpus it reads once): the run's one
evaluation (:func:`cotrain.evaluation.evaluate_state`, which the demo and the benches call too), i.e. validation
loss and BPC for language models; NLL, MSE against copying the last state, open-loop errors and reward error for
world models, plus, with ``coordinator.eval_controller``, the return of a controller trained in the model's dream
next to a random policy's.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, Optional

from cotrain.moe.mixture import TooFewExperts

logger = logging.getLogger(__name__)

Result = tuple[int, dict]  # (round, metrics)


def evaluate_checkpoint(config_toml: str, data: bytes, max_bytes: int = 0, controller: bool = False,
                        corpus=None, experts=None) -> dict:
    """The metrics of the checkpoint ``data`` (its bytes) under the run config ``config_toml``. ``corpus``: the
    run's, when the caller keeps it (else it is read here). ``experts``: a hosted mixture's clients
    (:class:`cotrain.moe.hosted.TrainerExperts`), called where the directory says each expert lives now."""
    import torch

    from cotrain.checkpoint import decode_checkpoint
    from cotrain.config import RunConfig
    from cotrain.evaluation import evaluate_model, model_from_state, read_corpus

    torch.set_num_threads(1)
    cfg = RunConfig.from_toml(config_toml)
    state = decode_checkpoint(data).model_state()
    corpus = read_corpus(cfg) if corpus is None else corpus
    model = model_from_state(cfg, state, corpus=corpus)
    if experts is not None:
        experts.refresh()
        experts.attach(model)
    return evaluate_model(cfg, model, corpus=corpus, max_bytes=max_bytes, controller=controller)


class Evaluator:
    """Evaluates checkpoints every ``every_rounds`` rounds. Without a fleet, at once on the caller's thread, with
    the run's corpus read once (``corpus``, or at the first evaluation) and kept; with one, as a Ray task whose result
    :meth:`collect` hands back when it is done (no one waits for it)."""

    def __init__(self, config_toml: str, max_bytes: int, every_rounds: int, controller: bool = False,
                 fleet=None, corpus=None, experts=None):
        self.config_toml, self.max_bytes, self.every_rounds = config_toml, max_bytes, every_rounds
        # a hosted mixture is evaluated here: a Ray task is not on the data plane, where its experts are called
        self.controller, self.fleet, self.experts = controller, None if experts is not None else fleet, experts
        if corpus is not None:
            self.corpus = corpus
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
                try:
                    return [(round_number, evaluate_checkpoint(*args, corpus=self.corpus, experts=self.experts))]
                except TooFewExperts as e:  # a hosted mixture whose hosts are away: the next evaluation may do
                    logger.warning("round %d: not evaluated: %s", round_number, e)
                    return []
            self.pending.append((round_number, self.fleet.submit(evaluate_checkpoint, *args)))
            logger.info("round %d: evaluation submitted as a Ray task", round_number)
        return self.collect()

    @functools.cached_property
    def corpus(self):
        """The run's corpus (None for world models), read at the first evaluation on this thread and kept."""
        from cotrain.config import RunConfig
        from cotrain.evaluation import read_corpus

        return read_corpus(RunConfig.from_toml(self.config_toml))

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


def evaluator_for(cfg, fleet=None, corpus=None, experts=None) -> Evaluator:
    """``corpus``: the run's, when the caller has read it already (the evaluator reads it otherwise); ``experts``: a
    hosted mixture's clients."""
    c = cfg.coordinator
    return Evaluator(cfg.to_toml(), c.eval_bytes, c.eval_every_rounds, c.eval_controller, fleet, corpus, experts)

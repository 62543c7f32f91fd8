"""The one evaluation of a run's model: what the coordinator records for a checkpoint (on its own thread or as a Ray
task on the operator's fleet), what ``cotrain demo`` prints and what the benches report are the same numbers for the
same weights.

Each task evaluates in its own way (:meth:`cotrain.tasks.LanguageTask.evaluate`: loss and bits per byte over the
validation split; :meth:`cotrain.tasks.WorldModelTask.evaluate`: likelihood and prediction errors on held-out
rollouts and, with ``controller``, the real return of a controller trained in the model's dream). This module builds
the run's model, loads a state into it and asks the task:

* :func:`evaluate_model`: an in-memory model;
* :func:`evaluate_state`: a state (parameter name -> tensor, as :meth:`Checkpoint.model_state` returns it), or None
  for the initial model every node starts from.

A caller that evaluates often passes the ``corpus`` it keeps; without one, the corpus is read from the run's source.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from cotrain.config import RunConfig
from cotrain.data import Corpus
from cotrain.models import build_model
from cotrain.tasks import build_task


def read_corpus(cfg: RunConfig) -> Optional[Corpus]:
    """The run's corpus when its task reads one (language models), else None."""
    if not build_task(cfg).needs_corpus:
        return None
    return Corpus.from_source(cfg.data.source, cfg.data.max_bytes, cfg.data.val_fraction)


def evaluate_model(cfg: RunConfig, model: nn.Module, *, corpus: Optional[Corpus] = None, max_bytes: int = 0,
                   controller: bool = False) -> dict[str, float]:
    """The task's metrics of ``model``: always ``val_loss`` and ``val_bpc`` (NaN for world models), plus the task's
    own. ``max_bytes`` > 0 evaluates only the first that many validation bytes (a cheaper, fixed estimate);
    ``controller`` adds a world model's ``controller_return`` and ``random_return`` (tens of seconds of CPU)."""
    task = build_task(cfg)
    if corpus is None and task.needs_corpus:
        corpus = read_corpus(cfg)
    return task.evaluate(model, corpus, max_bytes=max_bytes, controller=controller)


def evaluate_state(cfg: RunConfig, state: Optional[dict[str, torch.Tensor]], *, corpus: Optional[Corpus] = None,
                   max_bytes: int = 0, controller: bool = False) -> dict[str, float]:
    """:func:`evaluate_model` of the run's model holding ``state`` (None: the initial model)."""
    if corpus is None:
        corpus = read_corpus(cfg)
    model = model_from_state(cfg, state, corpus=corpus)
    return evaluate_model(cfg, model, corpus=corpus, max_bytes=max_bytes, controller=controller)


def model_from_state(cfg: RunConfig, state: Optional[dict[str, torch.Tensor]], *,
                     corpus: Optional[Corpus] = None) -> nn.Module:
    """The run's model holding ``state``, or for None the initial model every node starts from (a language model's
    output bias from the training text's byte counts, as the coordinator sends them; read from ``corpus``, or from
    the run's source when not given)."""
    if state is not None:
        return load_state(build_model(cfg), state)
    if corpus is None:
        corpus = read_corpus(cfg)
    return build_model(cfg, corpus.byte_counts() if corpus is not None else None)


@torch.no_grad()
def load_state(model: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    """Copy ``state`` into ``model``'s parameters (entries the model has no parameter for are ignored); a
    ValueError names the first parameter that is missing or has another shape. -> ``model``"""
    for name, p in model.named_parameters():
        if name not in state:
            raise ValueError(f"the state does not fit the run's model (parameter {name} is missing)")
        if state[name].shape != p.shape:
            raise ValueError(f"the state does not fit the run's model (parameter {name}: shape "
                             f"{tuple(state[name].shape)}, the model's is {tuple(p.shape)})")
        p.copy_(state[name])
    return model

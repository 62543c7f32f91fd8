"""The models a swarm can train, built from the run config's ``[model]`` (and, for world models, ``[env]``)."""

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Optional

import torch
from torch import nn

from cotrain.models.fast_slow import FastSlowLM
from cotrain.models.linear_rnn import LinearRecurrentLM
from cotrain.models.rnn_lm import VOCAB_SIZE, RNNLanguageModel
from cotrain.models.sampling import generate

__all__ = ["VOCAB_SIZE", "FastSlowLM", "LinearRecurrentLM", "RNNLanguageModel", "build_model", "count_parameters",
           "generate", "initial_seed"]

_seed_override: ContextVar[Optional[int]] = ContextVar("initial_seed", default=None)


def build_model(cfg, byte_counts=None) -> nn.Module:
    """The model of a run config (:class:`cotrain.config.RunConfig`) with the run's initial weights. ``byte_counts``
    (256 counts of the training text's byte values, as the coordinator sends them) start a language model's output
    bias at their log frequencies; world models ignore them.

    The weights are drawn from ``cfg.run.seed`` alone (inside :func:`initial_seed`, from that seed), on a forked
    random state: every node, the coordinator and every evaluation get the same initial model whatever they drew
    before, and the caller's random state is neither read nor changed. The weights equal those of
    ``torch.manual_seed(cfg.run.seed)`` followed by constructing the model."""
    seed = _seed_override.get()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.run.seed if seed is None else seed)
        return _construct(cfg, byte_counts)


@contextmanager
def initial_seed(seed: int):
    """Inside this block :func:`build_model` draws the weights from ``seed`` instead of the run's seed: fresh
    weights from the model's own initializer that are not the run's initial ones (shrink and perturb's noise)."""
    token = _seed_override.set(seed)
    try:
        yield
    finally:
        _seed_override.reset(token)


def _construct(cfg, byte_counts) -> nn.Module:
    m = cfg.model
    if m.is_world_model:
        from cotrain.data.rollouts import env_spec
        from cotrain.models.world import build_world_model

        spec = env_spec(cfg.env.id)
        return build_world_model(m.kind, spec.obs_dim, spec.action_dim, m.hidden_size, m.num_layers, m.num_mixtures)
    if m.kind == "fast_slow":
        model = FastSlowLM(m.embed_dim, m.fast_size, m.slow_size, m.fast_cells, m.zoneout_cell, m.zoneout_hidden,
                           m.dropout)
    elif m.kind == "moe_lstm":
        from cotrain.models.moe_lm import MixtureLM

        e = cfg.moe
        model = MixtureLM(m.embed_dim, m.hidden_size, m.num_layers, m.dropout, e.grid, e.expert_hidden, e.k, e.k_min,
                          e.chunk, e.layers, experts="hosted" if e.experts == "hosted" else None)
    elif m.kind in ("lru", "hgrn2", "mingru"):
        model = LinearRecurrentLM(m.kind, m.embed_dim, m.hidden_size, m.num_layers, m.dropout, m.state_size,
                                  m.expand_ratio, m.mlp_ratio)
    else:
        model = RNNLanguageModel(m.kind, m.embed_dim, m.hidden_size, m.num_layers, m.dropout)
    if byte_counts:
        model.init_output_bias(byte_counts)
    return model


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

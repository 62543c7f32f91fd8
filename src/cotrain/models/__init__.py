"""The models a swarm can train, built from the run config's ``[model]`` (and, for world models, ``[env]``)."""

from torch import nn

from cotrain.models.fast_slow import FastSlowLM
from cotrain.models.rnn_lm import VOCAB_SIZE, RNNLanguageModel
from cotrain.models.sampling import generate

__all__ = ["VOCAB_SIZE", "FastSlowLM", "RNNLanguageModel", "build_model", "count_parameters", "generate"]


def build_model(cfg, byte_counts=None) -> nn.Module:
    """The model of a run config (:class:`cotrain.config.RunConfig`). ``byte_counts`` (256 counts of the training
    text's byte values, as the coordinator sends them) start a language model's output bias at their log
    frequencies; world models ignore them."""
    m = cfg.model
    if m.is_world_model:
        from cotrain.data.rollouts import env_spec
        from cotrain.models.world import build_world_model

        spec = env_spec(cfg.env.id)
        return build_world_model(m.kind, spec.obs_dim, spec.action_dim, m.hidden_size, m.num_layers, m.num_mixtures)
    if m.kind == "fast_slow":
        model = FastSlowLM(m.embed_dim, m.fast_size, m.slow_size, m.fast_cells, m.zoneout_cell, m.zoneout_hidden,
                           m.dropout)
    else:
        model = RNNLanguageModel(m.kind, m.embed_dim, m.hidden_size, m.num_layers, m.dropout)
    if byte_counts:
        model.init_output_bias(byte_counts)
    return model


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

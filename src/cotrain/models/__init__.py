"""The models a swarm can train, built from the run config's ``[model]`` section."""

from torch import nn

from cotrain.config import ModelConfig
from cotrain.models.rnn_lm import VOCAB_SIZE, RNNLanguageModel
from cotrain.models.sampling import generate

__all__ = ["VOCAB_SIZE", "RNNLanguageModel", "build_model", "generate", "count_parameters"]


def build_model(cfg: ModelConfig) -> nn.Module:
    return RNNLanguageModel(cfg.kind, cfg.embed_dim, cfg.hidden_size, cfg.num_layers, cfg.dropout)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

"""A byte-level language model with mixture-of-experts layers: embedding -> LSTM -> mixture layers -> head.

The experts are a :class:`cotrain.moe.mixture.Experts`: all in this process (:class:`LocalExperts`, the reference a
decentralized mixture is measured against), or on expert hosts. Trainers keep everything else (the embedding, the
LSTM, the gates, the head) and average it as the swarm's rounds do.
"""

from __future__ import annotations

from typing import Sequence, Union

from torch import nn

from cotrain.models.rnn_lm import VOCAB_SIZE, ByteLanguageModel
from cotrain.moe.gating import grid_experts
from cotrain.moe.hosted import HostedExperts
from cotrain.moe.mixture import Experts, LocalExperts, MixtureLayer


class MixtureCore(nn.Module):
    """An LSTM, then ``layers`` mixture layers on its output (each residual); the LSTM's state is the core's."""

    def __init__(self, rnn: nn.Module, layers: Sequence[MixtureLayer]):
        super().__init__()
        self.rnn, self.layers = rnn, nn.ModuleList(layers)

    def forward(self, x, state=None):
        out, state = self.rnn(x, state)
        for layer in self.layers:
            out = layer(out)
        return out, state


class MixtureLM(ByteLanguageModel):
    def __init__(self, embed_dim: int = 64, hidden_size: int = 256, num_layers: int = 1, dropout: float = 0.1,
                 grid: Sequence[int] = (4, 4), expert_hidden: int = 512, k: int = 4, k_min: int = 1,
                 chunk: int = 32, moe_layers: int = 1, experts: Union[None, str, Sequence[Experts]] = None,
                 vocab_size: int = VOCAB_SIZE):
        """``experts``: one :class:`Experts` a mixture layer; None: every expert in this process; "hosted": on expert
        hosts (:class:`cotrain.moe.hosted.HostedExperts`, none until attached)."""
        count = len(grid_experts(grid))
        if experts == "hosted":  # on expert hosts: attached once the node is on the data plane
            experts = [HostedExperts(layer) for layer in range(moe_layers)]
        if experts is None:
            experts = [LocalExperts(count, hidden_size, expert_hidden) for _ in range(moe_layers)]
        if len(experts) != moe_layers:
            raise ValueError(f"experts: {len(experts)} for {moe_layers} mixture layers")
        rnn = nn.LSTM(embed_dim, hidden_size, num_layers, batch_first=True,
                      dropout=dropout if num_layers > 1 else 0.0)
        layers = [MixtureLayer(hidden_size, grid, k, k_min, chunk, e) for e in experts]
        super().__init__(embed_dim, MixtureCore(rnn, layers), hidden_size, dropout, vocab_size)
        self.kind = "moe_lstm"

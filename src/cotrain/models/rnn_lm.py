"""Byte-level recurrent language models (LSTM, GRU).

Embedding -> stacked recurrent layers -> linear output over the 256 byte values. Trained with truncated
backpropagation through time: the caller carries ``state`` from one batch of a stream to the next and detaches it.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB_SIZE = 256


class RNNLanguageModel(nn.Module):
    def __init__(self, kind: str = "lstm", embed_dim: int = 64, hidden_size: int = 256, num_layers: int = 2,
                 dropout: float = 0.1, vocab_size: int = VOCAB_SIZE):
        super().__init__()
        if kind not in ("lstm", "gru"):
            raise ValueError(f"model.kind: expected 'lstm' or 'gru', got {kind!r}")
        self.kind = kind
        self.embed = nn.Embedding(vocab_size, embed_dim)
        rnn_cls = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = rnn_cls(embed_dim, hidden_size, num_layers, batch_first=True,
                           dropout=dropout if num_layers > 1 else 0.0)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, tokens: torch.Tensor, state=None):
        """tokens: (batch, time) int64 -> logits (batch, time, vocab), new state."""
        out, state = self.rnn(self.embed(tokens), state)
        return self.head(self.drop(out)), state

    @staticmethod
    def detach_state(state):
        if state is None:
            return None
        if isinstance(state, tuple):
            return tuple(s.detach() for s in state)
        return state.detach()

"""Evaluation of the shared model on the held-out split."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from cotrain.data import StreamBatches
from cotrain.data.streams import ReadFn


@dataclass(frozen=True)
class LMEval:
    loss: float  # nats per byte
    bytes: int

    @property
    def bpc(self) -> float:
        return self.loss / math.log(2)


@torch.no_grad()
def evaluate_lm(model, read: ReadFn, start: int, end: int, seq_len: int, batch_size: int = 8,
                max_bytes: int = 0) -> LMEval:
    """Mean cross-entropy (nats per byte) over [start, end) with the hidden state carried across batches.

    ``max_bytes`` > 0 evaluates only the first that many bytes of the range (a cheaper, fixed estimate).
    """
    if max_bytes:
        end = min(end, start + max_bytes)
    batch_size = max(1, min(batch_size, (end - start) // (seq_len + 1)))
    batches = StreamBatches(read, start, end, batch_size, seq_len)
    steps = max(1, (batches.stream_len - 1) // seq_len)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count, state = 0.0, 0, None
    for _ in range(steps):
        x, y, _ = batches.next_batch()
        logits, state = model(x.to(device), state)
        total += F.cross_entropy(logits.flatten(0, 1).float(), y.to(device).flatten(), reduction="sum").item()
        count += y.numel()
    model.train(was_training)
    return LMEval(total / count, count)

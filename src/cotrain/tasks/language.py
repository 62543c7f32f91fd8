"""Byte-level language modelling: truncated BPTT over the node's range of the corpus; bits per character."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch.nn import functional as F

from cotrain.config import RunConfig
from cotrain.data import Corpus, StreamBatches
from cotrain.data.streams import ReadFn, stream_ranges
from cotrain.models import build_model

#: parallel streams of the held-out evaluation, whatever the run trains with: every evaluation of one model, by
#: whoever runs it, reads the validation split the same way and gets the same number
EVAL_BATCH_SIZE = 8


class LanguageTrainData:
    """Batches over a work unit ``[start, end)`` of ``split``: ``batch_size`` parallel streams spread over the split
    (:func:`cotrain.data.streams.stream_ranges`), the hidden state carried from one batch to the next. ``done`` once
    every stream was read through (the unit was trained on once); reading on wraps around."""

    def __init__(self, read: ReadFn, start: int, end: int, batch_size: int, seq_len: int,
                 split: Optional[tuple[int, int]] = None):
        self.batches = StreamBatches(read, start, end, batch_size, seq_len, split=split)

    @property
    def done(self) -> bool:
        b = self.batches
        return b.epoch > 0 or b.position + b.seq_len + 1 > b.stream_len

    def next(self):
        """-> ((inputs, targets), reset_state)"""
        x, y, new_epoch = self.batches.next_batch()
        return (x, y), new_epoch

    def last_ranges(self) -> list[tuple[int, int]]:
        """The byte ranges of the training split the last batch came from (what a validator scores a node on)."""
        return self.batches.last_ranges()


class LanguageTask:
    needs_corpus = True

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg

    def build_model(self, byte_counts=None):
        """The run's model; ``byte_counts`` of the training text (from the coordinator) set its initial output bias."""
        return build_model(self.cfg, byte_counts)

    def train_data(self, read: ReadFn, start: int, end: int, seed: int,
                   split: Optional[tuple[int, int]] = None) -> LanguageTrainData:
        """The unit ``[start, end)`` of the training ``split`` (default: the unit is the split)."""
        return LanguageTrainData(read, start, end, self.cfg.data.batch_size, self.cfg.data.seq_len, split)

    def unit_ranges(self, start: int, end: int, split: tuple[int, int]) -> list[tuple[int, int]]:
        """The byte ranges :meth:`train_data` reads of the unit: what a node fetches from the coordinator."""
        return stream_ranges(start, end, self.cfg.data.batch_size, split)

    def step(self, model, batch, state, device) -> tuple[torch.Tensor, object, int]:
        """-> (loss, carried state, samples)"""
        x, y = batch
        # non_blocking: the copy to a CUDA device need not wait for the previous step's backward to finish (the
        # batch, in pageable memory, is staged before the call returns: safe to reuse); a no-op on a CPU
        logits, state = model(x.to(device, non_blocking=True), state)
        loss = F.cross_entropy(logits.flatten(0, 1), y.to(device, non_blocking=True).flatten())
        return loss, state, x.shape[0]

    def evaluate(self, model, corpus: Optional[Corpus], max_bytes: int = 0,
                 controller: bool = False) -> dict[str, float]:
        """Loss (nats per byte) and bits per byte over the validation split of ``corpus`` (its first ``max_bytes``
        when > 0); ``controller`` is for world models. Callers go through :mod:`cotrain.evaluation`."""
        result = evaluate_lm(model, corpus.read, corpus.val.start, corpus.val.end, self.cfg.data.seq_len,
                             batch_size=EVAL_BATCH_SIZE, max_bytes=max_bytes)
        return {"val_loss": result.loss, "val_bpc": result.bpc}


@dataclass(frozen=True)
class LMEval:
    loss: float  # nats per byte
    bytes: int

    @property
    def bpc(self) -> float:
        return self.loss / math.log(2)


@torch.no_grad()
def evaluate_lm(model, read: ReadFn, start: int, end: int, seq_len: int, batch_size: int = EVAL_BATCH_SIZE,
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

"""World models: every node collects its own rollouts locally and trains on them; evaluation on held-out ones."""

from __future__ import annotations

import math
from typing import Optional

import torch

from cotrain.config import RunConfig
from cotrain.data.rollouts import collect_rollouts
from cotrain.models import build_model
from cotrain.world_eval import evaluate_world_model

#: the coordinator's held-out rollouts use seeds far from any node's
EVAL_SEED_OFFSET = 1_000_003


class RolloutTrainData:
    """A work unit of a world model: ``env.episodes`` rollouts collected here from the unit's seed, trained on
    ``env.passes`` times; then ``done`` (reading on goes over them again)."""

    def __init__(self, cfg: RunConfig, seed: int):
        env = cfg.env
        self.cfg = cfg
        self.generator = torch.Generator().manual_seed(seed)
        self.rollouts = collect_rollouts(env.id, env.episodes, env.horizon, seed=seed)
        self.passes = 0
        self._iter = self.rollouts.batches(cfg.data.batch_size, self.generator)

    @property
    def done(self) -> bool:
        return self.passes >= self.cfg.env.passes

    def next(self):
        while True:
            try:
                return next(self._iter), False
            except StopIteration:
                self.passes += 1
                self._iter = self.rollouts.batches(self.cfg.data.batch_size, self.generator)


class WorldModelTask:
    needs_corpus = False

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self._held_out = None

    def build_model(self, byte_counts=None):
        return build_model(self.cfg)  # byte counts are for language models

    def train_data(self, read, start: int, end: int, seed: int) -> RolloutTrainData:
        """``seed``: the work unit's (held-out rollouts use seeds from EVAL_SEED_OFFSET on)."""
        return RolloutTrainData(self.cfg, seed=seed % (EVAL_SEED_OFFSET // 2))  # never a held-out seed

    def step(self, model, batch, state, device) -> tuple[torch.Tensor, object, int]:
        loss, _ = model.loss(batch.to(device))
        return loss, None, len(batch)

    def held_out(self):
        if self._held_out is None:
            env = self.cfg.env
            self._held_out = collect_rollouts(env.id, env.eval_episodes, env.horizon,
                                              seed=self.cfg.run.seed + EVAL_SEED_OFFSET)
        return self._held_out

    def evaluate(self, model, corpus=None, max_bytes: int = 0) -> dict[str, float]:
        was_training = model.training
        model.eval()
        with torch.no_grad():
            metrics = evaluate_world_model(model, self.held_out())
        model.train(was_training)
        out = {"val_loss": metrics["nll"], "val_bpc": math.nan}
        out.update({k: float(v) for k, v in metrics.items()})
        return out

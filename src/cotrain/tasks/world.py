"""World models: every node collects its own rollouts locally and trains on them; evaluation on held-out ones.

The held-out rollouts come from seeds no node uses. :func:`evaluate_world_model` gives the numbers that tell whether M
of Ha and Schmidhuber, "World Models" (2018), or the Actions World Model of Ma et al. (ICML 2024) has learned the
dynamics rather than memorised its data:

* ``nll``: next-observation negative log-likelihood per dimension (teacher-forced for the MDN-RNN; for the Actions
  World Model its Gaussian given obs_0 and the actions, which is all it ever sees);
* ``mse``: squared error of the predicted mean of obs_{t+1}, averaged over dimensions and valid steps;
* ``copy_mse``: the same error for the baseline that predicts obs_{t+1} = obs_t; ``normalized_mse`` = mse / copy_mse
  (below 1 means the model beats copying the last state);
* ``open_loop_mse_{1,5,10}``: start from obs_0, feed the model its own predictions (the MDN-RNN) or just the actions
  (the Actions World Model) for h steps, and take the error at obs_h; NaN when the rollouts are shorter than h;
* ``reward_mae``: mean absolute error of the predicted reward (teacher-forced for the MDN-RNN).

Everything is masked: padding after an episode terminated never counts.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from cotrain.config import RunConfig
from cotrain.data.rollouts import Rollouts, collect_rollouts
from cotrain.models import build_model
from cotrain.models.world import ActionsWorldModel, MDNRNN, masked_mean

#: the coordinator's held-out rollouts use seeds far from any node's
EVAL_SEED_OFFSET = 1_000_003

#: the steps after which the open-loop error is taken
OPEN_LOOP_HORIZONS = (1, 5, 10)


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

    def build_model(self, byte_counts=None):
        return build_model(self.cfg)  # byte counts are for language models

    def train_data(self, read, start: int, end: int, seed: int, split=None) -> RolloutTrainData:
        """``seed``: the work unit's (held-out rollouts use seeds from EVAL_SEED_OFFSET on); a unit is a quota of
        rollouts: no bytes, no ``split``."""
        return RolloutTrainData(self.cfg, seed=seed % (EVAL_SEED_OFFSET // 2))  # never a held-out seed

    def step(self, model, batch, state, device) -> tuple[torch.Tensor, object, int]:
        loss, _ = model.loss(batch.to(device))
        return loss, None, len(batch)

    def held_out(self) -> Rollouts:
        env = self.cfg.env
        return held_out_rollouts(env.id, env.eval_episodes, env.horizon, self.cfg.run.seed + EVAL_SEED_OFFSET)

    def evaluate(self, model, corpus=None, max_bytes: int = 0, controller: bool = False) -> dict[str, float]:
        """The metrics of :func:`evaluate_world_model` on the held-out rollouts (``val_loss`` is the NLL); with
        ``controller``, the real returns of a controller trained in the model's dream and of a random policy
        (:func:`cotrain.tasks.controller.controller_vs_random`). Callers go through :mod:`cotrain.evaluation`."""
        metrics = evaluate_world_model(model, self.held_out())
        out = {"val_loss": metrics["nll"], "val_bpc": math.nan}
        out.update({k: float(v) for k, v in metrics.items()})
        if controller:
            from cotrain.tasks.controller import controller_vs_random  # imports cma: only where it is asked for

            out.update(controller_vs_random(model, self.cfg.env.id, horizon=self.cfg.env.horizon,
                                            seed=self.cfg.run.seed))
        return out


@functools.lru_cache(maxsize=4)
def held_out_rollouts(env_id: str, episodes: int, horizon: int, seed: int) -> Rollouts:
    """The held-out rollouts, collected once per process, so that an evaluator evaluating every few rounds does not
    collect them again (evaluation only reads them)."""
    return collect_rollouts(env_id, episodes, horizon, seed=seed)


@torch.no_grad()
def evaluate_world_model(model: nn.Module, rollouts: Rollouts) -> dict[str, float]:
    """The metrics above, as floats, for ``model`` (MDNRNN or ActionsWorldModel) on ``rollouts``."""
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        batch = rollouts.to(device)
        obs, nxt, mask = batch.obs[:, :-1], batch.obs[:, 1:], batch.mask
        if isinstance(model, MDNRNN):
            out, _ = model(obs, batch.actions)
            predicted = model.imagine(batch.obs[:, 0], batch.actions[:, :max(OPEN_LOOP_HORIZONS)]).obs
        elif isinstance(model, ActionsWorldModel):
            out = model(batch.obs[:, 0], batch.actions)
            predicted = out.mean
        else:
            raise TypeError(f"expected an MDNRNN or an ActionsWorldModel, got {type(model).__name__}")

        mse = masked_mean(((out.expected() - nxt) ** 2).mean(-1), mask).item()
        copy_mse = masked_mean(((obs - nxt) ** 2).mean(-1), mask).item()
        metrics = {
            "nll": masked_mean(out.nll(nxt), mask).item(),
            "mse": mse,
            "copy_mse": copy_mse,
            "normalized_mse": mse / copy_mse if copy_mse > 0 else float("inf"),
        }
        for h in OPEN_LOOP_HORIZONS:
            key = f"open_loop_mse_{h}"
            if h > batch.horizon:
                metrics[key] = float("nan")
                continue
            error = ((predicted[:, h - 1] - batch.obs[:, h]) ** 2).mean(-1)
            metrics[key] = masked_mean(error, mask[:, h - 1]).item()  # obs_h is real when step h-1 happened
        metrics["reward_mae"] = masked_mean((out.reward - batch.rewards).abs(), mask).item()
        return metrics
    finally:
        model.train(was_training)

"""Held-out evaluation of a world model (MDN-RNN or Actions World Model) on real rollouts.

The numbers that tell whether M of Ha and Schmidhuber, "World Models" (2018), or the Actions World Model of Ma et
al. (ICML 2024) has learned the dynamics rather than memorised its data:

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

import torch
from torch import nn

from cotrain.data.rollouts import Rollouts
from cotrain.models.world import ActionsWorldModel, MDNRNN, masked_mean

OPEN_LOOP_HORIZONS = (1, 5, 10)


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

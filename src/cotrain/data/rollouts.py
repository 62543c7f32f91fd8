"""Rollouts of a classic-control environment, collected locally by each node, for training world models.

World models after Ha and Schmidhuber, "World Models" (2018): an agent first collects rollouts of the real
environment (with a random policy), then fits a model of the environment's dynamics to them. Here every node of a
swarm collects its own rollouts from a gymnasium classic-control environment (nothing is downloaded) and the swarm
averages the world models trained on them.

A batch of rollouts is a set of fixed-length tensors. Episodes that terminate before ``horizon`` steps are padded:
``mask`` is 0.0 after the terminal step, the last observation is repeated, and actions, rewards and dones are 0.0
there. Discrete actions are stored as one-hot vectors, continuous ones as the float vector that was applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import gymnasium
import numpy as np
import torch

#: the environments a world-model run may use: all gymnasium classic control, simulated locally
ENVS = ("Pendulum-v1", "CartPole-v1", "Acrobot-v1")

Policy = Callable[[np.ndarray], "int | np.ndarray"]


@dataclass(frozen=True)
class EnvSpec:
    """Sizes of an environment as the world models see it: a discrete action is a one-hot vector of size n."""

    obs_dim: int
    action_dim: int
    discrete: bool


def env_spec(env_id: str) -> EnvSpec:
    """The observation size, action size and action kind of one of ``ENVS``."""
    env = make_env(env_id)
    try:
        obs_dim = int(np.prod(env.observation_space.shape))
        space = env.action_space
        if isinstance(space, gymnasium.spaces.Discrete):
            return EnvSpec(obs_dim, int(space.n), True)
        return EnvSpec(obs_dim, int(np.prod(space.shape)), False)
    finally:
        env.close()


def make_env(env_id: str, max_episode_steps: int | None = None) -> gymnasium.Env:
    """``gymnasium.make`` for one of ``ENVS``, optionally with its own time limit."""
    if env_id not in ENVS:
        raise ValueError(f"env.id: expected one of {', '.join(ENVS)}, got {env_id!r}")
    if max_episode_steps is None:
        return gymnasium.make(env_id)
    return gymnasium.make(env_id, max_episode_steps=max_episode_steps)


@dataclass
class Rollouts:
    """N episodes of T steps.

    obs:     (N, T+1, obs_dim) float32, obs[:, t] is the observation before action t; obs[:, T] the last one
    actions: (N, T, action_dim) float32, one-hot for discrete environments
    rewards: (N, T) float32, reward received for action t
    dones:   (N, T) float32, 1.0 at the step whose action terminated the episode
    mask:    (N, T) float32, 1.0 for steps that happened, 0.0 for the padding after termination
    """

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor
    mask: torch.Tensor

    def __len__(self) -> int:
        return self.obs.shape[0]

    @property
    def horizon(self) -> int:
        return self.actions.shape[1]

    def select(self, index: torch.Tensor | slice) -> "Rollouts":
        """The episodes at ``index`` (a slice or a tensor of indices)."""
        return Rollouts(self.obs[index], self.actions[index], self.rewards[index], self.dones[index],
                        self.mask[index])

    def split(self, fraction: float) -> tuple["Rollouts", "Rollouts"]:
        """(train, held_out): the last ``fraction`` of the episodes are held out, at least one on each side."""
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"split fraction must lie in (0, 1), got {fraction}")
        n = len(self)
        if n < 2:
            raise ValueError(f"cannot split {n} episode(s) into train and held-out")
        held = min(n - 1, max(1, int(round(n * fraction))))
        return self.select(slice(0, n - held)), self.select(slice(n - held, n))

    def batches(self, batch_size: int, generator: torch.Generator | None = None) -> Iterator["Rollouts"]:
        """One pass over the episodes in a random order drawn from ``generator``, ``batch_size`` at a time."""
        order = torch.randperm(len(self), generator=generator)
        for start in range(0, len(self), batch_size):
            yield self.select(order[start:start + batch_size].to(self.obs.device))

    def to(self, device: torch.device | str) -> "Rollouts":
        return Rollouts(self.obs.to(device), self.actions.to(device), self.rewards.to(device),
                        self.dones.to(device), self.mask.to(device))


def collect_rollouts(env_id: str, episodes: int, horizon: int, seed: int,
                     policy: Policy | None = None) -> Rollouts:
    """Run ``episodes`` episodes of at most ``horizon`` steps in the real environment.

    The environment is created with ``gymnasium.make`` and its time limit set to ``horizon``. Its resets are seeded
    from ``seed`` (the first reset takes the seed, later ones continue the environment's generator) and so is the
    action space that the random policy samples from, so the same seed gives identical rollouts. ``policy`` maps an
    observation (np.ndarray) to an action: an int for discrete environments, an array for continuous ones
    (clipped to the action bounds); None samples uniformly random actions.
    """
    if episodes < 1 or horizon < 1:
        raise ValueError(f"need at least one episode of one step, got episodes={episodes}, horizon={horizon}")
    env = make_env(env_id, max_episode_steps=horizon)
    spec = env_spec(env_id)
    env.action_space.seed(seed)
    obs = np.zeros((episodes, horizon + 1, spec.obs_dim), dtype=np.float32)
    actions = np.zeros((episodes, horizon, spec.action_dim), dtype=np.float32)
    rewards = np.zeros((episodes, horizon), dtype=np.float32)
    dones = np.zeros((episodes, horizon), dtype=np.float32)
    mask = np.zeros((episodes, horizon), dtype=np.float32)
    try:
        for episode in range(episodes):
            observation, _ = env.reset(seed=seed if episode == 0 else None)
            obs[episode, 0] = observation
            for t in range(horizon):
                action = env.action_space.sample() if policy is None else policy(np.asarray(observation))
                if spec.discrete:
                    action = int(action)
                    actions[episode, t, action] = 1.0
                else:
                    space = env.action_space
                    action = np.clip(np.asarray(action, dtype=np.float32).reshape(space.shape), space.low,
                                     space.high)
                    actions[episode, t] = action.reshape(-1)
                observation, reward, terminated, truncated, _ = env.step(action)
                obs[episode, t + 1] = observation
                rewards[episode, t] = reward
                mask[episode, t] = 1.0
                if terminated:
                    dones[episode, t] = 1.0
                if terminated or truncated:
                    obs[episode, t + 2:] = observation  # padding: the last observation, repeated
                    break
    finally:
        env.close()
    return Rollouts(torch.from_numpy(obs), torch.from_numpy(actions), torch.from_numpy(rewards),
                    torch.from_numpy(dones), torch.from_numpy(mask))

"""A linear controller trained entirely inside a world model with CMA-ES, then evaluated in the real environment.

As in Ha and Schmidhuber, "World Models" (2018), the controller C is deliberately tiny (a linear map) and is
trained with CMA-ES "in the dream": each candidate's fitness is the return the world model predicts when it rolls
forward from real start observations, feeding back its own predicted observations and the controller's actions.
No environment step is taken while training. The world model may be the MDN-RNN or the Actions World Model of Ma et
al., "Do Transformer World Models Give Better Policy Gradients?" (ICML 2024); both expose
``predict_next(obs, action, state)``.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn

from cotrain.data.rollouts import collect_rollouts, env_spec, make_env

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # cma warns that matplotlib is missing; plotting is never used here
    import cma


class LinearPolicy:
    """obs -> action. Continuous: low + (tanh(W obs + b) + 1) / 2 * (high - low), i.e. tanh scaled to the action
    bounds. Discrete: argmax(W obs + b). The parameters are one flat vector [W.ravel(), b] for CMA-ES."""

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, low=None, high=None):
        self.obs_dim, self.action_dim, self.discrete = obs_dim, action_dim, discrete
        if not discrete and (low is None or high is None):
            raise ValueError("a continuous policy needs the action bounds low and high")
        self.low = None if discrete else np.broadcast_to(np.asarray(low, np.float32), (action_dim,)).copy()
        self.high = None if discrete else np.broadcast_to(np.asarray(high, np.float32), (action_dim,)).copy()
        self.weight = np.zeros((action_dim, obs_dim), dtype=np.float32)
        self.bias = np.zeros(action_dim, dtype=np.float32)

    @classmethod
    def for_env(cls, env_id: str) -> "LinearPolicy":
        spec = env_spec(env_id)
        if spec.discrete:
            return cls(spec.obs_dim, spec.action_dim, True)
        env = make_env(env_id)
        try:
            return cls(spec.obs_dim, spec.action_dim, False, env.action_space.low, env.action_space.high)
        finally:
            env.close()

    @property
    def num_params(self) -> int:
        return self.action_dim * (self.obs_dim + 1)

    def get_params(self) -> np.ndarray:
        return np.concatenate([self.weight.ravel(), self.bias]).astype(np.float64)

    def set_params(self, params) -> None:
        params = np.asarray(params, dtype=np.float32).ravel()
        if params.size != self.num_params:
            raise ValueError(f"expected {self.num_params} parameters, got {params.size}")
        split = self.action_dim * self.obs_dim
        self.weight = params[:split].reshape(self.action_dim, self.obs_dim).copy()
        self.bias = params[split:].copy()

    def __call__(self, obs: np.ndarray):
        """An action for the real environment: an int (discrete) or an array within the bounds (continuous)."""
        z = self.weight @ np.asarray(obs, dtype=np.float32).ravel() + self.bias
        if self.discrete:
            return int(np.argmax(z))
        return self.low + (np.tanh(z) + 1.0) * 0.5 * (self.high - self.low)

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions as the world models read them, (B, action_dim): one-hot for discrete environments."""
        params = torch.as_tensor(self.get_params(), dtype=obs.dtype, device=obs.device)
        return _population_actions(self, params.unsqueeze(0), obs.unsqueeze(0))[0]


def _population_actions(policy: LinearPolicy, params: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
    """Actions of P linear policies at once: params (P, num_params), obs (P, N, obs_dim) -> (P, N, action_dim)."""
    p, a, d = params.shape[0], policy.action_dim, policy.obs_dim
    weight = params[:, :a * d].reshape(p, a, d)
    bias = params[:, a * d:].reshape(p, 1, a)
    z = torch.einsum("pad,pnd->pna", weight, obs) + bias
    if policy.discrete:
        return torch.nn.functional.one_hot(z.argmax(-1), a).to(obs.dtype)
    low = torch.as_tensor(policy.low, dtype=obs.dtype, device=obs.device)
    high = torch.as_tensor(policy.high, dtype=obs.dtype, device=obs.device)
    return low + (torch.tanh(z) + 1.0) * 0.5 * (high - low)


@torch.no_grad()
def dream_returns(model: nn.Module, policy: LinearPolicy, population: np.ndarray, start_obs: torch.Tensor,
                  horizon: int, temperature: float = 0.0, seed: int = 0) -> np.ndarray:
    """Mean return predicted by ``model`` over ``start_obs`` (N, obs_dim) for each of the P parameter vectors in
    ``population`` (P, num_params): the expected return under the model's P(done), each reward weighted by the
    probability that the episode is still running. ``temperature`` > 0 dreams draws instead of mixture means
    (``seed`` seeds them, the same for every candidate)."""
    generator = torch.Generator().manual_seed(seed) if temperature > 0 else None
    device = next(model.parameters()).device
    start_obs = start_obs.to(device=device, dtype=torch.float32)
    params = torch.as_tensor(np.asarray(population), dtype=torch.float32, device=device)
    p, n = params.shape[0], start_obs.shape[0]
    obs = start_obs.unsqueeze(0).expand(p, n, -1).reshape(p * n, -1)
    total = torch.zeros(p * n, device=device)
    alive = torch.ones(p * n, device=device)
    state = None
    for _ in range(horizon):
        action = _population_actions(policy, params, obs.reshape(p, n, -1)).reshape(p * n, -1)
        obs, reward, done_prob, state = model.predict_next(obs, action, state, temperature, generator)
        total += alive * reward
        alive = alive * (1.0 - done_prob)
    return total.reshape(p, n).mean(1).cpu().numpy()


def train_controller_in_dream(model: nn.Module, env_id: str, start_obs: torch.Tensor, horizon: int,
                              iterations: int, popsize: int, seed: int, sigma0: float = 0.5,
                              temperature: float = 1.0) -> tuple[LinearPolicy, list[dict[str, float]]]:
    """CMA-ES on a ``LinearPolicy``, maximising the return ``model`` predicts over ``horizon`` steps from the real
    start observations ``start_obs`` (N, obs_dim). No environment step is taken (the environment is only asked for
    its action space). Returns CMA-ES's final mean and, per iteration, the best and mean predicted return.
    CMA-ES is seeded with ``seed + 1`` (cma treats seed 0 as "seed from the clock").

    ``temperature``: the dream draws its observations at this temperature (new draws every iteration) instead of
    following the mixture mean (0). As Ha and Schmidhuber found, a controller trained in a noisier dream exploits
    the model's errors less. Measured with MDN-RNNs trained 3000 steps on random rollouts (three model seeds,
    dream horizon 50, real episodes of 200 steps): Pendulum, mean dream -1190 / -711 / -712, temperature 1
    -797 / -731 / -711 (random -1268); CartPole, mean dream 99 / 69 / 13, temperature 1 75 / 74 / 23 (random 24)."""
    policy = LinearPolicy.for_env(env_id)
    was_training = model.training
    model.eval()
    es = cma.CMAEvolutionStrategy(np.zeros(policy.num_params), sigma0,
                                  {"popsize": popsize, "seed": seed + 1, "verbose": -9, "verb_log": 0,
                                   "verb_disp": 0})
    history: list[dict[str, float]] = []
    best_return = -np.inf
    try:
        for iteration in range(iterations):
            candidates = es.ask()
            returns = dream_returns(model, policy, np.stack(candidates), start_obs, horizon, temperature,
                                    seed=seed * 100_003 + iteration)
            es.tell(candidates, (-returns).tolist())  # cma minimises
            top = int(np.argmax(returns))
            best_return = max(best_return, float(returns[top]))
            history.append({"iteration": iteration, "best": float(returns[top]), "mean": float(returns.mean()),
                            "best_so_far": best_return})
    finally:
        model.train(was_training)
    policy.set_params(es.result.xfavorite)
    return policy, history


def evaluate_policy(policy: LinearPolicy | None, env_id: str, episodes: int, seed: int, horizon: int) -> float:
    """Mean undiscounted return over ``episodes`` real episodes of at most ``horizon`` steps (None: random)."""
    rollouts = collect_rollouts(env_id, episodes, horizon, seed, policy)
    return float((rollouts.rewards * rollouts.mask).sum(1).mean())


def controller_vs_random(model: nn.Module, env_id: str, horizon: int, iterations: int = 40, popsize: int = 16,
                         episodes: int = 20, seed: int = 0, temperature: float = 1.0) -> dict[str, float]:
    """Is the world model useful? Train a linear controller entirely in its dream (CMA-ES) and try it in the real
    environment next to a random policy: mean real returns over ``episodes`` episodes of up to 200 steps."""
    start = collect_rollouts(env_id, 32, 2, seed=12345 + seed).obs[:, 0]
    policy, _ = train_controller_in_dream(model, env_id, start, horizon=horizon, iterations=iterations,
                                          popsize=popsize, seed=seed, temperature=temperature)
    return {"controller_return": evaluate_policy(policy, env_id, episodes=episodes, seed=777 + seed, horizon=200),
            "random_return": evaluate_policy(None, env_id, episodes=episodes, seed=777 + seed, horizon=200)}

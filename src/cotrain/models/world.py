"""World models of a classic-control environment: the MDN-RNN and the Actions World Model.

``MDNRNN`` is the memory model M of Ha and Schmidhuber, "World Models" (2018): an LSTM reads the observation and
the action of each step, and a mixture density network (a mixture of K diagonal Gaussians) gives the distribution
of the next observation; two more heads give the reward and the probability that the episode ends. Ha and
Schmidhuber model the latent code z of a VAE; the classic-control observations here are small, so M models them
directly.

``ActionsWorldModel`` follows the Actions World Model of Ma et al., "Do Transformer World Models Give Better Policy
Gradients?" (ICML 2024): it conditions only on the initial observation and the action sequence. An encoder maps
obs_0 to the initial LSTM state and the LSTM then reads actions only, never an observed (or predicted) obs_t for
t > 0, so every prediction at step t is a differentiable function of every earlier action along a short path, which
gives better-behaved policy gradients through long imagined rollouts.

Both models predict, for step t: the next observation obs_{t+1}, the reward r_t of action a_t taken at obs_t, and a
logit for done_t. Both expose the same one-step interface, ``predict_next(obs, action, state)``, which is all a
controller trained in the dream needs, and ``imagine(obs0, actions)`` for an open-loop rollout.

Design choices:
* MDNRNN predicts the change obs_{t+1} - obs_t (each component's mean is obs_t plus a learned offset); the outputs
  are reported as absolute means of obs_{t+1}, and the likelihood is always that of obs_{t+1} (a shift does not
  change a density, so the NLL of the change equals the NLL of obs_{t+1}).
* ActionsWorldModel predicts obs_{t+1} as obs_0 plus a learned offset: it never sees obs_t, so the only anchor it
  has is the initial observation.
* Log standard deviations are clamped to [LOG_STD_MIN, LOG_STD_MAX] so that deterministic dynamics cannot drive
  the likelihood to infinity.
* Losses are masked means over the valid steps: next-observation NLL per dimension + reward MSE + done BCE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from cotrain.data.rollouts import Rollouts

LOG_STD_MIN = -7.0
LOG_STD_MAX = 3.0
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)

WORLD_MODEL_KINDS = ("mdn_rnn", "actions_wm")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` (B, T) over the entries where ``mask`` (B, T) is 1."""
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def _gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(x; mean, exp(log_std)^2)."""
    return -0.5 * ((x - mean) * torch.exp(-log_std)) ** 2 - log_std - _LOG_SQRT_2PI


class Imagined(NamedTuple):
    """An open-loop rollout: predicted obs_1..obs_T (B, T, obs_dim), rewards r_0..r_{T-1} (B, T), P(done) (B, T)."""

    obs: torch.Tensor
    rewards: torch.Tensor
    done_probs: torch.Tensor


@dataclass
class MDNOutput:
    """MDNRNN predictions for every step: a K-component mixture over obs_{t+1}, the reward and the done logit.

    logit_pi: (B, T, K); mean, log_std: (B, T, K, obs_dim), means of obs_{t+1} itself (not of the change);
    reward: (B, T); done_logit: (B, T).
    """

    logit_pi: torch.Tensor
    mean: torch.Tensor
    log_std: torch.Tensor
    reward: torch.Tensor
    done_logit: torch.Tensor

    def nll(self, target: torch.Tensor) -> torch.Tensor:
        """Negative log-likelihood of ``target`` (B, T, obs_dim) per dimension, shape (B, T)."""
        log_pi = F.log_softmax(self.logit_pi, dim=-1)
        component = _gaussian_log_prob(target.unsqueeze(-2), self.mean, self.log_std).sum(-1)  # (B, T, K)
        return -torch.logsumexp(log_pi + component, dim=-1) / target.shape[-1]

    def expected(self) -> torch.Tensor:
        """The mixture mean of obs_{t+1}, (B, T, obs_dim)."""
        weights = F.softmax(self.logit_pi, dim=-1).unsqueeze(-1)
        return (weights * self.mean).sum(-2)

    def sample(self, temperature: float, generator: torch.Generator | None = None) -> torch.Tensor:
        """A draw of obs_{t+1} (B, T, obs_dim) at ``temperature``: the component from softmax(logit_pi / tau), its
        Gaussian's standard deviation scaled by sqrt(tau), as in "World Models" (section 4.5)."""
        b, t, k, d = self.mean.shape
        probs = F.softmax(self.logit_pi / temperature, dim=-1).reshape(b * t, k)
        index = torch.multinomial(probs, 1, generator=generator).reshape(b, t, 1, 1).expand(b, t, 1, d)
        mean = self.mean.gather(-2, index).squeeze(-2)
        std = self.log_std.gather(-2, index).squeeze(-2).exp()
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        return mean + std * math.sqrt(temperature) * noise


@dataclass
class AWMOutput:
    """ActionsWorldModel predictions: a diagonal Gaussian over obs_{t+1} (mean, log_std: (B, T, obs_dim)), the
    reward (B, T) and the done logit (B, T)."""

    mean: torch.Tensor
    log_std: torch.Tensor
    reward: torch.Tensor
    done_logit: torch.Tensor

    def nll(self, target: torch.Tensor) -> torch.Tensor:
        """Negative log-likelihood of ``target`` (B, T, obs_dim) per dimension, shape (B, T)."""
        return -_gaussian_log_prob(target, self.mean, self.log_std).mean(-1)

    def expected(self) -> torch.Tensor:
        return self.mean


def _losses(nll: torch.Tensor, reward: torch.Tensor, done_logit: torch.Tensor,
            batch: Rollouts) -> tuple[torch.Tensor, dict[str, float]]:
    nll_term = masked_mean(nll, batch.mask)
    reward_term = masked_mean((reward - batch.rewards) ** 2, batch.mask)
    done_term = masked_mean(F.binary_cross_entropy_with_logits(done_logit, batch.dones, reduction="none"),
                            batch.mask)
    loss = nll_term + reward_term + done_term
    return loss, {"loss": loss.item(), "nll": nll_term.item(), "reward_mse": reward_term.item(),
                  "done_bce": done_term.item()}


def _detach(state):
    if state is None:
        return None
    if isinstance(state, (tuple, list)):
        return type(state)(_detach(s) for s in state)
    return state.detach()


class MDNRNN(nn.Module):
    """M of "World Models" (Ha and Schmidhuber, 2018): LSTM over (obs_t, a_t) with a mixture density head.

    The mixture is over the change obs_{t+1} - obs_t; ``MDNOutput.mean`` holds the component means of obs_{t+1}.
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden_size: int = 64, num_layers: int = 1,
                 num_mixtures: int = 5):
        super().__init__()
        self.obs_dim, self.action_dim, self.num_mixtures = obs_dim, action_dim, num_mixtures
        self.lstm = nn.LSTM(obs_dim + action_dim, hidden_size, num_layers, batch_first=True)
        self.mdn_head = nn.Linear(hidden_size, num_mixtures * (1 + 2 * obs_dim))
        # reward and done of step t from the LSTM's output and obs_{t+1}: an episode ends on a threshold of the state
        # it reaches (CartPole: |x| > 2.4 or |angle| > 12 degrees), which a small MLP of obs_{t+1} draws exactly;
        # read from the hidden state alone, P(done) at terminal steps stayed near the base rate (0.08 against 0.04)
        # and a dream-trained CartPole controller fell within 10 steps
        self.outcome_head = nn.Sequential(nn.Linear(hidden_size + obs_dim, hidden_size), nn.Tanh(),
                                          nn.Linear(hidden_size, 2))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, state=None,
                next_obs: torch.Tensor | None = None) -> tuple[MDNOutput, tuple]:
        """obs: (B, T, obs_dim) = obs_0..obs_{T-1}, actions: (B, T, action_dim) -> predictions for every step.
        Reward and done read ``next_obs`` (obs_1..obs_T; in training, the real ones) or, when it is None, the
        mixture mean the model predicts (in a dream)."""
        hidden, state = self.lstm(torch.cat([obs, actions], dim=-1), state)
        out = self._mixture(hidden, obs)
        self._outcome(out, hidden, out.expected() if next_obs is None else next_obs)
        return out, state

    def _mixture(self, hidden: torch.Tensor, obs: torch.Tensor) -> MDNOutput:
        b, t, _ = hidden.shape
        k, d = self.num_mixtures, self.obs_dim
        params = self.mdn_head(hidden)
        logit_pi = params[..., :k]
        delta = params[..., k:k + k * d].reshape(b, t, k, d)
        log_std = params[..., k + k * d:].reshape(b, t, k, d).clamp(LOG_STD_MIN, LOG_STD_MAX)
        return MDNOutput(logit_pi, obs.unsqueeze(-2) + delta, log_std, hidden.new_zeros(b, t), hidden.new_zeros(b, t))

    def _outcome(self, out: MDNOutput, hidden: torch.Tensor, next_obs: torch.Tensor) -> None:
        out.reward, out.done_logit = self.outcome_head(torch.cat([hidden, next_obs], dim=-1)).unbind(-1)

    def loss(self, batch: Rollouts) -> tuple[torch.Tensor, dict[str, float]]:
        """Teacher-forced: masked mean of NLL(obs_{t+1}) per dimension + reward MSE + done BCE."""
        out, _ = self(batch.obs[:, :-1], batch.actions, next_obs=batch.obs[:, 1:])
        return _losses(out.nll(batch.obs[:, 1:]), out.reward, out.done_logit, batch)

    def predict_next(self, obs: torch.Tensor, action: torch.Tensor, state=None, temperature: float = 0.0,
                     generator: torch.Generator | None = None):
        """One step: obs (B, obs_dim), action (B, action_dim) -> (obs_{t+1}, reward, P(done), state). Feed the
        returned observation back in for an open-loop (dreamed) rollout. ``temperature`` 0: the mixture mean; above
        0: a draw at that temperature (:meth:`MDNOutput.sample`), with reward and done read from the draw."""
        hidden, state = self.lstm(torch.cat([obs, action], dim=-1).unsqueeze(1), state)
        out = self._mixture(hidden, obs.unsqueeze(1))
        nxt = out.expected() if temperature <= 0 else out.sample(temperature, generator)
        self._outcome(out, hidden, nxt)
        return nxt[:, 0], out.reward[:, 0], torch.sigmoid(out.done_logit[:, 0]), state

    def imagine(self, obs0: torch.Tensor, actions: torch.Tensor) -> Imagined:
        """Open loop from obs0 (B, obs_dim) under actions (B, T, action_dim), feeding back its own predictions."""
        obs, state, preds, rewards, dones = obs0, None, [], [], []
        for t in range(actions.shape[1]):
            obs, reward, done, state = self.predict_next(obs, actions[:, t], state)
            preds.append(obs)
            rewards.append(reward)
            dones.append(done)
        return Imagined(torch.stack(preds, 1), torch.stack(rewards, 1), torch.stack(dones, 1))

    @staticmethod
    def detach_state(state):
        return _detach(state)


class ActionsWorldModel(nn.Module):
    """The Actions World Model of Ma et al. (ICML 2024): predictions from obs_0 and the actions alone.

    The recurrent state is (h, c, obs0): the LSTM state and the initial observation the predictions are offsets of.
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden_size: int = 64, num_layers: int = 1):
        super().__init__()
        self.obs_dim, self.action_dim = obs_dim, action_dim
        self.hidden_size, self.num_layers = hidden_size, num_layers
        self.encoder = nn.Sequential(nn.Linear(obs_dim, hidden_size), nn.Tanh(),
                                     nn.Linear(hidden_size, 2 * num_layers * hidden_size))
        self.lstm = nn.LSTM(action_dim, hidden_size, num_layers, batch_first=True)
        self.obs_head = nn.Linear(hidden_size, 2 * obs_dim)
        self.reward_head = nn.Linear(hidden_size, 1)
        self.done_head = nn.Linear(hidden_size, 1)

    def initial_state(self, obs0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """obs0 (B, obs_dim) -> (h0, c0, obs0), with h0, c0: (num_layers, B, hidden_size)."""
        b = obs0.shape[0]
        code = self.encoder(obs0).reshape(b, 2, self.num_layers, self.hidden_size).permute(1, 2, 0, 3)
        return torch.tanh(code[0]).contiguous(), code[1].contiguous(), obs0

    def _heads(self, hidden: torch.Tensor, obs0: torch.Tensor) -> AWMOutput:
        offset, log_std = self.obs_head(hidden).chunk(2, dim=-1)
        return AWMOutput(obs0.unsqueeze(1) + offset, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX),
                         self.reward_head(hidden).squeeze(-1), self.done_head(hidden).squeeze(-1))

    def forward(self, obs0: torch.Tensor, actions: torch.Tensor) -> AWMOutput:
        """obs0: (B, obs_dim), actions: (B, T, action_dim) -> predictions of obs_1..obs_T, r_0..r_{T-1}, dones."""
        h, c, _ = self.initial_state(obs0)
        hidden, _ = self.lstm(actions, (h, c))
        return self._heads(hidden, obs0)

    def loss(self, batch: Rollouts) -> tuple[torch.Tensor, dict[str, float]]:
        """Masked mean of NLL(obs_{t+1}) per dimension + reward MSE + done BCE, from obs_0 and the actions only."""
        out = self(batch.obs[:, 0], batch.actions)
        return _losses(out.nll(batch.obs[:, 1:]), out.reward, out.done_logit, batch)

    def predict_next(self, obs: torch.Tensor, action: torch.Tensor, state=None, temperature: float = 0.0,
                     generator: torch.Generator | None = None):
        """One step, the same interface as ``MDNRNN.predict_next``. ``obs`` is read only when ``state`` is None
        (it is then obs_0 and starts the rollout); afterwards the model goes by the actions alone, so a draw at
        ``temperature`` > 0 changes only what the caller sees (its standard deviation scaled by sqrt(tau))."""
        if state is None:
            state = self.initial_state(obs)
        h, c, obs0 = state
        hidden, (h, c) = self.lstm(action.unsqueeze(1), (h, c))
        out = self._heads(hidden, obs0)
        nxt = out.mean[:, 0]
        if temperature > 0:
            noise = torch.randn(nxt.shape, generator=generator, device=nxt.device, dtype=nxt.dtype)
            nxt = nxt + out.log_std[:, 0].exp() * math.sqrt(temperature) * noise
        return nxt, out.reward[:, 0], torch.sigmoid(out.done_logit[:, 0]), (h, c, obs0)

    def imagine(self, obs0: torch.Tensor, actions: torch.Tensor) -> Imagined:
        """Predicted obs_1..obs_T, rewards and P(done) under ``actions``; differentiable w.r.t. the actions, so a
        controller can be improved by gradient ascent on the predicted return."""
        out = self(obs0, actions)
        return Imagined(out.mean, out.reward, torch.sigmoid(out.done_logit))

    @staticmethod
    def detach_state(state):
        return _detach(state)


def build_world_model(kind: str, obs_dim: int, action_dim: int, hidden_size: int = 64, num_layers: int = 1,
                      num_mixtures: int = 5) -> nn.Module:
    """``kind`` is "mdn_rnn" (Ha and Schmidhuber, 2018) or "actions_wm" (Ma et al., 2024)."""
    if kind == "mdn_rnn":
        return MDNRNN(obs_dim, action_dim, hidden_size, num_layers, num_mixtures)
    if kind == "actions_wm":
        return ActionsWorldModel(obs_dim, action_dim, hidden_size, num_layers)
    raise ValueError(f"world model kind: expected one of {', '.join(WORLD_MODEL_KINDS)}, got {kind!r}")

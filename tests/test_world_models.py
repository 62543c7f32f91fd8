"""World models: rollout collection, the MDN-RNN and the Actions World Model, their evaluation, and a controller
trained in the dream. Everything is tiny and seeded so the file runs in seconds on two CPU cores."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cotrain.tasks.controller import LinearPolicy, evaluate_policy, train_controller_in_dream
from cotrain.data.rollouts import ENVS, EnvSpec, Rollouts, collect_rollouts, env_spec
from cotrain.models.world import ActionsWorldModel, MDNRNN, build_world_model
from cotrain.tasks.world import evaluate_world_model



@pytest.fixture(scope="module")
def pendulum() -> Rollouts:
    return collect_rollouts("Pendulum-v1", episodes=16, horizon=30, seed=0)


def _train(kind: str, data: Rollouts, steps: int = 150, seed: int = 0):
    torch.manual_seed(seed)
    model = build_world_model(kind, obs_dim=3, action_dim=1, hidden_size=32, num_layers=1, num_mixtures=3)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    while len(losses) < steps:
        for batch in data.batches(8, generator):
            loss, info = model.loss(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(info)
    return model, losses


@pytest.fixture(scope="module")
def trained(pendulum):
    return {kind: _train(kind, pendulum) for kind in ("mdn_rnn", "actions_wm")}


# ---------------------------------------------------------------------------------------------------- rollouts


def test_env_specs():
    assert env_spec("Pendulum-v1") == EnvSpec(obs_dim=3, action_dim=1, discrete=False)
    assert env_spec("CartPole-v1") == EnvSpec(obs_dim=4, action_dim=2, discrete=True)
    assert env_spec("Acrobot-v1") == EnvSpec(obs_dim=6, action_dim=3, discrete=True)
    assert set(ENVS) == {"Pendulum-v1", "CartPole-v1", "Acrobot-v1"}
    with pytest.raises(ValueError, match="env.id"):
        env_spec("MountainCar-v0")
    with pytest.raises(ValueError, match="env.id"):
        collect_rollouts("NoSuchEnv-v0", 1, 5, 0)


@pytest.mark.parametrize("env_id", ENVS)
def test_rollout_shapes(env_id):
    spec = env_spec(env_id)
    data = collect_rollouts(env_id, episodes=3, horizon=12, seed=1)
    assert len(data) == 3
    assert data.obs.shape == (3, 13, spec.obs_dim)
    assert data.actions.shape == (3, 12, spec.action_dim)
    for name in ("rewards", "dones", "mask"):
        assert getattr(data, name).shape == (3, 12)
    for tensor in (data.obs, data.actions, data.rewards, data.dones, data.mask):
        assert tensor.dtype == torch.float32
    if spec.discrete:  # one-hot
        assert torch.all(data.actions.sum(-1) == data.mask)
    else:
        assert data.actions.abs().max() <= 2.0


def test_cartpole_termination_is_masked_and_padded():
    data = collect_rollouts("CartPole-v1", episodes=6, horizon=80, seed=3)
    ended = data.dones.sum(1)
    assert ended.max() == 1.0 and ended.sum() >= 1  # random CartPole falls well before 80 steps
    for i in range(len(data)):
        if ended[i] == 0:
            assert torch.all(data.mask[i] == 1.0)
            continue
        t = int(data.dones[i].argmax())
        assert torch.all(data.mask[i, :t + 1] == 1.0) and torch.all(data.mask[i, t + 1:] == 0.0)
        assert torch.all(data.rewards[i, t + 1:] == 0.0) and torch.all(data.actions[i, t + 1:] == 0.0)
        assert torch.all(data.dones[i, t + 1:] == 0.0)
        assert torch.all(data.obs[i, t + 2:] == data.obs[i, t + 1])  # the last observation, repeated


def test_same_seed_same_rollouts_different_seed_different():
    a = collect_rollouts("Pendulum-v1", 2, 10, seed=7)
    b = collect_rollouts("Pendulum-v1", 2, 10, seed=7)
    c = collect_rollouts("Pendulum-v1", 2, 10, seed=8)
    for name in ("obs", "actions", "rewards", "dones", "mask"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert not torch.equal(a.obs, c.obs) and not torch.equal(a.actions, c.actions)
    assert not torch.equal(a.obs[0], a.obs[1])  # episodes differ from one another too


def test_rollouts_with_a_policy():
    data = collect_rollouts("CartPole-v1", 2, 10, seed=0, policy=lambda obs: 1)
    valid = data.mask.bool()
    assert torch.all(data.actions[valid] == torch.tensor([0.0, 1.0]))
    data = collect_rollouts("Pendulum-v1", 1, 5, seed=0, policy=lambda obs: np.array([5.0]))
    assert torch.all(data.actions == 2.0)  # clipped to the action bounds


def test_split_and_batches(pendulum):
    train, held = pendulum.split(0.25)
    assert (len(train), len(held)) == (12, 4)
    assert torch.equal(held.obs, pendulum.obs[12:])
    again, _ = pendulum.split(0.25)
    assert torch.equal(train.obs, again.obs)
    seen = []
    for batch in train.batches(5, torch.Generator().manual_seed(0)):
        assert isinstance(batch, Rollouts) and len(batch) <= 5
        seen.extend(batch.obs[:, 0, 0].tolist())
    assert sorted(seen) == sorted(train.obs[:, 0, 0].tolist())
    first = [b.obs for b in train.batches(5, torch.Generator().manual_seed(1))]
    second = [b.obs for b in train.batches(5, torch.Generator().manual_seed(1))]
    assert all(torch.equal(x, y) for x, y in zip(first, second))
    assert train.to("cpu").obs.device.type == "cpu"


# ------------------------------------------------------------------------------------------------------ models


def test_mdnrnn_shapes():
    torch.manual_seed(0)
    model = MDNRNN(obs_dim=4, action_dim=2, hidden_size=16, num_layers=2, num_mixtures=3)
    obs, actions = torch.randn(5, 7, 4), torch.randn(5, 7, 2)
    out, state = model(obs, actions)
    assert out.logit_pi.shape == (5, 7, 3)
    assert out.mean.shape == out.log_std.shape == (5, 7, 3, 4)
    assert out.reward.shape == out.done_logit.shape == (5, 7)
    assert out.expected().shape == (5, 7, 4) and out.nll(obs).shape == (5, 7)
    assert state[0].shape == (2, 5, 16)
    nxt, reward, done, state = model.predict_next(obs[:, 0], actions[:, 0], MDNRNN.detach_state(state))
    assert nxt.shape == (5, 4) and reward.shape == done.shape == (5,)
    assert torch.all((done >= 0) & (done <= 1))
    assert model.imagine(obs[:, 0], actions).obs.shape == (5, 7, 4)


def test_mdnrnn_reward_and_done_read_the_next_observation():
    torch.manual_seed(0)
    model = MDNRNN(obs_dim=4, action_dim=2, hidden_size=16, num_mixtures=3)
    obs, actions, nxt = torch.randn(2, 5, 4), torch.randn(2, 5, 2), torch.randn(2, 5, 4)
    real, _ = model(obs, actions, next_obs=nxt)
    moved, _ = model(obs, actions, next_obs=nxt + 1.0)
    dreamed, _ = model(obs, actions)  # no next observation: the mixture mean stands in for it
    assert torch.equal(real.mean, moved.mean) and torch.equal(real.logit_pi, moved.logit_pi)
    assert not torch.allclose(real.done_logit, moved.done_logit) and not torch.allclose(real.reward, moved.reward)
    mean_read, _ = model(obs, actions, next_obs=dreamed.expected())
    assert torch.allclose(dreamed.done_logit, mean_read.done_logit)


def test_mdnrnn_dreams_draws_at_a_temperature():
    torch.manual_seed(0)
    model = MDNRNN(obs_dim=3, action_dim=1, hidden_size=16, num_mixtures=3)
    obs, action = torch.randn(64, 3), torch.randn(64, 1)
    mean, *_ = model.predict_next(obs, action)
    draw = lambda t, s: model.predict_next(obs, action, None, t, torch.Generator().manual_seed(s))[0]  # noqa: E731
    assert torch.equal(draw(1.0, 5), draw(1.0, 5)) and not torch.equal(draw(1.0, 5), draw(1.0, 6))
    out, _ = model(obs.unsqueeze(1), action.unsqueeze(1))
    spread = lambda t: (draw(t, 1) - mean).pow(2).mean()  # noqa: E731
    assert spread(0.01) < spread(1.0)  # a colder dream stays nearer the mixture's modes
    samples = torch.stack([out.sample(1.0, torch.Generator().manual_seed(i)) for i in range(400)])
    assert torch.allclose(samples.mean(0), out.expected(), atol=0.35)  # draws average to the mixture mean


def test_mdnrnn_learns_where_cartpole_episodes_end():
    torch.manual_seed(0)
    data = collect_rollouts("CartPole-v1", 96, 40, seed=3)
    model = MDNRNN(obs_dim=4, action_dim=2, hidden_size=32, num_mixtures=3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(160):
        for batch in data.batches(16, generator):
            loss, _ = model.loss(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    test = collect_rollouts("CartPole-v1", 48, 40, seed=4)
    with torch.no_grad():
        out, _ = model(test.obs[:, :-1], test.actions)  # as in a dream: done read from the predicted next state
    p_done = torch.sigmoid(out.done_logit)
    ended, running = test.dones.bool(), test.mask.bool() & ~test.dones.bool()
    # about 5% of the steps end an episode: the model tells them apart (a done head on the hidden state alone gave
    # 0.08 at the ends against 0.04 elsewhere after 3000 steps)
    assert p_done[ended].mean() > 0.4 and p_done[running].mean() < 0.1, (p_done[ended].mean(), p_done[running].mean())


def test_actions_world_model_shapes():
    torch.manual_seed(0)
    model = ActionsWorldModel(obs_dim=4, action_dim=2, hidden_size=16, num_layers=2)
    out = model(torch.randn(5, 4), torch.randn(5, 7, 2))
    assert out.mean.shape == out.log_std.shape == (5, 7, 4)
    assert out.reward.shape == out.done_logit.shape == (5, 7)
    imagined = model.imagine(torch.randn(5, 4), torch.randn(5, 7, 2))
    assert imagined.obs.shape == (5, 7, 4) and imagined.rewards.shape == imagined.done_probs.shape == (5, 7)


def test_actions_world_model_reads_only_obs0_and_actions(pendulum):
    torch.manual_seed(0)
    model = ActionsWorldModel(obs_dim=3, action_dim=1, hidden_size=16)
    batch = pendulum.select(slice(0, 4))
    base = model(batch.obs[:, 0], batch.actions)

    # its loss depends on obs_t (t > 0) only as targets: no gradient flows into the predictions from them
    obs = batch.obs.clone().requires_grad_(True)
    out = model(obs[:, 0], batch.actions)
    (out.mean.sum() + out.reward.sum()).backward()
    assert obs.grad[:, 1:].abs().sum() == 0 and obs.grad[:, 0].abs().sum() > 0

    # step by step: the observations passed after the first step are ignored
    state, steps = None, []
    for t in range(batch.horizon):
        noise = torch.randn_like(batch.obs[:, t]) * (t > 0)
        nxt, reward, _, state = model.predict_next(batch.obs[:, t] + noise, batch.actions[:, t], state)
        steps.append(nxt)
    assert torch.allclose(torch.stack(steps, 1), base.mean, atol=1e-5)

    changed_obs0 = model(batch.obs[:, 0] + 0.5, batch.actions)
    changed_actions = model(batch.obs[:, 0], batch.actions.flip(1))
    assert not torch.allclose(changed_obs0.mean, base.mean)
    assert not torch.allclose(changed_actions.mean, base.mean)
    assert not torch.allclose(changed_actions.reward, base.reward)


def test_actions_world_model_reward_has_gradient_to_first_action(pendulum):
    torch.manual_seed(0)
    model = ActionsWorldModel(obs_dim=3, action_dim=1, hidden_size=16)
    actions = pendulum.actions[:2, :10].clone().requires_grad_(True)
    imagined = model.imagine(pendulum.obs[:2, 0], actions)
    for t in (1, 5, 9):
        (grad,) = torch.autograd.grad(imagined.rewards[:, t].sum(), actions, retain_graph=True)
        assert grad[:, 0].abs().sum() > 0  # reward at step t reaches back to the action at step 0
        assert grad[:, t + 1:].abs().sum() == 0  # and not forward to later actions


def test_build_world_model():
    assert isinstance(build_world_model("mdn_rnn", 3, 1, 8, 1, 2), MDNRNN)
    assert isinstance(build_world_model("actions_wm", 3, 1, 8, 1, 2), ActionsWorldModel)
    with pytest.raises(ValueError, match="mdn_rnn"):
        build_world_model("vae", 3, 1, 8, 1, 2)


@pytest.mark.parametrize("kind", ["mdn_rnn", "actions_wm"])
def test_loss_falls_on_pendulum(trained, kind):
    _, history = trained[kind]
    assert all(math.isfinite(v) for info in history for v in info.values())
    for term in ("loss", "nll", "reward_mse"):
        start = np.mean([info[term] for info in history[:5]])
        end = np.mean([info[term] for info in history[-5:]])
        assert end < start - 0.25 * abs(start), (term, start, end)


@pytest.mark.parametrize("kind", ["mdn_rnn", "actions_wm"])
def test_evaluate_world_model(trained, pendulum, kind):
    model, _ = trained[kind]
    metrics = evaluate_world_model(model, pendulum)
    keys = {"nll", "mse", "copy_mse", "normalized_mse", "open_loop_mse_1", "open_loop_mse_5", "open_loop_mse_10",
            "reward_mae"}
    assert set(metrics) == keys
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["copy_mse"] > 0
    assert metrics["normalized_mse"] == pytest.approx(metrics["mse"] / metrics["copy_mse"])
    assert model.training  # evaluation leaves the mode as it found it
    short = evaluate_world_model(model, pendulum.select(slice(0, 2)))
    assert math.isfinite(short["open_loop_mse_1"])


def test_evaluate_world_model_masks_cartpole_padding():
    torch.manual_seed(0)
    data = collect_rollouts("CartPole-v1", 4, 40, seed=0)
    assert data.mask.min() == 0.0
    model = MDNRNN(4, 2, hidden_size=8, num_mixtures=2)
    metrics = evaluate_world_model(model, data)
    assert all(math.isfinite(v) for v in metrics.values())
    short = evaluate_world_model(model, collect_rollouts("CartPole-v1", 2, 3, seed=0))
    assert math.isnan(short["open_loop_mse_5"]) and math.isfinite(short["open_loop_mse_1"])


# -------------------------------------------------------------------------------------------------- controller


def test_linear_policy():
    policy = LinearPolicy.for_env("Pendulum-v1")
    params = np.arange(policy.num_params, dtype=np.float64) - 1.0
    policy.set_params(params)
    assert np.allclose(policy.get_params(), params)
    action = policy(np.array([1.0, 0.0, 8.0], dtype=np.float32))
    assert action.shape == (1,) and -2.0 <= action[0] <= 2.0
    discrete = LinearPolicy.for_env("CartPole-v1")
    discrete.set_params(np.r_[np.zeros(8), -1.0, 1.0])
    assert discrete(np.zeros(4)) == 1
    assert torch.equal(discrete.act(torch.zeros(3, 4)), torch.tensor([[0.0, 1.0]] * 3))
    with pytest.raises(ValueError):
        policy.set_params(np.zeros(3))


@pytest.mark.parametrize("kind", ["mdn_rnn", "actions_wm"])
def test_dream_controller_smoke(trained, pendulum, kind):
    model, _ = trained[kind]
    policy, history = train_controller_in_dream(model, "Pendulum-v1", pendulum.obs[:8, 0], horizon=10,
                                                iterations=3, popsize=6, seed=0)
    assert isinstance(policy, LinearPolicy) and len(history) == 3
    assert all(math.isfinite(h["best"]) and h["best"] >= h["mean"] for h in history)
    again, _ = train_controller_in_dream(model, "Pendulum-v1", pendulum.obs[:8, 0], horizon=10, iterations=3,
                                         popsize=6, seed=0)
    assert np.allclose(policy.get_params(), again.get_params())  # seeded
    assert math.isfinite(evaluate_policy(policy, "Pendulum-v1", episodes=2, seed=0, horizon=20))
    assert math.isfinite(evaluate_policy(None, "Pendulum-v1", episodes=2, seed=0, horizon=20))


def test_dream_controller_discrete():
    torch.manual_seed(0)
    data = collect_rollouts("CartPole-v1", 4, 20, seed=0)
    model = ActionsWorldModel(4, 2, hidden_size=8)
    policy, history = train_controller_in_dream(model, "CartPole-v1", data.obs[:, 0], horizon=8, iterations=2,
                                                popsize=4, seed=1)
    assert len(history) == 2
    returned = evaluate_policy(policy, "CartPole-v1", episodes=2, seed=0, horizon=20)
    assert 1.0 <= returned <= 20.0

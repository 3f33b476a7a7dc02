"""DQN pieces on hand-computed numbers: double-Q targets, weighted Huber loss, epsilons."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from walle_ray.algos.dqn.config import APEXConfig, DQNConfig
from walle_ray.algos.dqn.explorer import sampler_epsilon
from walle_ray.algos.dqn.loss import dqn_loss, q_targets
from walle_ray.algos.dqn.update import DQNUpdate
from walle_ray.algos.spec import check_discrete
from walle_ray.batch import ReplayBatch
from walle_ray.config import ConfigError
from walle_ray.learners.collective import Collective
from walle_ray.models.q_network import QNetwork


def test_double_q_target_uses_online_argmax_and_target_values():
    reward = torch.tensor([1.0, 0.5, 2.0])
    discount = torch.tensor([0.9, 0.0, 0.81])  # row 1 terminated
    next_target = torch.tensor([[1.0, 5.0], [3.0, 4.0], [2.0, -1.0]])
    next_online = torch.tensor([[2.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
    double = q_targets(reward, discount, next_target, next_online)
    # online argmax: 0, 1, 1 -> target values 1, 4, -1
    torch.testing.assert_close(double, torch.tensor([1 + 0.9 * 1.0, 0.5, 2 + 0.81 * -1.0]))
    plain = q_targets(reward, discount, next_target, None)  # max of the target net
    torch.testing.assert_close(plain, torch.tensor([1 + 0.9 * 5.0, 0.5, 2 + 0.81 * 2.0]))


def test_weighted_huber_loss_and_td_errors():
    q = torch.tensor([[1.0, 2.0], [0.0, -1.0]], requires_grad=True)
    action = torch.tensor([1, 0])
    target = torch.tensor([2.5, 3.0])
    weight = torch.tensor([1.0, 0.5])
    loss, td = dqn_loss(q, action, target, weight, huber_delta=1.0)
    # td 0.5 -> 0.5 * 0.5^2 = 0.125; td 3.0 -> 1 * (3 - 0.5) = 2.5, weighted 1.25
    assert loss.item() == pytest.approx((0.125 + 1.25) / 2)
    torch.testing.assert_close(td, torch.tensor([0.5, 3.0]))
    loss.backward()
    torch.testing.assert_close(q.grad, torch.tensor([[0.0, -0.25], [-0.25, 0.0]]))


def test_dueling_head_centres_advantages():
    net = QNetwork(gym.spaces.Box(-1, 1, (3,)), 4, [16], "relu", dueling=True)
    obs = torch.randn(5, 3)
    q = net(obs)
    h = torch.relu(net.torso(obs))
    torch.testing.assert_close(q.mean(-1), net.value(h).squeeze(-1))


def test_apex_epsilons_and_annealing():
    apex = APEXConfig()
    eps = [sampler_epsilon(apex, i, 8, 0) for i in range(8)]
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4 ** 8)
    assert eps == sorted(eps, reverse=True)
    dqn = DQNConfig(epsilon_start=1.0, epsilon_final=0.1, epsilon_anneal_steps=1000)
    assert sampler_epsilon(dqn, 0, 1, 0) == 1.0
    assert sampler_epsilon(dqn, 0, 1, 500) == pytest.approx(0.55)
    assert sampler_epsilon(dqn, 3, 4, 10**6) == pytest.approx(0.1)


def test_update_moves_q_toward_targets_and_returns_priorities():
    torch.manual_seed(0)
    cfg = OmegaConf.structured(DQNConfig(hidden=[32], lr=1e-2, target_update_every=1000))
    net = QNetwork(gym.spaces.Box(-1, 1, (2,)), 2, [32], "relu", True)
    update = DQNUpdate(cfg, net, Collective(), torch.device("cpu"))
    n = 16
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(n, 2)).astype(np.float32)
    batch = ReplayBatch(obs=obs, action=rng.integers(2, size=n), reward=np.ones(n, np.float32),
                        discount=np.zeros(n, np.float32), next_obs=obs, priority=np.ones(n, np.float32),
                        version_b=np.zeros(n, np.int64), weight=np.ones(n, np.float32),
                        index=np.arange(n))
    first = update.update([batch], 0)
    feedback = update.memory_feedback()
    for _ in range(200):
        last = update.update([batch], 0)
    assert feedback.priority.shape == (n,) and feedback.priority.dtype == np.float32
    np.testing.assert_array_equal(feedback.index, batch.index)
    assert update.memory_feedback() is not None and update.memory_feedback() is None  # once
    assert last["td_error_mean"] < 0.1 * first["td_error_mean"]
    assert last["q_mean"] == pytest.approx(1.0, abs=0.1)


def test_continuous_actions_are_refused_with_the_space_named():
    with pytest.raises(ConfigError, match=r"DQN needs a discrete action space.*Box"):
        check_discrete("DQN")(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (6,)))


def q_batch(n: int = 12, seed: int = 0) -> ReplayBatch:
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 2)).astype(np.float32)
    return ReplayBatch(obs=obs, action=rng.integers(3, size=n), reward=rng.normal(size=n).astype(np.float32),
                       discount=np.where(np.arange(n) % 4 == 0, 0.0, 0.9 ** 3).astype(np.float32),
                       next_obs=rng.normal(size=(n, 2)).astype(np.float32),
                       priority=np.ones(n, np.float32), version_b=np.zeros(n, np.int64),
                       weight=np.ones(n, np.float32), index=np.arange(n))


def q_update(**settings) -> DQNUpdate:
    torch.manual_seed(0)
    cfg = OmegaConf.structured(DQNConfig(hidden=[16], lr=1e-2, **settings))
    net = QNetwork(gym.spaces.Box(-1, 1, (2,)), 3, [16], "relu", True)
    return DQNUpdate(cfg, net, Collective(), torch.device("cpu"))


def perturb(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p))


@pytest.mark.parametrize("double_q", [True, False])
def test_targets_bootstrap_from_the_target_network(double_q):
    """With discount > 0 and a target network unlike the online one: the online network
    picks the next action (double Q) or the target network does, and the target network
    values it; a terminal transition takes its reward alone."""
    update = q_update(double_q=double_q, target_update_every=1000)
    update.update([q_batch(seed=1)], 0)  # the first update starts the target from the online net
    perturb(update.target)
    b = q_batch()
    with torch.no_grad():
        next_obs = torch.from_numpy(b.next_obs)
        q_target, q_online = update.target(next_obs), update.model(next_obs)
    chooser = q_online if double_q else q_target
    best = chooser.argmax(-1)
    assert not torch.equal(q_online.argmax(-1), q_target.argmax(-1))  # the choice matters here
    want = b.reward + b.discount * q_target.gather(-1, best[:, None])[:, 0].numpy()
    out = update.update([b], 0)
    assert out["target_mean"] == pytest.approx(float(want.mean()), rel=1e-5)


def test_hard_target_copies_follow_the_schedule():
    update = q_update(target_update_every=3)
    update.update([q_batch()], 0)
    perturb(update.target)
    stale = [p.clone() for p in update.target.parameters()]
    update.update([q_batch(seed=2)], 0)  # update 2 of 3: the target stays
    assert all(torch.equal(p, s) for p, s in zip(update.target.parameters(), stale))
    update.update([q_batch(seed=3)], 0)  # update 3: copied
    assert all(torch.equal(t, p) for t, p in zip(update.target.parameters(), update.model.parameters()))


def test_polyak_targets_move_tau_towards_the_online_network():
    update = q_update(tau=0.25)
    update.update([q_batch()], 0)
    perturb(update.target)
    old = [p.clone() for p in update.target.parameters()]
    update.update([q_batch(seed=2)], 0)
    for t, o, p in zip(update.target.parameters(), old, update.model.parameters()):
        torch.testing.assert_close(t, o + 0.25 * (p - o))


def test_a_skipped_step_sends_no_priorities():
    update = q_update(prioritized=True)
    bad = q_batch()
    bad.reward[3] = np.inf  # a diverged target: the loss is not finite and the step is skipped
    update.update([bad], 0)
    assert update.guard.skipped == 1 and update.memory_feedback() is None
    update.update([q_batch()], 0)
    assert update.memory_feedback() is not None


@pytest.mark.parametrize("algo", ["dqn", "apex", "ddpg", "td3"])
@pytest.mark.parametrize("key", ["normalize_obs", "normalize_reward"])
def test_replay_algorithms_refuse_normalisation_they_would_ignore(algo, key):
    from walle_ray.algos import validate

    from conftest import make_cfg

    env = "pendulum" if algo in ("ddpg", "td3") else "cartpole"
    with pytest.raises(ConfigError, match=rf"^env\.{key}: {algo} learns from raw observations"):
        validate(make_cfg(f"algo={algo}", f"env={env}", f"env.{key}=true"))

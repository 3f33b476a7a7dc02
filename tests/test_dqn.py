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
    for _ in range(200):
        last = update.update([batch], 0)
    assert first["priorities"].shape == (n,) and first["priorities"].dtype == np.float32
    assert last["td_error_mean"] < 0.1 * first["td_error_mean"]
    assert last["q_mean"] == pytest.approx(1.0, abs=0.1)


def test_continuous_actions_are_refused_with_the_space_named():
    with pytest.raises(ConfigError, match=r"DQN needs a discrete action space.*Box"):
        check_discrete("DQN")(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (6,)))

"""DDPG / TD3: losses on hand-worked batches, the network, the update rule and the explorer."""

from __future__ import annotations

import copy
from dataclasses import replace
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from walle_ray.algos.ddpg import DDPG, TD3, validate
from walle_ray.algos.ddpg.config import APEXDDPGConfig, DDPGConfig, TD3Config
from walle_ray.algos.ddpg.explorer import DDPGExplorer
from walle_ray.algos.ddpg.loss import (actor_loss, critic_loss, critic_targets,
                                       smooth_target_action, twin_critic_targets)
from walle_ray.algos.ddpg.update import DDPGUpdate
from walle_ray.learners.targets import polyak_update
from walle_ray.batch import ReplayBatch
from walle_ray.config import ConfigError, EnvConfig, ModelConfig
from walle_ray.learners.collective import Collective
from walle_ray.models.factory import make_deterministic_model

# Batches arrive as read-only views of the object store, as on a learner.
pytestmark = pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")

OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACT = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 4.0], np.float32))


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def make_cfg(algo) -> SimpleNamespace:
    return SimpleNamespace(algo=replace(algo, hidden=[16, 16]), model=ModelConfig(), env=EnvConfig())


def make_batch(n: int = 8, seed: int = 0) -> ReplayBatch:
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n, 3)).astype(np.float32)
    obs.flags.writeable = False
    return ReplayBatch(obs=obs, action=rng.uniform(ACT.low, ACT.high, (n, 2)).astype(np.float32),
                       reward=rng.standard_normal(n).astype(np.float32),
                       discount=np.where(np.arange(n) % 3 == 0, 0.0, 0.99).astype(np.float32),
                       next_obs=rng.standard_normal((n, 3)).astype(np.float32),
                       priority=np.ones(n, np.float32), version_b=np.zeros(n, np.int64),
                       weight=np.ones(n, np.float32), index=np.arange(n))


def make_update(algo) -> DDPGUpdate:
    torch.manual_seed(0)
    cfg = make_cfg(algo)
    return DDPGUpdate(cfg.algo, make_deterministic_model(OBS, ACT, cfg), Collective(),
                      torch.device("cpu"))


# Losses, by hand.

def test_critic_targets_bootstrap_unless_terminal():
    # 1 + 0.9 * 10 = 10; a terminal (discount 0) keeps only the reward.
    assert torch.allclose(critic_targets(t(1, 2), t(0.9, 0), t(10, 5)), t(10, 2))


def test_twin_targets_take_the_smaller_critic():
    # min(3, 2) = 2 -> 0 + 0.5 * 2 = 1; min(1, 4) = 1 -> 1 + 1 * 1 = 2.
    assert torch.allclose(twin_critic_targets(t(0, 1), t(0.5, 1), t(3, 1), t(2, 4)), t(1, 2))


def test_target_smoothing_clips_the_noise_then_the_action():
    action = torch.tensor([[0.9, 0.0], [-0.5, 3.0]])
    noise = torch.tensor([[0.3, 0.1], [-0.8, 2.0]])
    out = smooth_target_action(action, noise, t(0.5, 1.0), t(-1, 0), t(1, 4))
    # 0.9 + 0.3 = 1.2 -> 1; 0 + 0.1; -0.5 - 0.5 (noise clipped) = -1; 3 + 1 (clipped) = 4.
    assert torch.allclose(out, torch.tensor([[1.0, 0.1], [-1.0, 4.0]]))


def test_critic_loss_is_importance_weighted_and_returns_td_errors():
    q = t(1, 2).requires_grad_()
    target = t(2, 0).requires_grad_()
    loss, td = critic_loss(q, target, t(1, 0.5))
    assert torch.allclose(td, t(1, -2))
    assert loss.item() == pytest.approx((1 * 1 + 0.5 * 4) / 2)
    loss.backward()
    assert torch.allclose(q.grad, t(-1.0, 1.0))  # d/dq mean(w (y - q)^2) = -2 w (y - q) / 2
    assert target.grad is None  # targets are constants
    assert not td.requires_grad


def test_actor_loss_ascends_q():
    assert actor_loss(t(1, 3)).item() == -2.0


# The network.

def test_actor_respects_asymmetric_bounds():
    model = make_deterministic_model(OBS, ACT, make_cfg(DDPGConfig()))
    action = model.act(torch.randn(64, 3) * 1e4)
    assert action.shape == (64, 2)
    assert (action >= torch.from_numpy(ACT.low)).all() and (action <= torch.from_numpy(ACT.high)).all()


def test_twin_critics_and_weights_round_trip():
    cfg = make_cfg(TD3Config())
    model, other = (make_deterministic_model(OBS, ACT, cfg) for _ in range(2))
    obs, action = torch.randn(5, 3), torch.rand(5, 2)
    q1, q2 = model.q_both(obs, action)
    assert q1.shape == (5,) and torch.allclose(model.q(obs, action), q1)
    assert torch.allclose(model.q_min(obs, action), torch.minimum(q1, q2))
    assert "action_scale" in model.get_weights()  # bounds travel with the weights
    other.set_weights(model.get_weights())
    assert torch.equal(other.act(obs), model.act(obs))


def test_spaces_check_names_the_space():
    with pytest.raises(ConfigError, match=r"TD3 needs a continuous action space.*Discrete\(4\)"):
        TD3.check_spaces(OBS, gym.spaces.Discrete(4))
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    with pytest.raises(ConfigError, match="DDPG needs float vector observations"):
        DDPG.check_spaces(frames, ACT)
    TD3.check_spaces(OBS, ACT)


# The update rule.

def test_polyak_update_moves_tau_of_the_way():
    target, online = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    torch.nn.init.zeros_(target.weight)
    torch.nn.init.ones_(online.weight)
    polyak_update(target, online, 0.1)
    assert torch.allclose(target.weight, torch.full((1, 2), 0.1))


def flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()]).clone()


def test_td3_steps_the_actor_and_targets_every_second_update():
    upd = make_update(TD3Config(tau=0.5))
    actor, critics, target_actor = flat(upd.model.actor), flat(upd.model.critics), flat(upd.target.actor)
    first = upd.update([make_batch(seed=1)], env_steps=0)
    assert torch.equal(flat(upd.model.actor), actor) and torch.equal(flat(upd.target.actor), target_actor)
    assert not torch.equal(flat(upd.model.critics), critics)
    assert "actor_loss" not in first
    second = upd.update([make_batch(seed=2)], env_steps=0)
    assert not torch.equal(flat(upd.model.actor), actor)
    assert not torch.equal(flat(upd.target.actor), target_actor)
    assert "actor_loss" in second and upd.updates == 2


def test_priorities_are_the_td_errors_the_explorer_computes():
    # Before the first step the targets equal the online net, so with one critic and no
    # target noise the learner's |TD error| is the sampler's initial priority.
    upd = make_update(DDPGConfig(prioritized=True))
    explorer = DDPGExplorer(OBS, ACT, make_cfg(DDPGConfig()), index=0, num_samplers=1, seed=0)
    explorer.set_weights(upd.model.get_weights())
    a, b = make_batch(4, seed=3), make_batch(3, seed=4)
    expected = np.concatenate([explorer.td_error(x.obs, x.action, x.reward, x.discount, x.next_obs)
                               for x in (a, b)])
    out = upd.update([a, b], env_steps=0)
    feedback = upd.memory_feedback()
    assert feedback.priority.dtype == np.float32 and feedback.priority.shape == (7,)
    np.testing.assert_allclose(feedback.priority, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(feedback.index, np.concatenate([a.index, b.index]))
    assert all(isinstance(v, float) for v in out.values())
    uniform = make_update(DDPGConfig())
    uniform.update([a], 0)
    assert uniform.memory_feedback() is None  # uniform replay: none


def test_priorities_are_the_td_errors_of_the_target_networks():
    """|r + discount * Q'(s', mu'(s')) - Q(s, a)| computed from the networks directly, with
    target networks that differ from the online ones."""
    upd = make_update(DDPGConfig(prioritized=True))
    upd.update([make_batch(seed=5)], env_steps=0)  # the targets start from the online nets
    with torch.no_grad():
        for p in upd.target.parameters():
            p.add_(0.3 * torch.randn_like(p))
    b = make_batch(6, seed=6)
    obs, act, next_obs = (torch.from_numpy(x) for x in (b.obs, b.action, b.next_obs))
    with torch.no_grad():
        next_q = upd.target.critics[0](torch.cat([next_obs, upd.target.act(next_obs)], -1))[:, 0]
        q = upd.model.critics[0](torch.cat([obs, act], -1))[:, 0]
    want = np.abs(b.reward + b.discount * next_q.numpy() - q.numpy())
    upd.update([b], env_steps=0)
    np.testing.assert_allclose(upd.memory_feedback().priority, want, rtol=1e-5, atol=1e-6)


def test_a_skipped_critic_step_sends_no_priorities():
    upd = make_update(DDPGConfig(prioritized=True))
    bad = make_batch(seed=7)
    reward = bad.reward.copy()
    reward[2] = np.nan
    upd.update([replace(bad, reward=reward)], env_steps=0)
    assert upd.guard.skipped == 1 and upd.memory_feedback() is None


def test_td3_target_noise_scales_with_each_action_dimensions_half_range(monkeypatch):
    """TD3's target noise and its clip are given for actions in [-1, 1]; for a dimension
    with bounds [low, high] both scale by (high - low) / 2."""
    import walle_ray.algos.ddpg.update as ddpg_update

    seen = {}

    def spy(action, noise, noise_clip, low, high):
        seen.update(noise=noise, noise_clip=noise_clip)
        return smooth_target_action(action, noise, noise_clip, low, high)

    monkeypatch.setattr(ddpg_update, "smooth_target_action", spy)
    monkeypatch.setattr(torch, "randn_like", torch.ones_like)  # unit noise, to read its scale
    upd = make_update(TD3Config(target_noise=0.2, target_noise_clip=0.5))
    upd.update([make_batch(4)], env_steps=0)
    half_range = (ACT.high - ACT.low) / 2  # [1, 2]
    np.testing.assert_allclose(seen["noise"].numpy(), np.tile(0.2 * half_range, (4, 1)), rtol=1e-6)
    np.testing.assert_allclose(seen["noise_clip"].numpy(), 0.5 * half_range, rtol=1e-6)


def test_state_dict_restores_targets_optimizers_and_counter():
    upd = make_update(TD3Config())
    for seed in range(3):
        upd.update([make_batch(seed=seed)], env_steps=0)
    fresh = make_update(TD3Config())
    fresh.model.load_state_dict(upd.model.state_dict())
    fresh.load_state_dict(copy.deepcopy(upd.state_dict()))  # as through a checkpoint file
    assert fresh.updates == 3
    torch.manual_seed(5)
    got = fresh.update([make_batch(seed=9)], env_steps=0)
    torch.manual_seed(5)
    want = upd.update([make_batch(seed=9)], env_steps=0)
    assert got["critic_loss"] == want["critic_loss"] and got["actor_loss"] == want["actor_loss"]


# The explorer.

def test_explorer_acts_at_random_first_then_with_the_noisy_actor():
    cfg = make_cfg(DDPGConfig(random_steps=100, exploration_noise=0.0))
    explorer = DDPGExplorer(OBS, ACT, cfg, index=1, num_samplers=4, seed=0)
    obs = np.random.default_rng(0).standard_normal((512, 3)).astype(np.float32)
    random = explorer.act(obs, env_steps=24)  # each of 4 samplers: 25 random steps
    assert explorer.stats()["random"] == 1.0
    assert random.dtype == np.float32 and random.shape == (512, 2)
    assert (random >= ACT.low).all() and (random <= ACT.high).all()
    assert random[:, 1].std() > 1.0  # uniform on [0, 4]: std 1.15
    greedy = explorer.act(obs, env_steps=25)
    assert explorer.stats()["random"] == 0.0
    np.testing.assert_allclose(greedy, explorer.model.act(torch.from_numpy(obs)).detach().numpy())


def test_greedy_explorer_acts_with_the_plain_actor():
    cfg = make_cfg(DDPGConfig(random_steps=100, exploration_noise=0.5))
    explorer = DDPGExplorer(OBS, ACT, cfg, index=0, num_samplers=1, seed=0, greedy=True)
    obs = np.ones((2, 3), np.float32)
    action = explorer.act(obs, env_steps=0)
    assert action.dtype == np.float32
    np.testing.assert_array_equal(action, explorer.model.act(torch.from_numpy(obs)).detach().numpy())
    assert explorer.stats() == {"noise": 0.0, "random": 0.0}


@pytest.mark.parametrize("exploration", ["gaussian", "ou"])
def test_explorer_noise_stays_in_bounds(exploration: str):
    cfg = make_cfg(DDPGConfig(random_steps=0, exploration=exploration, exploration_noise=2.0))
    explorer = DDPGExplorer(OBS, ACT, cfg, index=0, num_samplers=1, seed=0)
    obs = np.zeros((4, 3), np.float32)
    for step in range(20):
        action = explorer.act(obs, env_steps=step * 4)
        assert action.dtype == np.float32
        assert (action >= ACT.low).all() and (action <= ACT.high).all()
    assert explorer.stats()["noise"] == 2.0


# Settings.

def test_configs_carry_the_papers_settings():
    ddpg, td3, apex = DDPGConfig(), TD3Config(), APEXDDPGConfig()
    assert (ddpg.twin_critics, ddpg.policy_delay, ddpg.target_noise) == (False, 1, 0.0)
    assert (td3.twin_critics, td3.policy_delay, td3.target_noise) == (True, 2, 0.2)
    assert (apex.prioritized, apex.n_step, apex.replay_ratio) == (True, 3, None)


def test_validate_names_the_bad_key():
    def cfg(**algo):
        return OmegaConf.create({"algo": OmegaConf.structured(TD3Config(**algo)),
                                 "env": OmegaConf.structured(EnvConfig()),
                                 "topology": {"spec": "local"}})

    validate(cfg())
    with pytest.raises(ConfigError, match="algo.exploration"):
        validate(cfg(exploration="pink"))
    with pytest.raises(ConfigError, match="algo.policy_delay"):
        validate(cfg(policy_delay=0))
    bad_env = cfg()
    bad_env.env.normalize_obs = True
    with pytest.raises(ConfigError, match="env.normalize_obs"):
        validate(bad_env)

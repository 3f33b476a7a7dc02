"""PPO's update on a tiny batch: the adaptive KL penalty follows the KL after the epochs."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

import walle_ray.algos.ppo.update as ppo_update
from walle_ray.algos.ppo.update import PPOUpdate
from walle_ray.batch import Rollout
from walle_ray.learners.collective import Collective
from walle_ray.models import make_actor_critic

from conftest import make_cfg

OBS = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
ACT = gym.spaces.Discrete(3)


def batch(model, T: int = 16, B: int = 4, seed: int = 0) -> Rollout:
    """An on-policy fragment acted by ``model``, with advantages that push the policy."""
    rng = np.random.default_rng(seed)
    obs_t = rng.normal(size=(T, B, 2)).astype(np.float32)
    with torch.no_grad():
        params, v = model(torch.from_numpy(obs_t.reshape(T * B, 2)))
        dist = model.head.dist(params)
        action = dist.sample()
        logp = dist.log_prob(action)
    z = np.zeros((T, B), np.float32)
    return Rollout(obs_t=obs_t, action_t=action.view(T, B).numpy(),
                   reward_t=rng.normal(size=(T, B)).astype(np.float32) * 3,
                   terminated_t=np.zeros((T, B), bool), truncated_t=np.zeros((T, B), bool),
                   logp_t=logp.view(T, B).numpy(), dist_t=params.view(T, B, 3).numpy(),
                   v_t=v.view(T, B).numpy(), final_v_t=z, final_obs=np.zeros((0, 2), np.float32),
                   return_t=z, last_obs=np.zeros((B, 2), np.float32), last_v=np.zeros(B, np.float32),
                   version_b=np.zeros(B, np.int64), replayed_b=np.zeros(B, bool))


def test_kl_penalty_adapts_beta_to_the_kl_after_the_epochs(monkeypatch):
    torch.manual_seed(0)
    cfg = make_cfg("algo=ppo_kl", "algo.minibatch_size=16", "algo.epochs=3", "algo.lr=3e-3",
                   "algo.kl_early_stop=1000")
    model = make_actor_critic(OBS, ACT, cfg.model)
    update = PPOUpdate(cfg.algo, model, Collective(), False, cfg.run.total_env_steps,
                       torch.device("cpu"))
    fragment = batch(model)
    behaviour = copy.deepcopy(model)
    seen = []
    monkeypatch.setattr(ppo_update, "adapt_kl_beta",
                        lambda beta, kl, target: seen.append(kl) or beta)
    metrics = update.update([fragment], env_steps=0)
    with torch.no_grad():
        obs = torch.from_numpy(fragment.obs_t.reshape(-1, 2))
        after = model.head.kl(behaviour(obs)[0], model(obs)[0]).mean().item()
    assert after > 1e-4  # the policy moved
    assert seen == [pytest.approx(after, rel=1e-5)]
    assert metrics["kl_after"] == pytest.approx(after, rel=1e-5)


@pytest.mark.parametrize("algo", ["ppo", "ppo_kl"])
def test_compiled_update_takes_the_eager_steps(algo):
    """algo.compile=true changes how the minibatch's forward and loss run, not what they
    compute: from the same weights and batch both end at the same weights (with the clipped
    objective, and the KL penalty, whose coefficient is an input of the compiled function)."""
    cfg = make_cfg(f"algo={algo}", "algo.minibatch_size=16", "algo.epochs=2", "algo.lr=3e-3")
    torch.manual_seed(0)
    model = make_actor_critic(OBS, ACT, cfg.model)
    fragment = batch(model)
    ends = {}
    for compiled in (False, True):
        cfg.algo.compile = compiled
        net = copy.deepcopy(model)
        update = PPOUpdate(cfg.algo, net, Collective(), False, cfg.run.total_env_steps,
                           torch.device("cpu"))
        torch.manual_seed(1)  # the same minibatch order
        metrics = update.update([fragment], env_steps=0)
        assert (update.compiled is not None) == compiled  # it compiled, not fell back
        ends[compiled] = (torch.cat([p.detach().flatten() for p in net.parameters()]), metrics)
    (eager, m_eager), (comp, m_comp) = ends[False], ends[True]
    assert not torch.allclose(eager, torch.cat([p.flatten() for p in model.parameters()]))
    assert torch.allclose(eager, comp, atol=1e-5)
    assert m_comp["policy_loss"] == pytest.approx(m_eager["policy_loss"], abs=1e-5)


class FailsBackward(torch.autograd.Function):
    """The identity, whose backward fails as a backward that cannot compile does."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("no C++ compiler found for the backward\nmore")


@pytest.mark.parametrize("fails_in", ["forward", "backward"])
def test_a_failed_compile_goes_on_eager(fails_in, capsys):
    cfg = make_cfg("algo=ppo", "algo.minibatch_size=16", "algo.epochs=1", "algo.compile=true")
    torch.manual_seed(0)
    model = make_actor_critic(OBS, ACT, cfg.model)
    update = PPOUpdate(cfg.algo, model, Collective(), False, cfg.run.total_env_steps,
                       torch.device("cpu"))

    def no_compiler(obs, *rows):  # inductor's failure, as torch.compile wraps it
        from torch._dynamo.exc import BackendCompilerFailed

        if fails_in == "forward":
            raise BackendCompilerFailed(no_compiler, RuntimeError("no C++ compiler found\nmore"), None)
        loss, terms = update._forward_loss(obs, *rows)  # AOTAutograd compiles the backward later
        return FailsBackward.apply(loss), terms

    update.compiled = no_compiler
    metrics = update.update([batch(model)], env_steps=0)
    assert update.compiled is None and metrics["grad_steps"] == 4
    err = capsys.readouterr().err
    assert "torch.compile failed (RuntimeError: no C++ compiler found" in err
    assert "algo.compile=false" in err and err.count("\n") == 1


def test_compile_refuses_a_recurrent_core():
    from walle_ray.algos import algorithm_for
    from walle_ray.config import ConfigError

    cfg = make_cfg("algo=ppo", "algo.compile=true", "model.core=lstm")
    with pytest.raises(ConfigError, match="algo.compile=true .* model.core=lstm"):
        algorithm_for(cfg.algo).validate(cfg)

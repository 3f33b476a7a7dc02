"""The IMPALA update's wiring on a tiny batch: what reaches V-trace, LASER and CLEAR, which
rows feed the running statistics, and the optimizer defaults for mean-reduced losses."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

import walle_ray.algos.impala.update as impala_update
from walle_ray.algos.impala.update import IMPALAUpdate
from walle_ray.batch import Rollout
from walle_ray.learners.collective import Collective
from walle_ray.models import make_actor_critic
from walle_ray.ops import vtrace

from conftest import make_cfg

OBS = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
ACT = gym.spaces.Discrete(3)
T, B = 3, 2


def make_update(*overrides: str, normalize: bool = False) -> IMPALAUpdate:
    torch.manual_seed(0)
    cfg = make_cfg("algo=impala", f"env.normalize_obs={normalize}",
                   f"env.normalize_reward={normalize}", *overrides)
    model = make_actor_critic(OBS, ACT, cfg.model, cfg.env.normalize_obs)
    return IMPALAUpdate(cfg.algo, model, Collective(), cfg.env.normalize_reward,
                        cfg.run.total_env_steps, torch.device("cpu"))


def tiny_batch(model, log_rho: float = 0.5, seed: int = 0) -> Rollout:
    """Row 0 is truncated after step 1; row 1 is truncated after step 0, terminated after
    step 2, and replayed. The
    behaviour log-probs are the current policy's minus ``log_rho``; the behaviour
    distributions are perturbed logits; the sampler's values are NaN, as IMPALA's leave them."""
    rng = np.random.default_rng(seed)
    obs_t = rng.normal(size=(T, B, 2)).astype(np.float32)
    action_t = rng.integers(3, size=(T, B))
    with torch.no_grad():
        params, _ = model(torch.from_numpy(obs_t.reshape(T * B, 2)))
        logp = model.head.dist(params).log_prob(torch.from_numpy(action_t.reshape(-1)))
    truncated_t = np.zeros((T, B), bool)
    truncated_t[1, 0] = truncated_t[0, 1] = True
    terminated_t = np.zeros((T, B), bool)
    terminated_t[2, 1] = True
    nan_tb = np.where(truncated_t, np.nan, 0.0).astype(np.float32)
    return Rollout(obs_t=obs_t, action_t=action_t, reward_t=rng.normal(size=(T, B)).astype(np.float32),
                   terminated_t=terminated_t, truncated_t=truncated_t,
                   logp_t=(logp.view(T, B).numpy() - log_rho).astype(np.float32),
                   dist_t=(params.view(T, B, 3).numpy() + rng.normal(0, 1.5, (T, B, 3))).astype(np.float32),
                   v_t=rng.normal(size=(T, B)).astype(np.float32), final_v_t=nan_tb,
                   final_obs=np.array([[7.0, -7.0], [-3.0, 5.0]], np.float32),  # (0, 1), (1, 0)
                   return_t=rng.normal(size=(T, B)).astype(np.float32),
                   last_obs=rng.normal(size=(B, 2)).astype(np.float32),
                   last_v=np.full(B, np.nan, np.float32), version_b=np.zeros(B, np.int64),
                   replayed_b=np.array([False, True]))


@pytest.fixture
def spies(monkeypatch):
    """Record what the update hands to V-trace and to the CLEAR loss."""
    seen = {}

    def spy_vtrace(*args, **kwargs):
        seen["vtrace"] = (args, kwargs)
        return vtrace(*args, **kwargs)

    def spy_clear(*args, **kwargs):
        seen["clear"] = (args, kwargs)
        return real_clear(*args, **kwargs)

    real_clear = impala_update.clear_loss
    monkeypatch.setattr(impala_update, "vtrace", spy_vtrace)
    monkeypatch.setattr(impala_update, "clear_loss", spy_clear)
    return seen


def test_vtrace_gets_log_rho_and_the_learners_own_values(spies):
    update = make_update()
    batch = tiny_batch(update.model)
    before = copy.deepcopy(update.model)
    out = update.update([batch], env_steps=0)
    assert np.isfinite(out["loss"]) and np.isfinite(out["grad_norm"])
    (log_rho, _r, _v, boot, _term, _trunc, final_v_t, _gamma), kw = spies["vtrace"]
    torch.testing.assert_close(log_rho, torch.full((T, B), 0.5))  # log pi - log mu, not mu - pi
    with torch.no_grad():
        torch.testing.assert_close(boot, before.value(torch.from_numpy(batch.last_obs)))
        v_final = before.value(torch.from_numpy(batch.final_obs))
    want = torch.zeros(T, B)
    want[0, 1], want[1, 0] = v_final  # truncated steps bootstrap from the learner's values
    torch.testing.assert_close(final_v_t, want)
    assert kw["mask_t"] is None and "clear" not in spies  # LASER and CLEAR are off


def test_laser_mask_reaches_vtrace_and_clear_applies_to_replayed_rows_only(spies):
    update = make_update("algo.laser_kl_threshold=0.05", "algo.clear_policy_coef=0.1",
                         "algo.clear_value_coef=0.2")
    batch = tiny_batch(update.model)
    with torch.no_grad():
        params = update.model(torch.from_numpy(batch.obs_t.reshape(T * B, 2)))[0].view(T, B, 3)
        divergence = update.model.head.implied_kl(params, torch.from_numpy(batch.dist_t), 1.0)
    keep = (divergence <= 0.05).float()
    assert 0 < keep.sum() < T * B  # the batch has steps on both sides of the threshold
    out = update.update([batch], env_steps=0)
    torch.testing.assert_close(spies["vtrace"][1]["mask_t"], keep)
    assert out["laser_kept"] == pytest.approx(float(keep.mean()))
    (_kl, _v, stored_v, replayed_t), kw = spies["clear"]
    torch.testing.assert_close(replayed_t, torch.tensor([[0.0, 1.0]] * T))
    torch.testing.assert_close(stored_v, torch.from_numpy(batch.v_t))
    assert kw == {"policy_coef": 0.1, "value_coef": 0.2}


def test_running_statistics_count_fresh_rows_only():
    update = make_update(normalize=True)
    batch = tiny_batch(update.model)
    obs_count = float(update.model.obs_norm.count)
    return_count = float(update.reward_scaler.norm.count)
    update.update([batch], env_steps=0)
    assert float(update.model.obs_norm.count) == pytest.approx(obs_count + T)  # row 0 only
    assert float(update.reward_scaler.norm.count) == pytest.approx(return_count + T)
    fresh = batch.obs_t[:, 0]
    prior = obs_count / (obs_count + T)  # the initial mean 0 weighs in with its tiny count
    np.testing.assert_allclose(update.model.obs_norm.mean.numpy(), fresh.mean(0) * (1 - prior),
                               rtol=1e-5)
    replayed_only = Rollout(**{**batch.__dict__, "replayed_b": np.ones(B, bool)})
    counted = float(update.model.obs_norm.count)
    update.update([replayed_only], env_steps=0)
    assert float(update.model.obs_norm.count) == counted  # nothing new, and nothing NaN
    assert torch.isfinite(update.model.obs_norm.mean).all()


def test_a_mix_without_a_queue_refuses_normalisation():
    from walle_ray.algos import validate
    from walle_ray.config import ConfigError

    uniform = "algo.replay=[{type: uniform, ratio: 1.0}]"
    validate(make_cfg("algo=impala", uniform))
    with pytest.raises(ConfigError, match=r"^env\.normalize_obs: .* without a queue"):
        validate(make_cfg("algo=impala", uniform, "env.normalize_obs=true"))


def test_default_rmsprop_steps_are_set_by_the_gradient_not_epsilon():
    """The losses are means over T x B, so gradients are small; RMSProp's first step is
    lr * g / (sqrt(1 - alpha) |g| + eps), up to 10 x lr per weight unless eps swamps |g|
    (the paper's 0.01 assumes summed losses). No preset: a user's own env."""
    update = make_update("env=hopper")
    assert update.cfg.optimizer == "rmsprop"
    before = [p.detach().clone() for p in update.model.parameters()]
    update.update([tiny_batch(update.model)], env_steps=0)
    steps = torch.cat([(p.detach() - b).abs().flatten()
                       for p, b in zip(update.model.parameters(), before)])
    ratio = (steps[steps > 0] / update.cfg.lr).median()
    assert ratio > 2.0, f"median step is {ratio:.2f} x lr: epsilon dominates the gradient"


@pytest.mark.parametrize("name", ["amsgrad", "adam"])
def test_amsgrad_takes_steps_of_the_usual_size_when_large_gradients_follow_a_quiet_stretch(name):
    """``algo.optimizer=amsgrad``: after 2000 steps of gradient 1 and 10000 of 0.001 (a run
    holding its score), 20 steps of gradient 1 again move a weight at most the 20 x lr they
    moved it before; Adam, whose second moment has decayed to the quiet stretch's, moves it
    several times that."""
    from walle_ray.learners.optim import make_optimizer

    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = make_optimizer([weight], name, lr=1e-3, eps=1e-8)
    for i, g in enumerate([1.0] * 2000 + [1e-3] * 10000 + [1.0] * 20):
        if i == 12000:
            before = weight.detach().clone()
        weight.grad = torch.tensor([g])
        optimizer.step()
    moved = (weight.detach() - before).abs().item() / 1e-3
    if name == "amsgrad":
        assert moved <= 20.0, f"AMSGrad moved the weight {moved:.1f} x lr"
    else:
        assert moved > 60.0, f"Adam moved the weight {moved:.1f} x lr"

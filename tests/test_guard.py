"""Non-finite losses and gradients never reach the weights: skipped and counted, or the run
stops naming the bad term."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import make_cfg, make_learner, run_cli
from walle_ray.learners.guard import NonFiniteUpdate, clip_grad_norm
from walle_ray.algos import algorithm_for
from walle_ray.topology import parse_topology


def learner_and_rollout(*overrides):
    cfg = make_cfg("topology=local", *overrides)
    topo = parse_topology("local")
    cls, args, kwargs = algorithm_for(cfg.algo).sampler(cfg, topo, 0)
    sampler = cls(*args, **kwargs)
    learner = make_learner(cfg)
    sampler.set_weights(learner.model.get_weights(), 0)
    rollout, _ = sampler.collect()
    sampler.close()
    return learner, rollout


def weights(learner):
    return {k: v.clone() for k, v in learner.model.state_dict().items()}


@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_nan_reward_skips_the_step_and_counts_it(algo):
    learner, rollout = learner_and_rollout(f"algo={algo}", "algo.batch_size=32" if algo == "ppo"
                                           else "algo.batch_size=1")
    before = weights(learner)
    rollout.reward_t = rollout.reward_t.copy()
    rollout.reward_t[3, 0] = np.nan
    metrics = learner.update([rollout], 0)
    assert metrics["nonfinite_skipped"] >= 1
    after = weights(learner)
    assert all(torch.equal(before[k], after[k]) for k in before if "norm" not in k)
    assert all(torch.isfinite(v).all() for v in after.values())


def test_stop_mode_raises_naming_the_term():
    learner, rollout = learner_and_rollout("algo=impala", "algo.batch_size=1",
                                           "learner.on_nonfinite=stop")
    rollout.reward_t = rollout.reward_t.copy()
    rollout.reward_t[0, 0] = np.inf
    with pytest.raises(NonFiniteUpdate, match=r"non-finite .*(value_loss|loss)"):
        learner.update([rollout], 0)


def test_a_good_batch_after_a_bad_one_steps_again():
    learner, rollout = learner_and_rollout("algo=impala", "algo.batch_size=1")
    bad = type(rollout)(**{**vars(rollout)})
    bad.reward_t = np.full_like(rollout.reward_t, np.nan)
    learner.update([bad], 0)
    before = weights(learner)
    metrics = learner.update([rollout], 0)
    assert metrics["nonfinite_skipped"] == 1 and np.isfinite(metrics["grad_norm"])
    assert any(not torch.equal(before[k], v) for k, v in learner.model.state_dict().items())


def test_bad_on_nonfinite_value_is_refused():
    proc = run_cli("learner.on_nonfinite=ignore", "hydra.run.dir=/tmp/walle_ray_bad_input",
                   check=False, timeout=120)
    assert proc.returncode == 2 and "learner.on_nonfinite: got 'ignore'; use skip or stop" in proc.stderr


@pytest.mark.parametrize("max_norm", [0.5, 100.0, math.inf])
def test_clipping_matches_torchs_clip_grad_norm(max_norm):
    torch.manual_seed(0)
    grads = [torch.randn(5, 3), torch.randn(4)]
    ours = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    theirs = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for a, b, g in zip(ours, theirs, grads):
        a.grad, b.grad = g.clone(), g.clone()
    norm = clip_grad_norm(ours, max_norm)
    assert float(norm) == pytest.approx(float(torch.nn.utils.clip_grad_norm_(theirs, max_norm)))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad)

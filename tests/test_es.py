"""Evolution strategies: fitness shaping and the gradient on hand-made cases, the batched
perturbed policy, the noise table put once, and CartPole to 475."""

import json

import numpy as np
import pytest
import torch

from walle_ray.algos.es import ES, noise_source
from walle_ray.algos.es.model import ESPolicy
from walle_ray.algos.es.ops import centered_ranks, es_gradient, noise_table, sample_offsets
from walle_ray.algos import validate
from walle_ray.config import ConfigError
from walle_ray.topology import parse_topology

from conftest import make_cfg, run_cli


def test_centered_ranks_are_the_order_scaled_to_half_a_unit():
    np.testing.assert_allclose(centered_ranks(np.array([10.0, -3.0, 500.0, 0.0])),
                               [1 / 6, -0.5, 0.5, -1 / 6])
    np.testing.assert_allclose(centered_ranks(np.array([[1.0, 2.0], [4.0, 3.0]])),
                               [[-0.5, -1 / 6], [0.5, 1 / 6]])


def test_the_gradient_weights_each_pair_by_its_rank_difference():
    table = np.arange(10, dtype=np.float32)
    offsets = np.array([0, 5])
    # pair 0: + beat - (ranks 0.5 vs -0.5 of four returns... computed below), pair 1 the reverse
    pos, neg = np.array([4.0, 1.0]), np.array([2.0, 3.0])
    ranks = centered_ranks(np.array([[4.0, 2.0], [1.0, 3.0]]))  # [[0.5, -1/6], [-0.5, 1/6]]
    w = ranks[:, 0] - ranks[:, 1]  # [2/3, -2/3]
    expected = (w[0] * table[0:3] + w[1] * table[5:8]) / 4
    np.testing.assert_allclose(es_gradient(table, offsets, pos, neg, 3), expected, rtol=1e-6)


def test_offsets_fit_the_table_and_a_small_table_is_refused():
    rng = np.random.default_rng(0)
    offsets = sample_offsets(rng, 100, 30, 1000)
    assert offsets.min() >= 0 and offsets.max() <= 70
    with pytest.raises(ValueError, match="noise_size"):
        sample_offsets(rng, 10, 30, 1)


@pytest.mark.parametrize("env", ["cartpole", "pendulum"])
def test_a_batched_act_with_each_envs_parameters_equals_acting_one_by_one(env):
    import gymnasium as gym

    ids = {"cartpole": "CartPole-v1", "pendulum": "Pendulum-v1"}
    e = gym.make(ids[env])
    model = ESPolicy(e.observation_space, e.action_space, [8, 8], "tanh")
    theta = model.flat_params()
    params = torch.stack([theta + 0.5 * torch.randn_like(theta) for _ in range(3)])
    obs = torch.randn(3, *e.observation_space.shape)
    batched = model.act_batched(obs, params)
    for b in range(3):
        torch.nn.utils.vector_to_parameters(params[b], model.parameters())
        torch.testing.assert_close(model(obs[b: b + 1])[0], batched[b])


def test_the_noise_table_is_put_once_and_samplers_get_a_reference(ray_session):
    from walle_ray.algos.es.sampler import resolve_table

    cfg = make_cfg("algo=es", "env=cartpole", "algo.noise_size=1000", "topology=4a1m1l")
    topo = parse_topology("4a1m1l")
    sources = {ES.sampler(cfg, topo, i)[1][5] for i in range(4)}
    assert len(sources) == 1  # every sampler is sent the same holder's name, not the table
    name = sources.pop()
    box = ray_session.get(ray_session.get_actor(name).get.remote())
    assert isinstance(box[0], ray_session.ObjectRef)  # the table itself stays in the store
    np.testing.assert_array_equal(resolve_table(name), noise_table(1000, cfg.algo.noise_seed))
    assert noise_source(cfg.algo.noise_seed, 1000) == name


def test_a_sampler_returns_offsets_and_returns_never_weights():
    cfg = make_cfg("algo=es", "env=cartpole", "algo.noise_size=100000", "algo.pairs=3",
                   "model.hidden=[8]")
    cls, args, kwargs = ES.sampler(cfg, parse_topology("1a1m1l"), 0)
    sampler = cls(*args, **kwargs)
    sampler.set_weights(sampler.model.get_weights(), 0)
    evals, stats = sampler.collect()
    evals.check()
    assert evals.offset.shape == (3,) and (evals.length_pos > 0).all() and (evals.length_neg > 0).all()
    assert stats["env_steps"] >= evals.num_steps and len(stats["episode_returns"]) == 6
    assert evals.obs_moments[0] == evals.num_steps  # every step's observation counted once
    # CartPole pays 1 per step: each return is its episode's length
    np.testing.assert_array_equal(evals.return_pos, evals.length_pos)


@pytest.mark.parametrize("override,message", [
    ("algo.noise_std=0", "noise_std"), ("topology.spec=4a2m2l", "one learner"),
    ("env=halfcheetah", "normalize_reward"), ("model.activation=gelu", "tanh or relu"),
])
def test_bad_es_settings_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        validate(make_cfg("algo=es", "~preset", override))


@pytest.mark.slow
def test_es_reaches_475_on_cartpole(tmp_path):
    out = run_cli("algo=es", "env=cartpole", "topology=2a1m1l", "run.ray_num_cpus=2",
                  "logger.progress=line", f"hydra.run.dir={tmp_path}", "run.stop_at_return=475",
                  "run.max_wall_s=240", timeout=400).stdout
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert max(r["return"] or 0 for r in records) >= 475, out[-2000:]
    assert (tmp_path / "checkpoints" / "last.pt").is_file()

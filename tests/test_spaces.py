"""Spaces beyond Discrete and Box: MultiDiscrete and MultiBinary action heads, Dict and Tuple
observations flattened into a FlatSpace, and env.wrappers from a user's package
(tests/fixtures/my_pkg/wrappers.py)."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.distributions import kl_divergence

from walle_ray.algos.spec import check_continuous, check_discrete, check_policy_spaces
from walle_ray.config import ConfigError, EnvConfig, ModelConfig
from walle_ray.envs import make_vector_env
from walle_ray.envs.spaces import FlatSpace
from walle_ray.models.heads import BernoulliHead, MultiCategoricalHead, make_action_head

from conftest import make_cfg, run_cli




HEADS = {"multi_discrete": lambda: MultiCategoricalHead([3, 2, 4]),
         "multi_discrete_equal": lambda: MultiCategoricalHead([4, 4]),
         "multi_binary": lambda: BernoulliHead(5)}


@pytest.mark.parametrize("name", HEADS)
def test_head_act_matches_its_distribution(name):
    torch.manual_seed(0)
    head = HEADS[name]()
    params, other = torch.randn(2, 64, head.param_dim)
    action, logp = head.act(params)
    dist = head.dist(params)
    torch.testing.assert_close(logp, dist.log_prob(action), rtol=1e-5, atol=1e-5)
    assert logp.shape == dist.entropy().shape == (64,)
    assert torch.isfinite(dist.entropy()).all()
    greedy, greedy_logp = head.act(params, deterministic=True)
    torch.testing.assert_close(greedy, head.mode(params))
    torch.testing.assert_close(greedy_logp, dist.log_prob(greedy), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head.kl(params, other), kl_divergence(dist, head.dist(other)),
                               rtol=1e-4, atol=1e-5)
    assert head.kl(params, params).abs().max() < 1e-5
    assert head.implied_kl(params, params, 1.0).abs().max() < 1e-5  # the sampled estimate
    assert torch.isfinite(head.implied_kl(params, other, 1.0)).all()


def test_multi_categorical_samples_each_component_from_its_own_logits():
    torch.manual_seed(0)
    head = MultiCategoricalHead([3, 2])
    params = torch.tensor([[0.0, 1.0, 2.0, 0.5, -0.5]]).repeat(20000, 1)
    action, _ = head.act(params)
    assert action.dtype == torch.int64 and action.shape == (20000, 2)
    for i, logits in enumerate(params[0].split([3, 2])):
        freq = torch.bincount(action[:, i], minlength=len(logits)).float() / len(action)
        torch.testing.assert_close(freq, torch.softmax(logits, -1), atol=0.015, rtol=0)
    # the padded component's entropy is its own, not the padding's
    components = [torch.distributions.Categorical(logits=x).entropy() for x in params[0].split([3, 2])]
    assert head.dist(params[:1]).entropy().item() == pytest.approx(float(sum(components)), rel=1e-5)


def test_bernoulli_samples_each_bit_with_its_probability():
    torch.manual_seed(0)
    params = torch.tensor([[-1.0, 0.0, 2.0]]).repeat(20000, 1)
    action, _ = BernoulliHead(3).act(params)
    torch.testing.assert_close(action.mean(0), torch.sigmoid(params[0]), atol=0.015, rtol=0)


def test_policy_methods_accept_the_new_action_spaces_and_list_them_otherwise():
    check = check_policy_spaces("PPO")
    obs = gym.spaces.Box(-1, 1, (2,))
    for space in (gym.spaces.MultiDiscrete([3, 2]), gym.spaces.MultiBinary(4)):
        check(obs, space)
        assert make_action_head(space).param_dim == int(np.sum(getattr(space, "nvec", 4)))
    with pytest.raises(ConfigError, match="PPO needs one of these action spaces: Discrete, a 1-D "
                                          "Box, a 1-D MultiDiscrete or a 1-D MultiBinary; this env"):
        check(obs, gym.spaces.MultiBinary([2, 2]))


NESTED = gym.spaces.Dict({
    "pos": gym.spaces.Box(-1, 1, (2, 3), np.float32),
    "mode": gym.spaces.Discrete(3),
    "inner": gym.spaces.Dict({"bits": gym.spaces.MultiBinary(2),
                              "pair": gym.spaces.Tuple((gym.spaces.Discrete(2),
                                                        gym.spaces.Box(0, 5, (1,), np.float32)))}),
})


def test_flat_space_round_trip_and_pickling():
    space = FlatSpace(NESTED)
    assert isinstance(space, gym.spaces.Box) and space.shape == (14,) and space.dtype == np.float32
    NESTED.seed(0)
    samples = [NESTED.sample() for _ in range(4)]
    x = torch.as_tensor(np.stack([gym.spaces.flatten(NESTED, s) for s in samples]), dtype=torch.float32)
    parts = space.unflatten(x)
    for row, sample in enumerate(samples):
        np.testing.assert_allclose(parts["pos"][row].numpy(), sample["pos"], rtol=1e-6)
        assert parts["mode"][row].argmax().item() == sample["mode"]  # one-hot, as gymnasium flattens
        np.testing.assert_array_equal(parts["inner"]["bits"][row].numpy(), sample["inner"]["bits"])
        pair = parts["inner"]["pair"]
        assert isinstance(pair, tuple) and pair[0][row].argmax().item() == sample["inner"]["pair"][0]
        np.testing.assert_allclose(pair[1][row].numpy(), sample["inner"]["pair"][1], rtol=1e-6)
    assert parts["pos"].shape == (4, 2, 3) and parts["mode"].shape == (4, 3)
    copy = pickle.loads(pickle.dumps(space))
    assert copy == space and copy.source == NESTED
    torch.testing.assert_close(copy.unflatten(x)["inner"]["pair"][1], parts["inner"]["pair"][1])
    assert space.unflatten(x.numpy()[0])["pos"].shape == (2, 3)  # numpy, no batch axis


def test_a_dict_env_is_flattened_and_every_method_accepts_it():
    env = make_vector_env(OmegaConf.structured(EnvConfig(id="walle/DictObs-v0", envs_per_sampler=2)))
    try:
        obs = env.reset(seed=0)
        space = env.observation_space
        assert isinstance(space, FlatSpace) and obs.shape == (2, 5) and obs.dtype == np.float32
        assert obs[:, :3].sum(1).tolist() == [1.0, 1.0]  # the goal, one-hot
        for check in (check_policy_spaces("PPO"), check_discrete("DQN")):
            check(space, env.action_space)
        check_continuous("TD3")(space, gym.spaces.Box(-1, 1, (2,), np.float32))
    finally:
        env.close()


def _rewards(wrappers: list, steps: int = 2) -> tuple:
    cfg = OmegaConf.structured(EnvConfig(id="walle/Counting-v0", envs_per_sampler=1,
                                         wrappers=wrappers))
    env = make_vector_env(cfg)
    try:
        obs = env.reset(seed=0)
        reward, term, trunc = np.empty(1, np.float32), np.empty(1, bool), np.empty(1, bool)
        env.step(np.zeros(1, np.int64), obs, reward, term, trunc)
        return float(reward[0]), env.observation_space
    finally:
        env.close()


def test_wrappers_apply_in_order(on_path):
    scale = {"_target_": "my_pkg.wrappers.AffineReward", "scale": 2.0}
    shift = {"_target_": "my_pkg.wrappers:AffineReward", "shift": 1.0}  # the module:Name form
    assert _rewards([scale, shift])[0] == 3.0  # (1 * 2) + 1
    assert _rewards([shift, scale])[0] == 4.0  # (1 + 1) * 2
    # a wrapper that makes a Dict observation is flattened after it
    _, space = _rewards([{"_target_": "my_pkg.wrappers.AsDict", "key": "count"}])
    assert isinstance(space, FlatSpace) and list(space.source.keys()) == ["count"]
    _, space = _rewards([{"_target_": "my_pkg.wrappers.AsDict"},
                         {"_target_": "gymnasium.wrappers.FlattenObservation"}])
    assert type(space) is gym.spaces.Box


@pytest.mark.parametrize("wrappers,message", [
    ([{"_target_": "my_pkg.nowhere.X"}], r"^env\.wrappers\[0\]\._target_: cannot import 'my_pkg\.nowhere'"),
    ([{"_target_": "my_pkg.wrappers.Nope"}], r"^env\.wrappers\[0\]\._target_: module 'my_pkg\.wrappers' "
                                             "has no class or function 'Nope'"),
    ([{"scale": 2.0}], r"^env\.wrappers\[0\]: got .*; write each wrapper as"),
    ([{"_target_": "my_pkg.wrappers.AffineReward", "bogus": 1}],
     r"^env\.wrappers\[0\]: AffineReward\(env, \*\*\{'bogus': 1\}\) failed"),
])
def test_bad_wrappers_name_the_item_in_process(on_path, wrappers, message):
    with pytest.raises(ConfigError, match=message):
        _rewards(wrappers)


def test_sampler_and_updates_carry_multi_discrete_actions():
    """A fragment's actions are [T, B, k]; PPO's and IMPALA's updates learn from it."""
    from walle_ray.algos.impala.update import IMPALAUpdate
    from walle_ray.algos.ppo.update import PPOUpdate
    from walle_ray.algos.spec import fragment_sampler
    from walle_ray.learners.collective import Collective
    from walle_ray.models import make_actor_critic

    torch.manual_seed(0)
    env_cfg = EnvConfig(id="walle/MultiDiscrete-v0", envs_per_sampler=3)
    sampler = fragment_sampler(env_cfg, ModelConfig(), 8, 0.99)
    rollout, _ = sampler.collect()
    sampler.close()
    rollout.check()
    assert rollout.action_t.shape == (8, 3, 3) and rollout.action_t.dtype == np.int64
    assert rollout.dist_t.shape == (8, 3, 9) and rollout.logp_t.shape == (8, 3)
    head = MultiCategoricalHead([3, 2, 4])
    logp = head.dist(torch.from_numpy(rollout.dist_t)).log_prob(torch.from_numpy(rollout.action_t))
    np.testing.assert_allclose(logp.numpy(), rollout.logp_t, rtol=1e-5, atol=1e-5)
    for algo, update_cls in (("ppo", PPOUpdate), ("impala", IMPALAUpdate)):
        cfg = make_cfg(f"algo={algo}", *(["algo.minibatch_size=8"] if algo == "ppo" else []))
        model = make_actor_critic(sampler.env.observation_space, sampler.env.action_space, cfg.model)
        model.load_state_dict(sampler.policy.model.state_dict())
        metrics = update_cls(cfg.algo, model, Collective(), False, 1000,
                             torch.device("cpu")).update([rollout], env_steps=0)
        assert np.isfinite(metrics["entropy"]) and np.isfinite(metrics["policy_loss"]), algo


SHORT = ["topology=local", "~preset", "logger.progress=off", "run.checkpoint_every=1000"]
PPO_SMALL = ["algo.batch_size=512", "algo.minibatch_size=128"]


@pytest.mark.parametrize("env_id,args,stop_at", [
    ("walle/DictObs-v0", PPO_SMALL, 17),  # random play: 6.7
    ("walle/MultiDiscrete-v0", PPO_SMALL, 15),  # random play: 7.2
    ("walle/MultiBinary-v0", PPO_SMALL, 15),  # random play: 10
    ("walle/MultiDiscrete-v0", ["algo=impala", "algo.optimizer=adam", "algo.lr=3e-3",
                                "algo.lr_schedule=constant", "algo.gamma=0.5",
                                "algo.max_grad_norm=40", "algo.batch_size=16",
                                "algo.ent_coef=0.001", "algo.baseline_coef=0.25",
                                "run.report_every_s=1"], 14),
])
def test_trivial_tasks_are_learned_through_the_cli(tmp_path, env_id, args, stop_at):
    out = run_cli(f"env.id={env_id}", "env.name=spaces", *SHORT, *args,
                  "run.total_env_steps=150000", f"run.stop_at_return={stop_at}",
                  f"hydra.run.dir={tmp_path}", timeout=120).stdout
    assert "stopped (return)" in out, out[-2000:]


def test_a_wrapper_from_the_cli_changes_what_is_learned_from(on_path, tmp_path):
    """Counting-v0 pays 1 per step for 10 steps; the user's wrapper doubles it."""
    out = run_cli("env.id=walle/Counting-v0", "env.name=counting", *SHORT, *PPO_SMALL,
                  "env.wrappers=[{_target_: my_pkg.wrappers.AffineReward, scale: 2.0}]",
                  "run.total_env_steps=512", f"hydra.run.dir={tmp_path}", env=on_path,
                  timeout=120).stdout
    assert "return 20.00" in out, out[-2000:]


@pytest.mark.parametrize("args,message", [
    (["env.wrappers=[{_target_: my_pkg.nowhere.Wrapper}]"],
     "env.wrappers[0]._target_: cannot import 'my_pkg.nowhere' (ModuleNotFoundError"),
    (["env=pong", "env.wrappers=[{_target_: gymnasium.wrappers.ClipReward}]"],
     "env.wrappers: ALE ids run in ale_py's C++ vector env"),
])
def test_bad_wrappers_give_one_error_line(on_path, tmp_path, args, message):
    proc = run_cli(*args, "topology=local", f"hydra.run.dir={tmp_path}", env=on_path,
                   check=False, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("walle_ray: error:")]
    assert len(lines) == 1 and message in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_a_ray_run_builds_wrapped_dict_envs_in_its_samplers(on_path, tmp_path):
    """Sampler processes import the user's wrapper; the FlatSpace travels to the learner."""
    out = run_cli("env.id=walle/Continuous-v0", "env.name=continuous", "topology=1a1m1l",
                  "~preset", "env.wrappers=[{_target_: my_pkg.wrappers.AsDict}]",
                  "run.ray_num_cpus=2", "algo.batch_size=256", "algo.minibatch_size=64",
                  "run.total_env_steps=1024", f"hydra.run.dir={tmp_path}", env=on_path,
                  timeout=240).stdout
    assert "stopped (budget)" in out, out[-2000:]

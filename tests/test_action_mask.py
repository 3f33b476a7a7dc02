"""Action masks (``env.action_mask``): where the mask comes from, that no algorithm acting in
a discrete space ever takes a forbidden action, that masked heads stay finite, that an
all-ones mask changes no loss, and that DQN's targets maximise over allowed actions only."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from walle_ray.algos import algorithm_for, validate
from walle_ray.config import ConfigError, EnvConfig
from walle_ray.envs import env_spaces, make_vector_env
from walle_ray.envs.games import ForbiddenAction
from walle_ray.envs.masks import NoActionAllowed
from walle_ray.models.heads import CategoricalHead, MultiCategoricalHead
from walle_ray.models.masking import MASKED, ActionMask
from walle_ray.runtime.evaluate import typed_sections
from walle_ray.topology import parse_topology

from conftest import make_cfg, make_learner
from test_algorithm_presets import fill_and_sample

STEPS = 100_000  # agent steps each algorithm acts against random masks
MASKED_ENV = ["env.id=walle/RandomMask-v0", "~preset", "env.envs_per_sampler=50"]
ACTING = {
    "ppo": ["algo=ppo"],
    "ppo_kl": ["algo=ppo_kl"],
    "impala": ["algo=impala"],
    "impala-lstm": ["algo=impala", "model.core=lstm"],
    "ppo-multidiscrete": ["algo=ppo", "++env.kwargs={nvec: [3, 2, 4]}"],
    "dqn": ["algo=dqn"],  # epsilon 1 at the start: the random choice
    "apex": ["algo=apex"],  # its one sampler's epsilon: mostly greedy
    "es": ["algo=es"],
}


def _sampler(algo, cfg):
    cls, args, kwargs = algo.sampler(cfg, parse_topology("local"), 0)
    return cls(*args, **kwargs)


@pytest.mark.parametrize("case", ACTING)
def test_no_algorithm_ever_takes_a_forbidden_action(case):
    """10^5 steps of each algorithm's own sampler against a fresh random mask every step
    (``RandomMaskEnv`` raises on a forbidden action), from its initial network, which
    without the mask would pick a forbidden action about 70% of the time."""
    cfg = make_cfg(*MASKED_ENV, *ACTING[case], "topology=local")
    validate(cfg)
    algo = algorithm_for(cfg.algo)
    torch.manual_seed(0)
    sampler = _sampler(algo, cfg)
    assert sampler.env.observation_space.action_mask is not None
    learner = make_learner(cfg)
    sampler.set_weights(*reversed(learner.weights()))
    steps = 0
    while steps < STEPS:
        _, stats = sampler.collect()
        steps += stats["env_steps"]
    sampler.close()


def test_without_the_mask_the_same_sampler_soon_takes_a_forbidden_action():
    """The check above can fail: with ``env.action_mask=none`` the env catches one at once."""
    cfg = make_cfg(*MASKED_ENV, "algo=ppo", "topology=local", "env.action_mask=none")
    sampler = _sampler(algorithm_for(cfg.algo), cfg)
    with pytest.raises(ForbiddenAction):
        sampler.collect()
    sampler.close()


@pytest.mark.parametrize("name", ["ppo", "impala", "dqn", "bc", "marwil", "es"])
def test_evaluation_acts_only_on_allowed_actions(name):
    """Each algorithm's evaluation policy (``mode=eval``, ``load_policy``, ``mode=collect``),
    greedy and sampled, on an info mask (``env.action_mask=info``)."""
    cfg = make_cfg(f"algo={name}", "env.id=walle/RandomMask-v0", "~preset",
                   "++env.kwargs={info_mask: true}", "env.action_mask=info")
    algo = algorithm_for(cfg.algo)
    sections = typed_sections(OmegaConf.create(OmegaConf.to_container(cfg)), algo.config_cls)
    env = make_vector_env(dataclasses.replace(sections.env, envs_per_sampler=50))
    learner = make_learner(cfg)
    obs = env.reset(seed=0)
    reward, term, trunc = np.empty(50, np.float32), np.empty(50, bool), np.empty(50, bool)
    for deterministic in (True, False):
        policy = algo.eval_policy(env.observation_space, env.action_space, sections, 0,
                                  deterministic)
        policy.set_weights(learner.weights()[1])
        for _ in range(200):
            env.step(np.asarray(policy.act(obs)), obs, reward, term, trunc)
    env.close()


class MaskedBox(gym.Env):
    """A mask beside continuous actions, which cannot be masked."""

    observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (2,)),
                                         "action_mask": gym.spaces.MultiBinary(2)})
    action_space = gym.spaces.Box(-1, 1, (2,))


def test_where_the_mask_comes_from():
    def space(env_id, mode="auto", **kwargs):
        cfg = OmegaConf.structured(EnvConfig(id=env_id, action_mask=mode, kwargs=kwargs))
        return env_spaces(cfg)[0]

    assert space("walle/Othello-v0").action_mask == (0, 37)  # a Dict's entry (sorted first)
    assert space("walle/RandomMask-v0", info_mask=True).action_mask == (0, 6)  # info, found
    assert space("walle/RandomMask-v0", "info", info_mask=True).source["obs"].shape == (4,)
    assert space("Taxi-v4").action_mask == (0, 6)  # gymnasium's Taxi: info["action_mask"]
    assert space("walle/RandomMask-v0", nvec=[3, 2, 4]).action_mask == (0, 9)
    assert getattr(space("walle/Othello-v0", "none"), "action_mask") is None
    assert getattr(space("CartPole-v1"), "action_mask", None) is None
    with pytest.raises(ConfigError, match="env.action_mask=obs: CartPole-v1's observations"):
        space("CartPole-v1", "obs")
    with pytest.raises(ConfigError, match=r"env.action_mask=info: CartPole-v1's reset gave no "):
        space("CartPole-v1", "info")
    with pytest.raises(ConfigError, match="use env.action_mask=obs for a Dict observation's"):
        space("walle/Othello-v0", "info")
    gym.register("test/MaskedBox-v0", entry_point=MaskedBox)
    with pytest.raises(ConfigError, match="acts in Box.*masks are for Discrete and MultiDiscrete"):
        space("test/MaskedBox-v0", "obs")
    assert getattr(space("test/MaskedBox-v0"), "action_mask") is None  # auto: no mask for it
    with pytest.raises(ConfigError, match="env.action_mask: got 'maybe'"):
        validate(make_cfg("env.action_mask=maybe"))


def test_a_mask_that_allows_nothing_names_the_env_step():
    cfg = OmegaConf.structured(EnvConfig(id="walle/RandomMask-v0", envs_per_sampler=2,
                                         kwargs={"empty_at": 3}))
    env = make_vector_env(cfg)
    obs = env.reset(seed=0)
    reward, term, trunc = np.empty(2, np.float32), np.empty(2, bool), np.empty(2, bool)
    allowed = ActionMask((0, 6), env.action_space).allowed_np
    with pytest.raises(NoActionAllowed, match="env 0's 'action_mask' allows no action at step 3 "
                                              "of its episode"):
        for _ in range(3):
            env.step(np.argmax(allowed(obs), 1), obs, reward, term, trunc)


def test_masked_heads_stay_finite_and_put_no_mass_on_forbidden_actions():
    torch.manual_seed(0)
    mask = ActionMask((0, 5), gym.spaces.Discrete(5))
    obs = torch.tensor([[1, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 0]], dtype=torch.float32)
    logits = torch.randn(3, 5, requires_grad=True)
    params = mask.apply(logits, obs)
    head = CategoricalHead(5)
    dist = head.dist(params)
    assert torch.equal(dist.probs[0, [1, 3, 4]], torch.zeros(3))
    assert torch.allclose(dist.probs[1], torch.tensor([0.0, 0, 0, 1, 0]))
    assert torch.allclose(dist.probs[2], torch.softmax(logits[2], -1))  # nothing allowed: unmasked
    other = mask.apply(torch.randn(3, 5), obs)
    values = [dist.entropy(), head.kl(params, other), head.implied_kl(params, other, 1.0)]
    assert all(torch.isfinite(v).all() for v in values)
    (values[0].sum() + values[1].sum()).backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[0, [1, 3, 4]] == 0).all()
    assert dist.entropy()[1] == 0 and head.kl(params, other)[1] == 0

    multi = ActionMask((0, 6), gym.spaces.MultiDiscrete([2, 4]))
    obs = torch.tensor([[0, 1, 1, 0, 1, 0], [1, 1, 0, 0, 0, 0]], dtype=torch.float32)
    assert multi.allowed(obs).tolist() == [[False, True, True, False, True, False],
                                           [True, True, True, True, True, True]]
    assert np.array_equal(multi.allowed_np(obs.numpy()), multi.allowed(obs).numpy())
    head = MultiCategoricalHead([2, 4])
    params = multi.apply(torch.randn(2, 6), obs)
    for _ in range(20):
        action, logp = head.act(params)
        assert action[0].tolist() in ([1, 0], [1, 2]) and torch.isfinite(logp).all()
    assert torch.isfinite(head.dist(params).entropy()).all()
    assert torch.isfinite(head.kl(params, multi.apply(torch.randn(2, 6), obs))).all()


def test_a_uniform_draw_of_zero_still_samples_an_allowed_action(monkeypatch):
    """``rand_like`` can return exactly 0 (about once in 2**24 draws); the Gumbel noise of
    the one allowed action must not become -inf there, or a masked action wins."""
    monkeypatch.setattr(torch, "rand_like", lambda t: torch.zeros_like(t))
    mask = ActionMask((0, 5), gym.spaces.Discrete(5))
    params = mask.apply(torch.zeros(1, 5), torch.tensor([[0.0, 0, 1, 0, 0]]))
    action, logp = CategoricalHead(5).act(params)
    assert action.tolist() == [2] and torch.isfinite(logp).all()
    multi = ActionMask((0, 6), gym.spaces.MultiDiscrete([2, 4]))
    params = multi.apply(torch.zeros(1, 6), torch.tensor([[0.0, 1, 0, 0, 0, 1]]))
    action, logp = MultiCategoricalHead([2, 4]).act(params)
    assert action.tolist() == [[1, 3]] and torch.isfinite(logp).all()


LOSS_CASES = {
    "ppo": ["algo=ppo", "algo.batch_size=100", "algo.minibatch_size=50", "algo.epochs=2"],
    "ppo_kl": ["algo=ppo_kl", "algo.batch_size=100", "algo.minibatch_size=50"],
    "impala": ["algo=impala", "algo.batch_size=4", "algo.fragment_length=10"],
    "impala-lstm": ["algo=impala", "model.core=lstm", "algo.batch_size=4",
                    "algo.fragment_length=10"],
    "dqn": ["algo=dqn", "algo.batch_size=32", "algo.learning_starts=64", "algo.fragment_length=8"],
}


@pytest.mark.parametrize("case", LOSS_CASES)
def test_an_all_ones_mask_changes_no_loss(case):
    """The same batch, the same weights: the learner of a masked run whose masks allow every
    action computes exactly the losses and the new weights of an unmasked one."""
    runs = {}
    for mode in ("obs", "none"):
        cfg = make_cfg("env.id=walle/RandomMask-v0", "~preset", "++env.kwargs={p: 1.0}",
                       "env.envs_per_sampler=5", f"env.action_mask={mode}", "topology=local",
                       *LOSS_CASES[case])
        runs[mode] = cfg
    algo = algorithm_for(runs["obs"].algo)
    torch.manual_seed(0)
    masked_learner = make_learner(runs["obs"])
    plain = make_learner(runs["none"])
    plain.model.set_weights(masked_learner.weights()[1])
    assert masked_learner.model.mask is not None and plain.model.mask is None
    sampler = _sampler(algo, runs["obs"])
    sampler.set_weights(*reversed(masked_learner.weights()))
    if algo.memory_spec is None:
        batch, stats = sampler.collect()
        steps = stats["env_steps"]
        if algo.name == "ppo":
            while steps < runs["obs"].algo.batch_size:
                more, stats = sampler.collect()
                batch, steps = [batch, more] if not isinstance(batch, list) else batch + [more], steps + stats["env_steps"]
        batches = batch if isinstance(batch, list) else [batch]
    else:
        _, sampled, steps = fill_and_sample(algo, runs["obs"], sampler)
        batches = [sampled]
    out = {}
    for mode, learner in (("obs", masked_learner), ("none", plain)):
        torch.manual_seed(1)
        metrics = learner.update(batches, steps)
        out[mode] = (metrics, learner.weights()[1])
    for key in ("loss", "policy_loss", "entropy", "value_loss", "kl", "q_mean", "target_mean"):
        if key in out["obs"][0]:
            assert out["obs"][0][key] == out["none"][0][key], key
    for name, value in out["obs"][1].items():
        assert np.array_equal(value, out["none"][1][name]), name
    sampler.close()


def test_dqn_targets_maximise_over_the_next_states_allowed_actions():
    from walle_ray.algos.dqn.loss import q_targets
    from walle_ray.models.q_network import QNetwork

    cfg = OmegaConf.structured(EnvConfig(id="walle/RandomMask-v0", kwargs={"n": 4}))
    obs_space, _ = env_spaces(cfg)
    net = QNetwork(obs_space, 4, [8], dueling=False)
    with torch.no_grad():  # Q(s, a) = a: the best action is always the last one allowed
        net.advantage.weight.zero_()
        net.advantage.bias.copy_(torch.arange(4.0))
    next_obs = torch.zeros(2, obs_space.shape[0])
    next_obs[0, [0, 1]] = 1.0  # actions 0 and 1 allowed: max 1
    next_obs[1, [2]] = 1.0  # action 2 alone: max 2
    q = net(next_obs)
    assert q[0, 2] == MASKED and q[0, 3] == MASKED
    target = q_targets(torch.zeros(2), torch.ones(2), q, q)
    assert target.tolist() == [1.0, 2.0]


def test_a_trained_policy_takes_masks_and_dict_observations():
    """``load_policy``'s ``act``: an info mask passed beside the observation (or left out:
    every action allowed), and a Dict observation in the env's own structure."""
    from walle_ray.api import Policy

    def policy_for(*overrides):
        cfg = make_cfg("algo=ppo", "env.id=walle/RandomMask-v0", "~preset", *overrides)
        algo = algorithm_for(cfg.algo)
        sections = typed_sections(OmegaConf.create(OmegaConf.to_container(cfg)), algo.config_cls)
        obs_space, action_space = env_spaces(sections.env)
        acting = algo.eval_policy(obs_space, action_space, sections, 0, False)
        acting.set_weights(make_learner(cfg).weights()[1])
        return Policy(acting, obs_space, action_space, {}, 0, 0)

    info = policy_for("++env.kwargs={info_mask: true}")
    x, mask = np.zeros(4, np.float32), np.eye(6, dtype=np.int8)[4]
    assert all(info.act(x, action_mask=mask) == 4 for _ in range(20))
    batch = info.act(np.stack([x, x]), action_mask=np.stack([mask, np.eye(6)[2]]))
    assert batch.tolist() == [4, 2]
    assert {int(info.act(x)) for _ in range(60)} == set(range(6))  # no mask: all allowed
    assert info.act(np.zeros((3, 10), np.float32)).shape == (3,)  # flat already
    with pytest.raises(ValueError, match="2 observations and 1 masks"):
        info.act([x, x], action_mask=mask[None])
    in_obs = policy_for()
    assert in_obs.act({"x": x, "action_mask": mask}) == 4
    assert in_obs.act([{"x": x, "action_mask": mask}] * 2).tolist() == [4, 4]
    with pytest.raises(ValueError, match="puts its mask in the observation"):
        in_obs.act(x, action_mask=mask)
    with pytest.raises(ValueError, match="trained without action masks"):
        policy_for("env.action_mask=none").act(np.zeros(10, np.float32), action_mask=mask)


def test_a_sampler_whose_mask_allows_nothing_fails_at_once_without_rebuilding():
    from walle_ray.actors.restart import RestartingSampler, SamplerFailed

    cfg = make_cfg("env.id=walle/RandomMask-v0", "~preset", "++env.kwargs={empty_at: 5}",
                   "env.envs_per_sampler=2", "algo=ppo", "topology=local")
    sampler = RestartingSampler(*algorithm_for(cfg.algo).sampler(cfg, parse_topology("local"), 0))
    with pytest.raises(SamplerFailed, match="sampler-0: walle/RandomMask-v0: env 0's "
                                            "'action_mask' allows no action at step 5"):
        sampler.collect()
    assert sampler.restarts == 0


def test_checkpoints_from_before_masks_and_resumes_keep_their_mode(tmp_path):
    from walle_ray.runtime.checkpoint import CheckpointError, checked_config
    from walle_ray.runtime.start import check_resume

    old = {"config": {"env": {"id": "Taxi-v4", "entry_point": None}}}
    assert checked_config(old, tmp_path / "last.pt", trust_code=True)["env"]["action_mask"] == "none"
    cfg = make_cfg("env=taxi")
    cfg.env.action_mask = "info"  # what auto decides for Taxi
    with pytest.raises(CheckpointError, match="trained with env.action_mask=none, not info; "
                                              "resume it with env.action_mask=none"):
        check_resume(cfg, old, "runs/old")
    check_resume(cfg, {"config": {"env": {"id": "Taxi-v4", "entry_point": None,
                                           "action_mask": "info"}}}, "runs/new")


def test_a_dataset_must_take_only_actions_its_masks_allow(tmp_path):
    """``mode=collect`` with random actions records the mask and keeps to it; recorded
    without the mask, the same game's dataset is refused for a masked run, with the fix."""
    import walle_ray
    from walle_ray.datasets import check_datasets

    paths = {}
    for mode in ("auto", "none"):
        out = tmp_path / mode
        walle_ray.collect(["env=othello", f"env.action_mask={mode}"],
                          collect={"random": True, "episodes": 30, "out": str(out)})
        paths[mode] = str(out)
    cfg = OmegaConf.structured(EnvConfig(id="walle/Othello-v0"))
    obs_space, action_space = env_spaces(cfg)
    check_datasets([paths["auto"]], obs_space, action_space, cfg.id, 1)
    with pytest.raises(ConfigError, match="action_mask forbids .* learn from it with "
                                          "env.action_mask=none"):
        check_datasets([paths["none"]], obs_space, action_space, cfg.id, 1)


def test_a_dataset_whose_mask_allows_nothing_where_it_acted_is_refused(monkeypatch):
    """A mask that allows nothing is read as allowing everything (an episode's last
    observation); at a step where the dataset recorded an action it is a broken record, as
    the env would have refused it."""
    from walle_ray import datasets

    cfg = OmegaConf.structured(EnvConfig(id="walle/Othello-v0"))
    obs_space, action_space = env_spaces(cfg)
    start, stop = obs_space.action_mask
    obs = np.zeros((4, obs_space.shape[0]), np.float32)
    obs[:, start] = 1.0  # action 0 allowed
    episode = {"observations": obs, "actions": np.zeros(3, np.int64)}
    monkeypatch.setattr(datasets, "read_episodes", lambda paths, first, every: iter([episode]))
    datasets.check_masked_actions(["d"], obs_space, action_space)
    obs[3, start] = 0.0  # the last observation, acted on by nobody: read as allowing all
    datasets.check_masked_actions(["d"], obs_space, action_space)
    obs[1, start] = 0.0
    with pytest.raises(ConfigError, match="episode 0 records an action at step 1, where its "
                                          "observation's action_mask allows no action"):
        datasets.check_masked_actions(["d"], obs_space, action_space)


def test_a_masked_run_as_typed_records_the_mode_and_its_policy_keeps_to_the_mask(tmp_path):
    """``python -m walle_ray algo=dqn env=taxi`` on Ray: auto is decided once (the run's
    config says info), and the checkpoint's policy and evaluation keep to Taxi's masks."""
    import gymnasium as gym
    import yaml

    import walle_ray
    from conftest import run_cli

    run_dir = tmp_path / "run"
    run_cli("algo=dqn", "env=taxi", "run.total_env_steps=1500", "algo.learning_starts=500",
            f"hydra.run.dir={run_dir}", "eval.episodes=2")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["env"]["action_mask"] == "info"
    policy = walle_ray.load_policy(run_dir)
    env = gym.make("Taxi-v4")
    obs, info = env.reset(seed=0)
    for _ in range(300):
        action = policy.act(obs, action_mask=info["action_mask"])
        assert info["action_mask"][action] == 1
        obs, _, term, trunc, info = env.step(action)
        if term or trunc:
            obs, info = env.reset()
    assert len(walle_ray.evaluate(run_dir, episodes=2)["returns"]) == 2

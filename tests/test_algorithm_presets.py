"""Every algo option, with each of its presets and with its own defaults, passes the checks a
run makes before it starts, and builds the roles it names as ``topology=local`` builds them:
one sampler fragment (or enough to fill a memory; for an offline algorithm, a batch of a
stand-in dataset), one learner update, one evaluation action.

The cases come from the files under walle_ray/conf/ when the tests are collected: a new algorithm
folder with its walle_ray/conf/algo YAML (and any walle_ray/conf/preset/<algo>_<env>.yaml) is tested here
without editing this file. The checks run on the config as composed, so a preset as shipped
must pass them; only then are sizes shrunk and the env swapped for a small stand-in with the
same kind of spaces (walle_ray/envs/testing.py), to keep each case to about a second.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import gymnasium as gym
import numpy as np
import pytest
from omegaconf import OmegaConf

from walle_ray.algos import ALGORITHMS, algorithm_for, algorithm_of, validate
from walle_ray.config import ConfigError, to_container
from walle_ray.envs import env_spaces, make_vector_env
from walle_ray.runtime.evaluate import typed_sections
from walle_ray.topology import parse_topology

from conftest import ROOT, make_cfg, make_learner

CONF = ROOT / "walle_ray" / "conf"
ALGO_OPTIONS = sorted(p.stem for p in (CONF / "algo").glob("*.yaml"))
ENV_OPTIONS = sorted(p.stem for p in (CONF / "env").glob("*.yaml"))
PRESETS = sorted(p.stem for p in (CONF / "preset").glob("*.yaml"))

# The most each size may be once the checks have passed; a smaller shipped value is kept.
ALGO_SIZES = {
    "batch_size": 16,  # PPO: env steps per iteration; IMPALA: rows; replay: transitions
    "minibatch_size": 8,
    "fragment_length": 8,
    "capacity": 256,  # a replay shard allocates all of it at the first put
    "learning_starts": 16,
    "random_steps": 8,  # so DDPG-type samplers act with their actor within the first fragment
    "pairs": 2,  # ES: perturbation pairs per iteration
    "noise_size": 100_000,  # ES: the noise table, above any test policy's parameter count
}
ENV_SIZES = {"envs_per_sampler": 2}
FRAME_SIZE = 42  # the smaller of the two frame sizes (env.obs_size) the conv torso is built for
MAX_COLLECTS = 50  # fragments a memory may take before it must serve a batch


def named_presets(algo: str, env: str) -> list[str]:
    """The presets a user names for this algo and env (``preset=ppo_halfcheetah_fast``)."""
    return [p for p in PRESETS if p.startswith(f"{algo}_{env}_")]


def cases():
    """(algo option, env option, preset) for each preset of each algo option: the one it
    picks up by itself (None) and those named; and (algo option, None, None): the option's
    own settings on the default env, with no preset."""
    for algo in ALGO_OPTIONS:
        yield pytest.param(algo, None, None, id=f"{algo}-default")
        for env in ENV_OPTIONS:
            if f"{algo}_{env}" in PRESETS:
                yield pytest.param(algo, env, None, id=f"{algo}-{env}")
            for name in named_presets(algo, env):
                yield pytest.param(algo, env, name, id=name)


def case_overrides(algo: str, env: str | None, preset: str | None = None) -> list[str]:
    if env is None:  # the default env; ~preset drops a preset that default would pick up
        return [f"algo={algo}", "~preset", "topology=local"]
    return [f"algo={algo}", f"env={env}", *([f"preset={preset}"] if preset else []),
            "topology=local"]


def preflight(cfg):
    """The checks ``runtime/start.py``'s ``checked_start`` makes before it builds anything,
    in its order; returns the algorithm, the env's spaces, and the ConfigError check_spaces
    raised (or None)."""
    validate(cfg, own_checks=False)
    algo = algorithm_for(cfg.algo)
    obs_space, action_space = env_spaces(cfg.env)
    refused = None
    try:
        algo.check_spaces(obs_space, action_space)
    except ConfigError as exc:
        refused = exc
    algo.validate(cfg)
    return algo, obs_space, action_space, refused


# Spaces of each kind a stand-in exists for, to pick one for an algorithm whose default env
# it refuses (e.g. DDPG on CartPole).
KINDS = [
    (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2)),
    (gym.spaces.Box(-np.inf, np.inf, (3,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32)),
    (gym.spaces.Box(0, 255, (4, 42, 42), np.uint8), gym.spaces.Discrete(6)),
]


def accepts(algo, obs_space: gym.Space, action_space: gym.Space) -> bool:
    try:
        algo.check_spaces(obs_space, action_space)
    except ConfigError:
        return False
    return True


def stand_in(obs_space: gym.Space, action_space: gym.Space) -> list[str]:
    """Overrides that swap the env for a small test env with the same kind of spaces."""
    discrete = isinstance(action_space, gym.spaces.Discrete)
    box = isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
    if len(obs_space.shape) == 3 and obs_space.dtype == np.uint8 and discrete:
        stack, size = obs_space.shape[0], min(obs_space.shape[-1], FRAME_SIZE)
        return ["env.id=walle/Frames-v0", f"env.obs_size={size}",
                f"++env.kwargs={{stack: {stack}, size: {size}, num_actions: {action_space.n}}}"]
    if len(obs_space.shape) == 1 and box:
        low, high = action_space.low.tolist(), action_space.high.tolist()
        return ["env.id=walle/Continuous-v0",
                f"++env.kwargs={{obs_dim: {obs_space.shape[0]}, act_dim: {action_space.shape[0]}, "
                f"low: {low}, high: {high}}}"]
    if len(obs_space.shape) == 1 and discrete:
        return ["env.id=walle/Counting-v0", "++env.kwargs={length: 10}"]
    pytest.fail(f"no stand-in test env for observations {obs_space} and actions {action_space}; "
                "add one to walle_ray/envs/testing.py and to stand_in()")


def shrink(cfg) -> list[str]:
    """Overrides that bring the sizes above their ALGO_SIZES / ENV_SIZES bound down to it
    (frame sizes: ``stand_in``)."""
    out = []
    for section, sizes in (("algo", ALGO_SIZES), ("env", ENV_SIZES)):
        for key, most in sizes.items():
            value = cfg[section].get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > most:
                out.append(f"{section}.{key}={most}")
    return out


def is_finite_number(value) -> bool:
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(float(value)))


def fill_and_sample(algo, cfg, sampler) -> tuple[object, object, int]:
    """The memory that ``algo.memory_spec`` names, filled from the sampler until it can serve
    a batch, as an asynchronous LocalFleet.step fills it; returns the memory, the batch and the env steps."""
    cls, args, kwargs = algo.memory(cfg, 0)
    memory = cls(*args, **kwargs)
    env_steps = 0
    for _ in range(MAX_COLLECTS):
        if memory.can_sample():
            return memory, memory.sample(), env_steps
        item, stats = sampler.collect()
        env_steps += stats["env_steps"]
        assert memory.has_room(item), (
            f"the memory has no room for a fragment before it can serve its first batch "
            f"(after {env_steps} env steps): samplers and learners would wait on each other")
        memory.put(item)
    pytest.fail(f"the memory could not serve a batch after {MAX_COLLECTS} fragments "
                f"({env_steps} env steps)")


def check_eval_policy(algo, cfg, weights) -> None:
    """Build the evaluation policy from the config as a checkpoint holds it, the way
    ``runtime/evaluate.py`` does, and act once, greedily and not."""
    trained = OmegaConf.create(to_container(cfg))
    assert algorithm_of(OmegaConf.to_container(trained.algo)) is algo, (
        "a checkpoint of this algo option would be evaluated as another algorithm")
    sections = typed_sections(trained, algo.config_cls)
    env = make_vector_env(dataclasses.replace(sections.env, envs_per_sampler=1))
    try:
        space = env.action_space
        obs = np.array(env.reset(seed=1))
        for deterministic in (True, False):
            policy = algo.eval_policy(env.observation_space, space, sections, 1, deterministic)
            policy.set_weights(weights)
            action = np.asarray(policy.act(obs))
            assert len(action) == 1
            action = action[0]
            if isinstance(space, gym.spaces.Box):
                # A Gaussian policy (PPO, IMPALA) is unbounded, its mean too: the vector env
                # clips its actions to the bounds (GymVectorEnv.step), as here.
                assert action.shape == space.shape and np.all(np.isfinite(action)), action
                action = np.clip(action, space.low, space.high)
            assert space.contains(action), (deterministic, action, space)
    finally:
        env.close()


def stand_in_dataset(where, obs_space: gym.Space, action_space: gym.Space) -> str:
    """A Minari dataset of a few random steps in these spaces, for the offline algorithms
    (``algo.reads_dataset``): their memories serve it in place of samplers."""
    from walle_ray.datasets import DatasetWriter

    writer = DatasetWriter(where, "walle_ray/test/stand_in-v0", obs_space, action_space, None,
                           "a test's stand-in", "test")
    for e in range(2):
        obs = np.stack([obs_space.sample() for _ in range(6)])
        writer.add(obs, np.stack([action_space.sample() for _ in range(5)]), np.ones(5), e == 0)
    writer.flush()
    return f"dataset.path={where}"


@pytest.mark.parametrize("algo_option,env_option,preset", list(cases()))
def test_preset_validates_and_builds_its_roles(algo_option, env_option, preset, tmp_path):
    overrides = case_overrides(algo_option, env_option, preset)
    composed = make_cfg(*overrides)
    offline = algorithm_for(composed.algo).reads_dataset
    if offline:  # checked as named before the stand-in env's dataset is written below
        overrides.append(f"dataset.path={tmp_path / 'data'}")
        composed = make_cfg(*overrides)
    algo, obs_space, action_space, refused = preflight(composed)
    if refused is not None:
        # A preset names an env its algorithm must act in; without one, the default env may
        # be of the wrong kind (e.g. CartPole for DDPG), which a run refuses up front.
        assert env_option is None, f"preset {algo_option}_{env_option}: {refused}"
        accepted = [kind for kind in KINDS if accepts(algo, *kind)]
        assert accepted, f"{algo.name} accepts none of the kinds of spaces in KINDS"
        obs_space, action_space = accepted[0]

    small = [*overrides, *stand_in(obs_space, action_space), *shrink(composed)]
    if offline:
        stand_in_spaces = env_spaces(make_cfg(*small).env)
        small.append(stand_in_dataset(tmp_path / "data", *stand_in_spaces))
    cfg = make_cfg(*small)
    assert algorithm_for(cfg.algo) is algo
    validate(cfg)  # the test's own sizes must be a valid run too
    obs_space, action_space = env_spaces(cfg.env)
    algo.check_spaces(obs_space, action_space)

    topo = parse_topology(cfg.topology.spec)
    assert topo.local
    learner = make_learner(cfg, obs_space, action_space)
    sampler = None  # offline algorithms have none: their memory serves the dataset
    if not offline:
        cls, args, kwargs = algo.sampler(cfg, topo, 0)
        sampler = cls(*args, **kwargs)
    try:
        version, weights = learner.weights()
        if sampler is not None:
            sampler.set_weights(weights, version)
        if algo.memory_spec is None:  # synchronous: the update takes the fragments themselves
            rollout, stats = sampler.collect()
            memory, batches, env_steps = None, [rollout], stats["env_steps"]
        else:
            memory, batch, env_steps = fill_and_sample(algo, cfg, sampler)
            batches = [batch]
        metrics = learner.update(batches, env_steps)
        assert learner.version == version + 1 and metrics["version"] == version + 1
        # Floats, and ints for counters (version, nonfinite_skipped, PPO's epochs).
        not_finite = {k: v for k, v in metrics.items() if not is_finite_number(v)}
        assert not not_finite, f"metrics that are not finite numbers: {not_finite}"
        assert metrics["nonfinite_skipped"] == 0, "the update skipped a non-finite step"
        feedback = learner.memory_feedback()
        if feedback is not None:
            assert memory is not None, "an update sent feedback but no memory served its batch"
            memory.feedback(feedback)
        new_version, new_weights = learner.weights()
        if sampler is not None:
            sampler.set_weights(new_weights, new_version)  # the new weights fit the sampler's copy
        check_eval_policy(algo, cfg, new_weights)
    finally:
        if sampler is not None:
            sampler.close()
        learner.close()


def test_every_preset_is_picked_up_by_some_algo_and_env():
    """A preset is conf/preset/<algo option>_<env option>.yaml (applied by itself) or
    <algo option>_<env option>_<name>.yaml (named with preset=); any other name would not
    be tested above."""
    reachable = {f"{a}_{e}" for a in ALGO_OPTIONS for e in ENV_OPTIONS}
    reachable |= {p for a in ALGO_OPTIONS for e in ENV_OPTIONS for p in named_presets(a, e)}
    assert set(PRESETS) <= reachable, sorted(set(PRESETS) - reachable)


def test_every_registered_algorithm_has_an_algo_option():
    """Each entry of ALGORITHMS is reachable as algo=<option>, so the cases above cover it."""
    reached = {algorithm_for(make_cfg(f"algo={a}", "~preset").algo).name for a in ALGO_OPTIONS}
    assert reached == set(ALGORITHMS), sorted(set(ALGORITHMS) ^ reached)

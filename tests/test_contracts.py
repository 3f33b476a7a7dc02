"""Every algorithm's update, acting policy and writer, and every memory, meet the contracts
the runtime calls them by."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from walle_ray.algos import ALGORITHMS
from walle_ray.buffers.mixed import BufferSpec, MixedMemory
from walle_ray.buffers.prioritized import PrioritizedReplay
from walle_ray.config import ConfigError
from walle_ray.actors.sampler import Sampler
from walle_ray.contracts import ActingPolicy, FeedbackMemory, Memory, SamplerRole, Update, Writer
from walle_ray.learners.collective import Collective

from conftest import make_cfg

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
SPACES = [(OBS, gym.spaces.Discrete(3)), (OBS, gym.spaces.Box(-1.0, 1.0, (2,), np.float32))]


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithms_update_is_an_update(name):
    algo = ALGORITHMS[name]
    cfg = make_cfg(f"algo={name}", "env=pendulum" if name in ("ddpg", "td3", "apex_ddpg") else "env=cartpole")
    for obs_space, action_space in SPACES:
        try:
            algo.check_spaces(obs_space, action_space)
        except ConfigError:
            continue
        model = algo.make_model(obs_space, action_space, cfg)
        update = algo.make_update(cfg, model, Collective(), torch.device("cpu"))
        assert isinstance(update, Update)
        assert update.memory_feedback() is None  # nothing before the first update


@pytest.mark.parametrize("name", sorted(n for n, a in ALGORITHMS.items() if not a.reads_dataset))
def test_every_algorithms_sampler_acts_and_writes_by_the_contracts(name):
    from walle_ray.topology import parse_topology

    algo = ALGORITHMS[name]
    cfg = make_cfg(f"algo={name}", "env=pendulum" if name in ("ddpg", "td3", "apex_ddpg") else "env=cartpole")
    cls, args, kwargs = algo.sampler(cfg, parse_topology("local"), 0)
    sampler = cls(*args, **kwargs)
    try:
        assert isinstance(sampler, SamplerRole)
        if isinstance(sampler, Sampler):  # the one acting loop: the algorithm's policy and writer
            assert isinstance(sampler.policy, ActingPolicy) and isinstance(sampler.writer, Writer)
        else:  # its own loop (ES): it still reports what the runtime sums
            sampler.set_weights(sampler.model.get_weights(), 0)
            _, stats = sampler.collect()
            assert {"env_steps", "episode_returns", "episode_lengths", "policy_version", "env_s",
                    "act_s", "collect_s"} <= set(stats)
    finally:
        sampler.close()


def test_memories_are_memories_and_replay_shards_take_feedback(tmp_path):
    from walle_ray.buffers.dataset import DatasetMemory
    from walle_ray.datasets import DatasetWriter

    mixed = MixedMemory([BufferSpec("queue", 1.0, 8)], batch_rows=4)
    shard = PrioritizedReplay(8, 4, learning_starts=0)
    assert isinstance(mixed, Memory) and not isinstance(mixed, FeedbackMemory)
    assert isinstance(shard, FeedbackMemory)
    writer = DatasetWriter(tmp_path, "walle_ray/test/d-v0", OBS, SPACES[0][1], None, "test", "test")
    writer.add(np.zeros((4, 3), np.float32), np.zeros(3, np.int64), np.ones(3), True)
    writer.flush()
    dataset = DatasetMemory([str(tmp_path)], 0, 1, batch_size=2, gamma=None, seed=0)
    assert isinstance(dataset, Memory) and not isinstance(dataset, FeedbackMemory)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_memory_an_algorithm_builds_is_a_memory(name):
    """An asynchronous algorithm's memories meet ``Memory`` (dataset memories: above); a
    synchronous one's learners take their fragments directly and it names none."""
    algo = ALGORITHMS[name]
    if algo.loop == "sync":
        assert algo.memory_spec is None
        return
    if algo.reads_dataset:
        return
    env = "pendulum" if name in ("ddpg", "td3", "apex_ddpg") else "cartpole"
    cfg = make_cfg(f"algo={name}", f"env={env}", "topology.spec=2a2m1l")
    cls, args, kwargs = algo.memory(cfg, 1)
    memory = cls(*args, **kwargs)
    assert isinstance(memory, Memory)
    assert isinstance(memory, FeedbackMemory) == hasattr(cls, "feedback")


@pytest.mark.parametrize("name,ok", [("dqn", True), ("td3", True), ("impala", False), ("ppo", False)])
def test_only_memories_that_can_be_saved_are_snapshotted(name, ok):
    from walle_ray.algos import validate

    env = "pendulum" if name == "td3" else "cartpole"
    cfg = make_cfg(f"algo={name}", f"env={env}", "memory.checkpoint=true")
    if ok:
        validate(cfg)
    else:
        with pytest.raises(ConfigError, match=r"^memory\.checkpoint: "):
            validate(cfg)

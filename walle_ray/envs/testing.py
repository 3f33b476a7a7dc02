"""Small deterministic environments for tests and benchmarks.

Registered with gymnasium as ``walle/Counting-v0`` and ``walle/Sleep-v0`` so they go through
the same ``env.id=...`` path as any other env.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np


class CountingEnv(gym.Env):
    """Observation is [step-in-episode]; reward 1 per step; ends after ``length`` steps.

    ``truncate=True`` ends by truncation instead of termination. Data is predictable, so
    tests can check shapes, ordering and bootstrapping exactly.
    """

    def __init__(self, length: int = 10, truncate: bool = False):
        self.length = length
        self.truncate = truncate
        self.observation_space = gym.spaces.Box(0, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        end = self.t >= self.length
        return (np.array([self.t], np.float32), 1.0,
                end and not self.truncate, end and self.truncate, {})


class SleepEnv(gym.Env):
    """A slow simulator: each step waits ``step_s`` seconds without using the CPU."""

    def __init__(self, step_s: float = 0.005, length: int = 200, obs_dim: int = 8):
        self.step_s = step_s
        self.length = length
        self.observation_space = gym.spaces.Box(-1, 1, (obs_dim,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample() * 0, {}

    def step(self, action):
        time.sleep(self.step_s)
        self.t += 1
        obs = np.full(self.observation_space.shape, np.sin(self.t), np.float32)
        return obs, float(action), False, self.t >= self.length, {}


def register_test_envs() -> None:
    for env_id, entry in (("walle/Counting-v0", CountingEnv), ("walle/Sleep-v0", SleepEnv)):
        if env_id not in gym.envs.registry:
            gym.register(env_id, entry_point=entry, disable_env_checker=True)

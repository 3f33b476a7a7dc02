"""The vector-env interface every sampler steps, and episode bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import gymnasium as gym
import numpy as np


@dataclass
class Ended:
    """The episodes that ended in one step of B environments (None when none did).

    The row views the sampler passed to ``step`` already hold the step's data: ``obs``
    is the next observation to act on (for an env whose episode just ended, the first
    observation of the next one) and ``reward`` is what the learner sees (clipped for
    Atari). ``final_obs`` holds the last observation of each ended episode in rows where
    ``terminated | truncated``; ``episode_returns`` are raw scores of finished episodes.
    """

    final_obs: np.ndarray  # [B, *obs_shape], valid where terminated | truncated
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)


class VectorEnv(Protocol):
    """B copies of one environment stepped as a batch, with same-step autoreset.

    ``step`` writes into the caller's arrays, so a sampler's fragment is filled in place:
    ``obs`` [B, *obs_shape], ``reward`` [B] float32 and ``terminated`` / ``truncated``
    [B] bool (terminated: the MDP ended, no bootstrap; truncated: cut by a time limit,
    bootstrap from ``final_obs``).
    """

    num_envs: int
    observation_space: gym.Space  # of one env; a FlatSpace (envs/spaces.py) for Dict/Tuple ones
    action_space: gym.Space  # of one env

    def reset(self, seed: int | None = None) -> np.ndarray: ...

    def step(self, actions: np.ndarray, obs: np.ndarray, reward: np.ndarray,
             terminated: np.ndarray, truncated: np.ndarray) -> Ended | None: ...

    def close(self) -> None: ...


class EpisodeTracker:
    """Sums raw rewards per env and reports episodes as they finish."""

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def update(self, raw_reward: np.ndarray, episode_over: np.ndarray) -> tuple[list, list]:
        self.returns += raw_reward
        self.lengths += 1
        if not episode_over.any():
            return [], []
        done = np.flatnonzero(episode_over)
        rets = self.returns[done].tolist()
        lens = self.lengths[done].tolist()
        self.returns[done] = 0.0
        self.lengths[done] = 0
        return rets, lens

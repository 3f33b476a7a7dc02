"""A plain loop over gymnasium environments with same-step autoreset."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from walle_ray.envs.base import EpisodeTracker, StepResult


class GymVectorEnv:
    """B gymnasium envs in one process; cheaper than gymnasium's wrappers for small B.

    ``step`` fills buffers it reuses: its arrays are valid until the next call, except
    ``obs``, which is double-buffered so the caller may act on it during the next step.
    """

    def __init__(self, env_id: str, num_envs: int, max_episode_steps: int | None = None,
                 kwargs: dict | None = None):
        make_kwargs = dict(kwargs or {})
        if max_episode_steps is not None:
            make_kwargs["max_episode_steps"] = max_episode_steps
        self.envs = [gym.make(env_id, **make_kwargs) for _ in range(num_envs)]
        self.num_envs = num_envs
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        self._box_actions = isinstance(self.action_space, gym.spaces.Box)
        self._obs_dtype = (np.float32 if np.issubdtype(self.observation_space.dtype, np.floating)
                           else self.observation_space.dtype)
        self._tracker = EpisodeTracker(num_envs)
        shape = (num_envs, *self.observation_space.shape)
        self._obs = [np.empty(shape, self._obs_dtype), np.empty(shape, self._obs_dtype)]
        self._final_obs = np.zeros(shape, self._obs_dtype)
        self._reward = np.empty(num_envs, np.float32)
        self._terminated = np.empty(num_envs, bool)
        self._truncated = np.empty(num_envs, bool)
        self._flip = 0

    def reset(self, seed: int | None = None) -> np.ndarray:
        obs = [env.reset(seed=None if seed is None else seed + i)[0]
               for i, env in enumerate(self.envs)]
        if seed is not None:
            for i, env in enumerate(self.envs):
                env.action_space.seed(seed + i)
        self._tracker = EpisodeTracker(self.num_envs)
        return np.asarray(obs, dtype=self._obs_dtype)

    def step(self, actions: np.ndarray) -> StepResult:
        if self._box_actions:
            actions = np.clip(actions, self.action_space.low, self.action_space.high)
        obs = self._obs[self._flip]
        self._flip ^= 1
        final_obs, reward = self._final_obs, self._reward
        terminated, truncated = self._terminated, self._truncated
        for i, env in enumerate(self.envs):
            o, r, term, trunc, _ = env.step(actions[i])
            reward[i], terminated[i], truncated[i] = r, term, trunc
            if term or trunc:
                final_obs[i] = o
                o, _ = env.reset()
            obs[i] = o
        rets, lens = self._tracker.update(reward, terminated | truncated)
        return StepResult(obs, reward, terminated, truncated, final_obs, rets, lens)

    def close(self) -> None:
        for env in self.envs:
            env.close()

"""A plain loop over gymnasium environments with same-step autoreset."""

from __future__ import annotations

from typing import Callable

import gymnasium as gym
import numpy as np

from walle_ray.envs.base import Ended
from walle_ray.envs.masks import InfoMask, MaskCheck, resolve_mode
from walle_ray.envs.spaces import FlatSpace, flattens


class GymVectorEnv:
    """B gymnasium envs in one process; cheaper than gymnasium's wrappers for small B.

    Episode bookkeeping is plain Python numbers kept inside the loop over the envs: per
    step it costs less than one numpy call.
    """

    def __init__(self, env_id: str, num_envs: int, max_episode_steps: int | None = None,
                 kwargs: dict | None = None, wrappers: list[Callable[[gym.Env], gym.Env]] = (),
                 action_mask: str = "none"):
        """``wrappers`` wrap each env in order (``env.wrappers``). ``action_mask``
        (``env.action_mask``: auto, obs, info or none) says where the env's action mask is
        (``envs/masks.py``); an info mask is moved into a Dict observation. A Dict or Tuple
        observation is then flattened: ``observation_space`` is its ``FlatSpace``, with the
        mask's columns in ``action_mask``; a Discrete one is one-hot."""
        make_kwargs = dict(kwargs or {})
        if max_episode_steps is not None:
            make_kwargs["max_episode_steps"] = max_episode_steps
        self.envs = [self._make(env_id, make_kwargs, wrappers) for _ in range(num_envs)]
        self.num_envs = num_envs
        mask = resolve_mode(action_mask, self.envs[0], env_id)
        if mask == "info":
            self.envs = [InfoMask(env, env_id) for env in self.envs]
        self.observation_space = self.envs[0].observation_space
        if isinstance(self.observation_space, gym.spaces.Discrete):
            # a state's index (Taxi, FrozenLake) is one-hot, as a Dict's Discrete parts are:
            # a network reading the bare index would have to learn to split it
            self.observation_space = gym.spaces.Box(0.0, 1.0, (int(self.observation_space.n),),
                                                    np.float32)
            self.envs = [gym.wrappers.FlattenObservation(env) for env in self.envs]
        elif flattens(self.observation_space):
            self.observation_space = FlatSpace(self.observation_space,
                                               None if mask == "none" else mask)
            self.envs = [gym.wrappers.FlattenObservation(env) for env in self.envs]
        self.action_space = self.envs[0].action_space
        # Every observation a policy acts on must allow an action (NoActionAllowed).
        self._mask_check = (MaskCheck(self.observation_space.action_mask, self.action_space, env_id)
                            if mask != "none" else None)
        self._box_actions = isinstance(self.action_space, gym.spaces.Box)
        # Discrete actions go to the envs as Python ints; MultiDiscrete and MultiBinary ones
        # as numpy rows of the space's dtype, shifted by its start.
        self._int_actions = isinstance(self.action_space, gym.spaces.Discrete)
        self._action_start = getattr(self.action_space, "start", 0)
        if self._int_actions:
            self._action_start = int(self._action_start)
        self._obs_dtype = (np.float32 if np.issubdtype(self.observation_space.dtype, np.floating)
                           else self.observation_space.dtype)
        self._final_obs = np.zeros((num_envs, *self.observation_space.shape), self._obs_dtype)
        self._returns = [0.0] * num_envs
        self._lengths = [0] * num_envs

    @staticmethod
    def _make(env_id: str, make_kwargs: dict, wrappers) -> gym.Env:
        env = gym.make(env_id, **make_kwargs)
        for wrap in wrappers:
            env = wrap(env)
        return env

    def reset(self, seed: int | None = None) -> np.ndarray:
        obs = [env.reset(seed=None if seed is None else seed + i)[0]
               for i, env in enumerate(self.envs)]
        if seed is not None:
            for i, env in enumerate(self.envs):
                env.action_space.seed(seed + i)
        self._returns = [0.0] * self.num_envs
        self._lengths = [0] * self.num_envs
        obs = np.asarray(obs, dtype=self._obs_dtype)
        if self._mask_check is not None:
            self._mask_check(obs, self._lengths)
        return obs

    def step(self, actions: np.ndarray, obs: np.ndarray, reward: np.ndarray,
             terminated: np.ndarray, truncated: np.ndarray) -> Ended | None:
        if self._box_actions:
            actions = np.clip(actions, self.action_space.low, self.action_space.high)
        elif self._int_actions:  # Python ints take the quick path of Discrete.contains, which CartPole asserts
            actions = (actions + self._action_start if self._action_start else actions).tolist()
        else:
            actions = (actions + self._action_start).astype(self.action_space.dtype)
        returns, lengths = self._returns, self._lengths
        ended = None
        for i, env in enumerate(self.envs):
            o, r, term, trunc, _ = env.step(actions[i])
            r = float(r)  # MuJoCo and others return numpy scalars; returns go to JSON and checkpoints
            reward[i], terminated[i], truncated[i] = r, term, trunc
            returns[i] += r
            lengths[i] += 1
            if term or trunc:
                if ended is None:
                    ended = Ended(self._final_obs)
                ended.final_obs[i] = o
                ended.episode_returns.append(returns[i])
                ended.episode_lengths.append(lengths[i])
                returns[i], lengths[i] = 0.0, 0
                o, _ = env.reset()
            obs[i] = o
        if self._mask_check is not None:
            self._mask_check(obs, lengths)
        return ended

    def close(self) -> None:
        for env in self.envs:
            env.close()

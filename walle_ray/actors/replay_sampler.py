"""The sampler of replay-based algorithms: an explorer stepping envs into n-step transitions."""

from __future__ import annotations

import time
from collections import deque
from types import SimpleNamespace
from typing import Callable, Protocol

import gymnasium as gym
import numpy as np
import torch

from walle_ray.batch import Transitions
from walle_ray.config import EnvConfig, ModelConfig
from walle_ray.envs import make_vector_env


class Explorer(Protocol):
    """An algorithm's acting policy on a replay sampler (e.g. epsilon-greedy Q, noisy actor).

    ``act`` gets this sampler's own env steps so far, for exploration schedules; a greedy
    explorer (for evaluation) acts without exploration noise;
    ``td_error`` gives the initial priorities of new transitions under the sampler's copy of
    the network, as Ape-X computes them.
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, cfg: SimpleNamespace,
                 index: int, num_samplers: int, seed: int, greedy: bool = False): ...

    def set_weights(self, weights: dict[str, np.ndarray]) -> None: ...

    def act(self, obs: np.ndarray, env_steps: int) -> np.ndarray: ...

    def td_error(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
                 discount: np.ndarray, next_obs: np.ndarray) -> np.ndarray: ...

    def stats(self) -> dict[str, float]: ...


class ReplaySampler:
    """Steps ``env.envs_per_sampler`` envs for ``fragment_length`` steps per ``collect`` and
    returns the n-step transitions that completed.

    A transition is emitted once its n rewards are in, or when its episode ends first, so
    the last n - 1 steps of a fragment wait for the next one. A time-limit truncation
    bootstraps from the episode's final observation; a terminal state does not bootstrap.
    """

    def __init__(self, env_cfg: EnvConfig, model_cfg: ModelConfig, algo_cfg, explorer_cls: type,
                 fragment_length: int, index: int = 0, num_samplers: int = 1, seed: int = 0,
                 greedy: bool = False):
        torch.set_num_threads(1)  # many samplers share few cores; intra-op threads only contend
        self.index = index
        self.fragment_length = fragment_length
        self.gamma = float(algo_cfg.gamma)
        # Initial priorities cost a forward pass over every transition; only prioritized
        # shards use them (and evaluation none), so others get NaN: "no priority given".
        self.computes_priority = bool(algo_cfg.prioritized) and not greedy
        self.n_step = int(algo_cfg.n_step)
        self.env = make_vector_env(env_cfg)
        cfg = SimpleNamespace(algo=algo_cfg, model=model_cfg, env=env_cfg)
        self.explorer: Explorer = explorer_cls(self.env.observation_space, self.env.action_space,
                                               cfg, index, num_samplers, seed + 10_007 * index,
                                               greedy=greedy)
        self.version = -1
        self.obs = self.env.reset(seed=seed + 10_007 * index)
        # Per env: (obs, action, reward) of steps whose n-step transition is not complete.
        self.pending: list[deque] = [deque() for _ in range(self.env.num_envs)]
        self.total_steps = 0

    def set_weights(self, weights: dict[str, np.ndarray], version: int) -> None:
        self.explorer.set_weights(weights)
        self.version = version

    def collect(self, ask_at: int = -1, ask: Callable[[], None] | None = None) -> tuple[Transitions, dict]:
        """The transitions completed in one fragment, and stats of the episodes that ended;
        ``ask()`` is called before step ``ask_at`` (as in ``Sampler.collect``)."""
        t0 = time.perf_counter()
        T, B = self.fragment_length, self.env.num_envs
        reward = np.empty(B, np.float32)
        terminated = np.empty(B, bool)
        truncated = np.empty(B, bool)
        out: dict[str, list] = {"obs": [], "action": [], "reward": [], "discount": [], "next_obs": []}
        returns, lengths = [], []
        for t in range(T):
            if t == ask_at:
                ask()
            obs = self.obs
            action = self.explorer.act(obs, self.total_steps)
            next_obs = np.empty_like(obs)
            ended = self.env.step(action, next_obs, reward, terminated, truncated)
            self.total_steps += B
            for b in range(B):
                queue = self.pending[b]
                queue.append((obs[b], action[b], float(reward[b])))
                if terminated[b]:
                    self._flush(queue, None, out)
                elif truncated[b]:
                    self._flush(queue, ended.final_obs[b].copy(), out)
                elif len(queue) == self.n_step:
                    self._emit(queue, next_obs[b], out)
            if ended is not None:
                returns += ended.episode_returns
                lengths += ended.episode_lengths
            self.obs = next_obs
        batch = self._transitions(out)
        stats = {"sampler": self.index, "env_steps": T * B, "episode_returns": returns,
                 "episode_lengths": lengths, "policy_version": self.version,
                 "transitions": batch.num_steps, "collect_s": time.perf_counter() - t0,
                 **{f"explore/{k}": v for k, v in self.explorer.stats().items()}}
        return batch, stats

    def _emit(self, queue: deque, bootstrap_obs: np.ndarray | None, out: dict) -> None:
        """The oldest pending step as a transition over every reward now in the queue."""
        obs, action, _ = queue[0]
        total, scale = 0.0, 1.0
        for _, _, r in queue:
            total += scale * r
            scale *= self.gamma
        queue.popleft()
        out["obs"].append(obs)
        out["action"].append(action)
        out["reward"].append(total)
        out["discount"].append(0.0 if bootstrap_obs is None else scale)
        out["next_obs"].append(obs if bootstrap_obs is None else bootstrap_obs)

    def _flush(self, queue: deque, bootstrap_obs: np.ndarray | None, out: dict) -> None:
        """An episode ended: every pending step becomes a (shorter) transition."""
        while queue:
            self._emit(queue, bootstrap_obs, out)

    def _transitions(self, out: dict) -> Transitions:
        n = len(out["reward"])
        obs_shape, obs_dtype = self.obs.shape[1:], self.obs.dtype
        if n == 0:
            obs = np.empty((0, *obs_shape), obs_dtype)
            space = self.env.action_space
            action = (np.empty(0, np.int64) if isinstance(space, gym.spaces.Discrete)
                      else np.empty((0, *space.shape), np.float32))
            return Transitions(obs=obs, action=action, reward=np.empty(0, np.float32),
                               discount=np.empty(0, np.float32), next_obs=obs.copy(),
                               priority=np.empty(0, np.float32),
                               version_b=np.empty(0, np.int64))
        obs, next_obs = np.stack(out["obs"]), np.stack(out["next_obs"])
        action = np.stack(out["action"])
        reward = np.asarray(out["reward"], np.float32)
        discount = np.asarray(out["discount"], np.float32)
        priority = (self.explorer.td_error(obs, action, reward, discount, next_obs)
                    if self.computes_priority else np.full(n, np.nan))
        return Transitions(obs=obs, action=action, reward=reward, discount=discount,
                           next_obs=next_obs, priority=np.asarray(priority, np.float32),
                           version_b=np.full(n, self.version, np.int64))

    def close(self) -> None:
        self.env.close()

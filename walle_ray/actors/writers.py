"""How a sampler packs the steps it takes: the ``Writer`` contract (``walle_ray/contracts.py``).

``FragmentWriter`` keeps every step of a fixed-length fragment (policy-gradient methods);
``TransitionWriter`` turns steps into n-step transitions (replay-based methods).
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import gymnasium as gym
import numpy as np
import torch

from walle_ray.batch import Rollout, Transitions
from walle_ray.envs import Ended


class FragmentWriter:
    """Keeps every step of a ``[T, B]`` fragment as a ``Rollout``.

    The env writes each step straight into the fragment's arrays: the next observation into
    ``obs_t[t + 1]`` (the last into ``last_obs``), rewards and flags into row ``t``. The
    policy's outputs (``ActorCriticActing.act``'s extras) stay tensors until the fragment
    ends and are stacked once: actions [T, B] for Discrete, [T, B, k] for Box, MultiDiscrete
    and MultiBinary, whatever the action head samples.

    With a separate critic (vector observations) the policy acts without it, and the values
    of all T + 1 observations (T without ``bootstrap_value``) are computed in one batch once
    the fragment ends: one critic pass per fragment instead of one per step.

    Where the policy encodes the states it acts on (elite replay), the encodings go with
    the fragment as ``feature_t``.

    A recurrent policy's state at the fragment's first step goes with it as ``state_b``
    (``ActorCriticActing.core_state``); its values come with each step, and a truncated
    episode's final observation is valued from that env's state before it is reset.

    ``bootstrap_value``: compute ``last_v``, the value of the observation after the
    fragment, and ``final_v_t``, the values of truncated episodes' final observations.
    Algorithms whose learners compute them with their own newer network (IMPALA, from
    ``last_obs`` and ``final_obs``) turn it off; for a conv net that saves one forward pass
    per fragment. Off, both are NaN, so a learner that reads them anyway fails loudly
    instead of learning from zeros.
    """

    def __init__(self, policy, env, fragment_length: int, gamma: float,
                 track_return: bool = False, bootstrap_value: bool = True):
        """``track_return``: fill ``return_t``, the running discounted return that reward
        scaling reads (``env.normalize_reward``); otherwise it is zeros and costs nothing."""
        self.policy = policy
        self.T, self.B = fragment_length, env.num_envs
        self.gamma = gamma
        self.track_return = track_return
        self.bootstrap_value = bootstrap_value
        self.disc_return = np.zeros(self.B, dtype=np.float32)

    def start(self, obs: np.ndarray) -> None:
        T, B = self.T, self.B
        self.obs_all = np.empty((T + 1, *obs.shape), dtype=obs.dtype)  # [obs_t; last_obs]
        self.obs_all[0] = obs
        self.reward_t = np.empty((T, B), np.float32)
        self.terminated_t = np.empty((T, B), bool)
        self.truncated_t = np.empty((T, B), bool)
        self.final_v_t = np.zeros((T, B), np.float32)
        self.state_b = self.policy.core_state(B)  # a recurrent policy's state at step 0
        self.steps: list = []  # (action, logp, dist params, value or None, encoding or None) per step
        self.finals: list = []  # final observations of truncated steps, in (time, row) order

    def slots(self, t: int) -> tuple:
        return self.obs_all[t + 1], self.reward_t[t], self.terminated_t[t], self.truncated_t[t]

    def add(self, t: int, obs: np.ndarray, action: np.ndarray, extras, next_obs: np.ndarray,
            ended: Ended | None) -> None:
        self.steps.append(extras)
        if ended is not None:
            rows = np.flatnonzero(self.truncated_t[t])
            if rows.size:  # a time limit: the value after it bootstraps the return
                self.finals.append(ended.final_obs[rows])
                self.final_v_t[t, rows] = (self.policy.value(self.finals[-1], rows)
                                           if self.bootstrap_value else np.nan)

    def finish(self, last_obs: np.ndarray, version: int) -> tuple[Rollout, dict]:
        T, B = self.T, self.B
        obs_all = self.obs_all
        obs_t = obs_all[:T]
        actions, logps, params, values, encoded = zip(*self.steps)
        valued = obs_all if self.bootstrap_value else obs_t  # the observations to value
        if values[0] is None:  # a separate critic: value every observation at once
            v_all = self.policy.value(valued.reshape(-1, *obs_all.shape[2:])).reshape(-1, B)
            v_t = v_all[:T]
        else:
            v_t = torch.stack(values).numpy()
        if not self.bootstrap_value:
            last_v = np.full(B, np.nan, np.float32)
        else:
            last_v = v_all[T] if values[0] is None else self.policy.value(last_obs)
        rollout = Rollout(obs_t=obs_t, action_t=torch.stack(actions).numpy(),
                          reward_t=self.reward_t, terminated_t=self.terminated_t,
                          truncated_t=self.truncated_t, logp_t=torch.stack(logps).numpy(),
                          dist_t=torch.stack(params).numpy(), v_t=v_t, final_v_t=self.final_v_t,
                          final_obs=(np.concatenate(self.finals) if self.finals else
                                     np.empty((0, *obs_all.shape[2:]), obs_all.dtype)),
                          return_t=self._discounted_returns(),
                          last_obs=obs_all[T], last_v=last_v,
                          version_b=np.full(B, version, np.int64), replayed_b=np.zeros(B, bool),
                          state_b=self.state_b,
                          feature_t=None if encoded[0] is None else torch.stack(encoded).numpy())
        return rollout, {}

    def _discounted_returns(self) -> np.ndarray:
        """Running discounted return of each env at each step, reset after an episode ends
        and carried across fragments. Plain floats: cheaper than numpy for one column."""
        return_t = np.zeros_like(self.reward_t)
        if not self.track_return:
            return return_t
        gamma, done_t = self.gamma, self.terminated_t | self.truncated_t
        for b, (rewards, dones) in enumerate(zip(self.reward_t.T.tolist(), done_t.T.tolist())):
            g = float(self.disc_return[b])
            column = []
            for r, d in zip(rewards, dones):
                g = g * gamma + r
                column.append(g)
                if d:
                    g = 0.0
            return_t[:, b] = column
            self.disc_return[b] = g
        return return_t


class TransitionWriter:
    """Turns steps into n-step transitions (``Transitions``) as their rewards come in.

    A transition is emitted once its n rewards are in, or when its episode ends first, so
    the last n - 1 steps of a fragment wait for the next one. A time-limit truncation
    bootstraps from the episode's final observation; a terminal state does not bootstrap.

    ``priority(obs, action, reward, discount, next_obs)`` gives new transitions their
    initial priorities (Ape-X computes them on the sampler); None leaves them NaN, "no
    priority given", for uniform shards and evaluation.
    """

    def __init__(self, env, n_step: int, gamma: float, priority: Callable | None = None):
        self.n_step, self.gamma = n_step, gamma
        self.priority = priority
        self.action_space = env.action_space
        B = env.num_envs
        self.reward = np.empty(B, np.float32)
        self.terminated = np.empty(B, bool)
        self.truncated = np.empty(B, bool)
        # Per env: (obs, action, reward) of steps whose n-step transition is not complete.
        self.pending: list[deque] = [deque() for _ in range(B)]

    def start(self, obs: np.ndarray) -> None:
        self.obs_like = obs
        self.out: dict[str, list] = {"obs": [], "action": [], "reward": [], "discount": [],
                                     "next_obs": []}

    def slots(self, t: int) -> tuple:
        return np.empty_like(self.obs_like), self.reward, self.terminated, self.truncated

    def add(self, t: int, obs: np.ndarray, action: np.ndarray, extras, next_obs: np.ndarray,
            ended: Ended | None) -> None:
        for b, queue in enumerate(self.pending):
            queue.append((obs[b], action[b], float(self.reward[b])))
            if self.terminated[b]:
                self._flush(queue, None)
            elif self.truncated[b]:
                self._flush(queue, ended.final_obs[b].copy())
            elif len(queue) == self.n_step:
                self._emit(queue, next_obs[b])

    def _emit(self, queue: deque, bootstrap_obs: np.ndarray | None) -> None:
        """The oldest pending step as a transition over every reward now in the queue."""
        obs, action, _ = queue[0]
        total, scale = 0.0, 1.0
        for _, _, r in queue:
            total += scale * r
            scale *= self.gamma
        queue.popleft()
        out = self.out
        out["obs"].append(obs)
        out["action"].append(action)
        out["reward"].append(total)
        out["discount"].append(0.0 if bootstrap_obs is None else scale)
        out["next_obs"].append(obs if bootstrap_obs is None else bootstrap_obs)

    def _flush(self, queue: deque, bootstrap_obs: np.ndarray | None) -> None:
        """An episode ended: every pending step becomes a (shorter) transition."""
        while queue:
            self._emit(queue, bootstrap_obs)

    def finish(self, last_obs: np.ndarray, version: int) -> tuple[Transitions, dict]:
        out, n = self.out, len(self.out["reward"])
        if n == 0:
            obs = np.empty((0, *last_obs.shape[1:]), last_obs.dtype)
            action = (np.empty(0, np.int64) if isinstance(self.action_space, gym.spaces.Discrete)
                      else np.empty((0, *self.action_space.shape), np.float32))
            batch = Transitions(obs=obs, action=action, reward=np.empty(0, np.float32),
                                discount=np.empty(0, np.float32), next_obs=obs.copy(),
                                priority=np.empty(0, np.float32), version_b=np.empty(0, np.int64))
            return batch, {"transitions": 0}
        obs, next_obs = np.stack(out["obs"]), np.stack(out["next_obs"])
        action = np.stack(out["action"])
        reward = np.asarray(out["reward"], np.float32)
        discount = np.asarray(out["discount"], np.float32)
        priority = (self.priority(obs, action, reward, discount, next_obs)
                    if self.priority is not None else np.full(n, np.nan))
        batch = Transitions(obs=obs, action=action, reward=reward, discount=discount,
                            next_obs=next_obs, priority=np.asarray(priority, np.float32),
                            version_b=np.full(n, version, np.int64))
        return batch, {"transitions": n}

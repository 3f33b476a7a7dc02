"""The sampler role: a policy copy stepping a vector of envs into fixed-length fragments."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from walle_ray.batch import Rollout
from walle_ray.config import EnvConfig, ModelConfig
from walle_ray.envs import make_vector_env
from walle_ray.models import make_actor_critic


class Sampler:
    """Steps ``env.envs_per_sampler`` envs for ``fragment_length`` steps per call to ``collect``.

    Policy inference is one batched forward pass per step across the envs. The env state
    carries over between fragments, so episodes span fragment boundaries.
    """

    def __init__(self, env_cfg: EnvConfig, model_cfg: ModelConfig, fragment_length: int,
                 gamma: float, index: int = 0, seed: int = 0, deterministic: bool = False,
                 bootstrap_value: bool = True):
        """``bootstrap_value``: compute ``last_v``, the value of the observation after the
        fragment, and ``final_v_t``, the values of truncated episodes' final observations.
        Algorithms whose learners compute them with their own newer network (IMPALA, from
        ``last_obs`` and ``final_obs``) turn it off; for a conv net that saves one forward
        pass per fragment. Off, both are NaN, so a learner that reads them anyway fails
        loudly instead of learning from zeros."""
        torch.set_num_threads(1)  # many samplers share few cores; intra-op threads only contend
        self.index = index
        self.fragment_length = fragment_length
        self.gamma = gamma
        self.deterministic = deterministic
        self.bootstrap_value = bootstrap_value
        self.env = make_vector_env(env_cfg)
        self.model = make_actor_critic(self.env.observation_space, self.env.action_space,
                                       model_cfg, env_cfg.normalize_obs)
        self.model.eval()
        self.version = -1
        self.obs = self.env.reset(seed=seed + 10_007 * index)
        # The discounted return only feeds reward scaling; skip it when that is off.
        self.track_return = bool(env_cfg.normalize_reward)
        self.disc_return = np.zeros(self.env.num_envs, dtype=np.float32)
        self.total_steps = 0

    def set_weights(self, weights: dict[str, np.ndarray], version: int) -> None:
        self.model.set_weights(weights)
        self.version = version

    def _value(self, obs: np.ndarray) -> np.ndarray:
        """State values of ``obs`` (called under the fragment's inference mode)."""
        return self.model.value(torch.from_numpy(obs)).numpy()

    @torch.inference_mode()
    def collect(self, ask_at: int = -1, ask: Callable[[], None] | None = None) -> tuple[Rollout, dict]:
        """One fragment, and stats of the episodes that ended during it.

        The env writes each step straight into the fragment's arrays: the next
        observation into ``obs_t[t + 1]`` (the last into ``last_obs``), rewards and flags
        into row ``t``. The policy's outputs stay tensors until the fragment ends and are
        stacked once: per step, only the actions become numpy, for the envs.
        ``ask()`` is called before step ``ask_at``, so a Ray sampler can ask for newer weights
        while the fragment's last steps run (``SamplerWorker``).

        With a separate critic (vector observations) each step runs the policy alone, and the
        values of all T + 1 observations (T without ``bootstrap_value``) are computed in one
        batch once the fragment ends: the critic costs one forward pass per fragment instead
        of one per step."""
        t0 = time.perf_counter()
        T, B = self.fragment_length, self.env.num_envs
        model, head, deterministic, step = self.model, self.model.head, self.deterministic, self.env.step
        separate = model.separate_critic
        obs_all = np.empty((T + 1, *self.obs.shape), dtype=self.obs.dtype)  # [obs_t; last_obs]
        obs_all[0] = self.obs
        obs_t, last_obs = obs_all[:T], obs_all[T]
        reward_t = np.empty((T, B), np.float32)
        terminated_t = np.empty((T, B), bool)
        truncated_t = np.empty((T, B), bool)
        final_v_t = np.zeros((T, B), np.float32)
        actions, logps, params, values = [], [], [], []
        finals = []  # final observations of truncated steps, in (time, row) order
        returns, lengths = [], []
        for t in range(T):
            if t == ask_at:
                ask()
            if separate:
                dist_params = model.policy(torch.from_numpy(obs_all[t]))
            else:
                dist_params, value = model(torch.from_numpy(obs_all[t]))
                values.append(value)
            action, logp = head.act(dist_params, deterministic)
            actions.append(action)
            logps.append(logp)
            params.append(dist_params)
            ended = step(action.numpy(), obs_all[t + 1], reward_t[t], terminated_t[t], truncated_t[t])
            if ended is not None:
                rows = np.flatnonzero(truncated_t[t])
                if rows.size:  # a time limit: the value after it bootstraps the return
                    finals.append(ended.final_obs[rows])
                    final_v_t[t, rows] = (self._value(finals[-1]) if self.bootstrap_value
                                          else np.nan)
                returns += ended.episode_returns
                lengths += ended.episode_lengths
        self.obs = last_obs
        valued = obs_all if self.bootstrap_value else obs_t  # the observations to value
        if separate:
            v_all = self._value(valued.reshape(-1, *self.obs.shape[1:])).reshape(-1, B)
            v_t = v_all[:T]
        else:
            v_t = torch.stack(values).numpy()
        if not self.bootstrap_value:
            last_v = np.full(B, np.nan, np.float32)
        else:
            last_v = v_all[T] if separate else self._value(last_obs)
        self.total_steps += T * B
        rollout = Rollout(obs_t=obs_t, action_t=torch.stack(actions).numpy(), reward_t=reward_t,
                          terminated_t=terminated_t, truncated_t=truncated_t,
                          logp_t=torch.stack(logps).numpy(),
                          dist_t=torch.stack(params).numpy(),
                          v_t=v_t, final_v_t=final_v_t,
                          final_obs=(np.concatenate(finals) if finals else
                                     np.empty((0, *self.obs.shape[1:]), self.obs.dtype)),
                          return_t=self._discounted_returns(reward_t, terminated_t, truncated_t),
                          last_obs=last_obs, last_v=last_v,
                          version_b=np.full(B, self.version, np.int64),
                          replayed_b=np.zeros(B, bool))
        stats = {"sampler": self.index, "env_steps": T * B, "episode_returns": returns,
                 "episode_lengths": lengths, "policy_version": self.version,
                 "collect_s": time.perf_counter() - t0}
        return rollout, stats

    def _discounted_returns(self, reward_t: np.ndarray, terminated_t: np.ndarray,
                            truncated_t: np.ndarray) -> np.ndarray:
        """Running discounted return of each env at each step, reset after an episode ends
        and carried across fragments; it feeds reward scaling only, so it is zeros (and
        costs nothing) when that is off. Plain floats: cheaper than numpy for one column."""
        return_t = np.zeros_like(reward_t)
        if not self.track_return:
            return return_t
        gamma, done_t = self.gamma, terminated_t | truncated_t
        for b, (rewards, dones) in enumerate(zip(reward_t.T.tolist(), done_t.T.tolist())):
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

    def close(self) -> None:
        self.env.close()

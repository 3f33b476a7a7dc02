"""The sampler role: one acting loop that steps a vector of envs with a policy copy and hands
every step to the writer its algorithm chose (``walle_ray/actors/writers.py``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from walle_ray.config import EnvConfig
from walle_ray.envs import make_vector_env
from walle_ray.pulse import PULSE

if TYPE_CHECKING:
    from walle_ray.contracts import ActingPolicy, WeightsFeed, Writer


class Sampler:
    """Steps ``env.envs_per_sampler`` envs for ``fragment_length`` steps per call to ``collect``.

    The loop is the same for every algorithm: one batched ``policy.act`` per step across the
    envs, the env step, episode bookkeeping, and the weights request before the fragment
    ends. What becomes of each step is the writer's: fixed-length fragments
    (``FragmentWriter``: PPO, IMPALA) or n-step transitions (``TransitionWriter``: DQN,
    DDPG). The env state carries over between fragments, so episodes span their boundaries.

    ``make_policy(obs_space, action_space, index, seed)`` builds the acting policy and
    ``make_writer(policy, env, fragment_length)`` its writer, in the sampler's own process.
    """

    def __init__(self, env_cfg: EnvConfig, make_policy: Callable[..., ActingPolicy],
                 make_writer: Callable[..., Writer], fragment_length: int, index: int = 0,
                 seed: int = 0):
        self.index = index
        self.fragment_length = fragment_length
        self.env = make_vector_env(env_cfg)
        seed = seed + 10_007 * index
        self.policy = make_policy(self.env.observation_space, self.env.action_space, index, seed)
        self.writer = make_writer(self.policy, self.env, fragment_length)
        # A recurrent policy zeroes the state of envs whose episode ended (ActingPolicy.reset).
        self.reset = getattr(self.policy, "reset", None)
        self.version = -1
        self.obs = self.env.reset(seed=seed)
        self.total_steps = 0

    def set_weights(self, weights: dict[str, np.ndarray], version: int) -> None:
        self.policy.set_weights(weights)
        self.version = version

    @torch.inference_mode()
    def collect(self, feed: WeightsFeed | None = None) -> tuple:
        """One fragment's worth of data, as the writer packs it, and stats of the episodes
        that ended during it. ``feed`` (``contracts.WeightsFeed``) gives the weights before
        the fragment, and is told ``feed.lead`` steps before it ends, so a Ray sampler can
        ask for newer weights while the fragment's last steps run (``SamplerWorker``).

        The stats split the loop's time in two (the bottleneck report, ``walle_ray/bottleneck.py``):
        ``act_s``, the policy's act (with the weights request), and ``env_s``, the env step
        with the writer's and the episodes' bookkeeping after it."""
        ask_at = -1
        if feed is not None:
            feed.refresh(self)
            ask_at = self.fragment_length - feed.lead if feed.lead > 0 else -1
        t0, cpu0 = time.perf_counter(), time.process_time()
        clock = time.perf_counter
        B = self.env.num_envs
        act, step, writer = self.policy.act, self.env.step, self.writer
        obs, steps = self.obs, self.total_steps
        writer.start(obs)
        returns, lengths = [], []
        act_s = env_s = 0.0
        pulse = PULSE  # each step is progress (docs/faults.md, "Stalled roles")
        mark = clock()  # two clock reads a step: each ends one phase and starts the next
        for t in range(self.fragment_length):
            if t == ask_at:
                feed.ahead()
            action, extras = act(obs, steps)
            next_obs, reward, terminated, truncated = writer.slots(t)
            acted = clock()
            act_s += acted - mark
            ended = step(action, next_obs, reward, terminated, truncated)
            writer.add(t, obs, action, extras, next_obs, ended)
            if ended is not None:
                if self.reset is not None:
                    self.reset(terminated | truncated)
                returns += ended.episode_returns
                lengths += ended.episode_lengths
            steps += B
            obs = next_obs
            mark = pulse.at = clock()
            env_s += mark - acted
        self.obs, self.total_steps = obs, steps
        pulse.beat()
        item, written = writer.finish(obs, self.version)
        stats = {"sampler": self.index, "env_steps": self.fragment_length * B,
                 "episode_returns": returns, "episode_lengths": lengths,
                 "policy_version": self.version, **written,
                 **{f"explore/{k}": v for k, v in self.policy.stats().items()},
                 "env_s": env_s, "act_s": act_s, "collect_s": time.perf_counter() - t0,
                 "cpu_s": time.process_time() - cpu0}
        return item, stats

    def close(self) -> None:
        self.env.close()

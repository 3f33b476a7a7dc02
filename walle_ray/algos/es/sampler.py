"""ES's sampler: evaluates antithetic perturbations of the current weights, B at a time."""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

import numpy as np
import torch

from walle_ray.envs import make_vector_env
from walle_ray.pulse import PULSE


@dataclass
class Evaluations:
    """What a sampler sends the learner for each perturbation pair: where its noise starts
    in the shared table, the returns and lengths of its +sigma and -sigma episodes, never
    weights; and the moments of the observations it saw (for the shared normaliser)."""

    offset: np.ndarray  # [n] int64 start of the pair's noise in the table
    return_pos: np.ndarray  # [n] float64 episode return with theta + sigma * eps
    return_neg: np.ndarray  # [n] float64 episode return with theta - sigma * eps
    length_pos: np.ndarray  # [n] int64
    length_neg: np.ndarray  # [n] int64
    version_b: np.ndarray  # [n] int64 version of the theta that was perturbed
    obs_moments: np.ndarray  # [1 + 2 D] float64 count, sums, sums of squares of observations

    @property
    def num_steps(self) -> int:
        return int(self.length_pos.sum() + self.length_neg.sum())

    def check(self) -> None:
        n = self.offset.shape[0]
        for f in fields(self):
            if f.name != "obs_moments" and getattr(self, f.name).shape != (n,):
                raise ValueError(f"Evaluations.{f.name} has shape {getattr(self, f.name).shape}, "
                                 f"expected ({n},)")


def resolve_table(source) -> np.ndarray:
    """The noise table: under Ray ``source`` names the ``RefHolder`` whose box holds the
    table's ObjectRef, read zero-copy from the node's object store (one copy per node);
    else it is a one-element list holding the array."""
    if not isinstance(source, str):
        return source[0]
    import ray

    box = ray.get(ray.get_actor(source).get.remote())
    return ray.get(box[0])


class ESSampler:
    """Each ``collect`` evaluates ``pairs`` antithetic pairs: 2 x pairs whole episodes, each
    from a fresh reset, B envs at a time, env b acting with its own perturbed parameters
    (``ESPolicy.act_batched``); an env whose episode ends takes the next waiting
    perturbation. Every episode of a call perturbs the weights the call started with.
    """

    def __init__(self, env_cfg, model_factory, pairs: int, noise_std: float,
                 action_noise_std: float, table_source, index: int = 0, seed: int = 0):
        self.index = index
        self.pairs = pairs
        self.noise_std = noise_std
        self.action_noise_std = action_noise_std
        self.env = make_vector_env(env_cfg)
        self.model = model_factory(self.env.observation_space, self.env.action_space)
        self.model.eval()
        self.table = resolve_table(table_source)
        self.seed = seed + 10_007 * index
        self.rng = np.random.default_rng(self.seed)
        self.version = -1
        self.fragment_length = 1  # the asynchronous loop's notion; ES runs synchronously

    def set_weights(self, weights, version: int) -> None:
        self.model.set_weights(weights)
        self.version = version

    @torch.inference_mode()
    def collect(self, feed=None) -> tuple[Evaluations, dict]:
        """A call's episodes from the weights ``feed`` gives (``contracts.WeightsFeed``;
        none: the ones it holds), and its report."""
        from walle_ray.algos.es.ops import sample_offsets

        if feed is not None:
            feed.refresh(self)
        t0 = time.perf_counter()
        clock = time.perf_counter
        model, env, B = self.model, self.env, self.env.num_envs
        theta = model.flat_params()
        dim = theta.numel()
        # Drawn from the sampler's seed and the weights' version: a resumed run or a rebuilt
        # sampler goes on with new perturbations, not the ones the run started with.
        self.rng = np.random.default_rng([self.seed, self.version + 1])
        offsets = sample_offsets(self.rng, len(self.table), dim, self.pairs)
        # episode j: pair j // 2, sign + for even j
        jobs = list(range(2 * self.pairs))
        returns = np.zeros(2 * self.pairs)
        lengths = np.zeros(2 * self.pairs, np.int64)
        job_of = np.full(B, -1)
        params = theta.expand(B, dim).clone()

        def start(b: int) -> None:
            job_of[b] = jobs.pop(0) if jobs else -1
            if job_of[b] >= 0:
                pair, sign = divmod(int(job_of[b]), 2)
                eps = torch.from_numpy(self.table[offsets[pair]: offsets[pair] + dim])
                params[b] = theta + (self.noise_std if sign == 0 else -self.noise_std) * eps

        obs = env.reset(seed=int(self.rng.integers(2**31)))
        for b in range(B):
            start(b)
        next_obs = np.empty_like(obs)
        reward = np.zeros(B, np.float32)
        terminated, truncated = np.zeros(B, bool), np.zeros(B, bool)
        moments = np.zeros(1 + 2 * int(np.prod(obs.shape[1:])))
        env_steps = 0
        act_s = env_s = 0.0
        returns_env = np.zeros(B)
        while (job_of >= 0).any():
            mark = clock()
            active = job_of >= 0
            flat = obs[active].reshape(int(active.sum()), -1).astype(np.float64)
            moments += np.concatenate([[len(flat)], flat.sum(0), (flat * flat).sum(0)])
            action = model.act_batched(torch.from_numpy(obs), params).numpy()
            if self.action_noise_std and not model.discrete:
                action = np.clip(action + self.action_noise_std * self.rng.standard_normal(action.shape),
                                 env.action_space.low, env.action_space.high).astype(np.float32)
            acted = PULSE.at = clock()  # each step is progress (docs/faults.md, "Stalled roles")
            env.step(action, next_obs, reward, terminated, truncated)
            env_steps += int(active.sum())  # an env with no perturbation left idles uncounted
            returns_env += reward
            for b in np.flatnonzero(active):
                lengths[job_of[b]] += 1
            for b in np.flatnonzero(terminated | truncated):
                if job_of[b] >= 0:
                    returns[job_of[b]] = returns_env[b]
                returns_env[b] = 0.0
                start(b)
            obs, next_obs = next_obs, obs
            env_s += clock() - acted
            act_s += acted - mark
        evaluations = Evaluations(offset=offsets.astype(np.int64), return_pos=returns[0::2],
                                  return_neg=returns[1::2], length_pos=lengths[0::2],
                                  length_neg=lengths[1::2],
                                  version_b=np.full(self.pairs, self.version, np.int64),
                                  obs_moments=moments)
        stats = {"sampler": self.index, "env_steps": env_steps, "episode_returns": returns.tolist(),
                 "episode_lengths": lengths.tolist(), "policy_version": self.version,
                 "env_s": env_s, "act_s": act_s, "collect_s": time.perf_counter() - t0}
        PULSE.beat()
        return evaluations, stats

    def close(self) -> None:
        self.env.close()

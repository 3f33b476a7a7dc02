"""Epsilon-greedy acting on a replay sampler, with Ape-X's per-sampler epsilons."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from walle_ray.algos.dqn.loss import q_targets
from walle_ray.models.factory import make_q_network
from walle_ray.models.masking import random_allowed


def sampler_epsilon(cfg, index: int, num_samplers: int, run_steps: int) -> float:
    """Ape-X: eps ** (1 + alpha * i / (N - 1)), fixed; anneal: linear from start to final over
    the run's env steps (this sampler's steps times the number of samplers)."""
    if cfg.exploration == "apex":
        if num_samplers == 1:
            return cfg.apex_epsilon
        return cfg.apex_epsilon ** (1 + cfg.apex_alpha * index / (num_samplers - 1))
    frac = min(1.0, run_steps / max(1, cfg.epsilon_anneal_steps))
    return cfg.epsilon_start + frac * (cfg.epsilon_final - cfg.epsilon_start)


class DQNExplorer:
    """Acts greedily on the sampler's Q-network copy, randomly with probability epsilon;
    both over the actions the env allows, where it masks them (``env.action_mask``)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, cfg, index: int,
                 num_samplers: int, seed: int, greedy: bool = False):
        self.cfg = cfg.algo
        self.greedy = greedy
        self.index, self.num_samplers = index, num_samplers
        self.model = make_q_network(obs_space, action_space, cfg).eval()
        self.num_actions = int(action_space.n)
        self.rng = np.random.default_rng(seed)
        self.epsilon = 0.0 if greedy else sampler_epsilon(self.cfg, index, num_samplers, 0)

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        self.model.set_weights(weights)

    @torch.inference_mode()
    def act(self, obs: np.ndarray, env_steps: int) -> np.ndarray:
        self.epsilon = 0.0 if self.greedy else sampler_epsilon(
            self.cfg, self.index, self.num_samplers, env_steps * self.num_samplers)
        greedy = self.model(torch.from_numpy(obs)).argmax(dim=-1).numpy()
        explore = self.rng.random(len(obs)) < self.epsilon
        if self.model.mask is None:
            random = self.rng.integers(self.num_actions, size=len(obs))
        else:
            random = random_allowed(self.rng, self.model.mask.allowed_np(obs))
        return np.where(explore, random, greedy)

    @torch.inference_mode()
    def td_error(self, obs, action, reward, discount, next_obs) -> np.ndarray:
        n = len(obs)
        q = self.model(torch.from_numpy(np.concatenate([obs, next_obs])))
        target = q_targets(torch.from_numpy(reward), torch.from_numpy(discount), q[n:], q[n:])
        taken = q[:n].gather(-1, torch.from_numpy(action).long().unsqueeze(-1)).squeeze(-1)
        return (target - taken).abs().numpy()

    def stats(self) -> dict[str, float]:
        return {"epsilon": self.epsilon}

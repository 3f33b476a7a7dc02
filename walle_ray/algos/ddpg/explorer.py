"""Acting on a replay sampler: uniform random actions first, then the actor plus noise."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch

from walle_ray.algos.ddpg.loss import critic_targets
from walle_ray.models.factory import make_deterministic_model


class DDPGExplorer:
    """The sampler's copy of the actor, with Gaussian or Ornstein-Uhlenbeck exploration noise.

    For its first ``random_steps / num_samplers`` env steps a sampler acts uniformly at
    random (filling the shards with diverse data before the untrained actor takes over).
    Noise is ``exploration_noise`` times the action half-range; OU noise keeps one state per
    env, carried across episode boundaries. A greedy explorer (evaluation) always acts with
    the plain actor.
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.spaces.Box, cfg, index: int,
                 num_samplers: int, seed: int, greedy: bool = False):
        a = cfg.algo
        self.model = make_deterministic_model(obs_space, action_space, cfg).eval()
        self.low = action_space.low.astype(np.float32)
        self.high = action_space.high.astype(np.float32)
        self.sigma = (a.exploration_noise * (self.high - self.low) / 2).astype(np.float32)
        self.ou = a.exploration == "ou"
        self.ou_theta = float(a.ou_theta)
        self.ou_state: np.ndarray | None = None  # [B, act_dim]
        self.greedy = greedy
        self.random_steps = 0 if greedy else math.ceil(a.random_steps / num_samplers)
        self.exploration_noise = 0.0 if greedy else float(a.exploration_noise)
        self.random = self.random_steps > 0
        self.rng = np.random.default_rng(seed)

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        self.model.set_weights(weights)

    @torch.inference_mode()
    def act(self, obs: np.ndarray, env_steps: int) -> np.ndarray:
        """obs [B, obs_dim] -> actions [B, act_dim] float32 within the bounds."""
        shape = (len(obs), len(self.low))
        self.random = env_steps < self.random_steps
        if self.random:
            return self.rng.uniform(self.low, self.high, size=shape).astype(np.float32)
        action = self.model.act(torch.as_tensor(np.asarray(obs))).numpy()
        if self.greedy:
            return action
        return np.clip(action + self._noise(shape), self.low, self.high).astype(np.float32)

    def _noise(self, shape: tuple[int, int]) -> np.ndarray:
        """Gaussian: independent N(0, sigma) per step. OU: x <- x - theta x + N(0, sigma)."""
        step = self.rng.standard_normal(shape).astype(np.float32) * self.sigma
        if not self.ou:
            return step
        if self.ou_state is None or self.ou_state.shape != shape:
            self.ou_state = np.zeros(shape, np.float32)
        self.ou_state += step - self.ou_theta * self.ou_state
        return self.ou_state

    @torch.inference_mode()
    def td_error(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
                 discount: np.ndarray, next_obs: np.ndarray) -> np.ndarray:
        """|reward + discount * Q(s', mu(s')) - Q(s, a)| [N] float32 under this copy of the
        network (no target networks here): Ape-X's initial priorities."""
        model = self.model
        next_obs_t = torch.as_tensor(np.asarray(next_obs))
        next_q = model.q_min(next_obs_t, model.act(next_obs_t))
        target = critic_targets(torch.as_tensor(reward), torch.as_tensor(discount), next_q)
        q = model.q(torch.as_tensor(np.asarray(obs)), torch.as_tensor(np.asarray(action)))
        return (target - q).abs().numpy().astype(np.float32)

    def stats(self) -> dict[str, float]:
        """The noise std (fraction of the half-range), and 1 while actions are uniform random."""
        return {"noise": self.exploration_noise, "random": float(self.random)}

"""Deterministic actor and Q-critics for DDPG and TD3 (vector observations, bounded actions)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from walle_ray.config import ConfigError
from walle_ray.models.policy import MLP
from walle_ray.models.weights import NumpyWeights


def check_vector_obs(obs_space: gym.Space, algo_name: str = "DDPG") -> None:
    """Raise ConfigError unless observations are float vectors (a 1-D float Box)."""
    if not (isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1
            and np.issubdtype(obs_space.dtype, np.floating)):
        raise ConfigError(f"{algo_name} needs float vector observations (a 1-D gymnasium Box); "
                          f"this env has {obs_space}")


class BoundedActions:
    """The action bounds of a Box as buffers (they travel with the weights but are never
    trained), for a module whose actions are squashed into them."""

    def register_bounds(self, action_space: gym.spaces.Box) -> None:
        low = torch.as_tensor(action_space.low, dtype=torch.float32)
        high = torch.as_tensor(action_space.high, dtype=torch.float32)
        self.register_buffer("action_center", (high + low) / 2)
        self.register_buffer("action_scale", (high - low) / 2)

    @property
    def action_low(self) -> torch.Tensor:
        return self.action_center - self.action_scale

    @property
    def action_high(self) -> torch.Tensor:
        return self.action_center + self.action_scale


class DeterministicActorCritic(BoundedActions, NumpyWeights, nn.Module):
    """An actor ``mu(s)`` squashed into the action bounds, and one or two critics ``Q(s, a)``.

    Layers use PyTorch's default initialisation, as the TD3 reference code does. The action
    bounds are buffers: they travel with the weights but are never trained.
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.spaces.Box, hidden: list[int],
                 activation: str = "relu", twin_critics: bool = False):
        super().__init__()
        check_vector_obs(obs_space)
        obs_dim, act_dim = int(obs_space.shape[0]), int(action_space.shape[0])
        self.register_bounds(action_space)
        self.actor = MLP([obs_dim, *hidden, act_dim], activation, ortho=False, out_gain=1.0)
        self.critics = nn.ModuleList(
            MLP([obs_dim + act_dim, *hidden, 1], activation, ortho=False, out_gain=1.0)
            for _ in range(2 if twin_critics else 1))

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [N, obs_dim] -> deterministic action [N, act_dim] inside [low, high]."""
        return self.action_center + self.action_scale * torch.tanh(self.actor(obs.float()))

    def q(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The first critic's Q(s, a) [N]: the one the actor climbs."""
        return self.critics[0](torch.cat([obs.float(), action.float()], dim=-1)).squeeze(-1)

    def q_both(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every critic's Q(s, a) [N]: one value for DDPG, two for TD3's twin critics."""
        x = torch.cat([obs.float(), action.float()], dim=-1)
        return tuple(critic(x).squeeze(-1) for critic in self.critics)

    def q_min(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The smallest critic's Q(s, a) [N] (TD3's clipped double Q; Q1 with one critic)."""
        return torch.stack(self.q_both(obs, action)).min(dim=0).values

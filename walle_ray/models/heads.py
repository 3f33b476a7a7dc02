"""Action heads: how distribution parameters become actions, log-probs, entropies and KLs."""

from __future__ import annotations

from abc import ABC, abstractmethod

import gymnasium as gym
import torch
from torch.distributions import Categorical, Independent, Normal, kl_divergence


class ActionHead(ABC):
    """Maps flat distribution parameters [..., D] to a torch distribution."""

    param_dim: int

    @abstractmethod
    def dist(self, params: torch.Tensor) -> torch.distributions.Distribution:
        """The distribution these parameters describe."""

    @abstractmethod
    def mode(self, params: torch.Tensor) -> torch.Tensor:
        """The most likely action (greedy evaluation)."""

    def kl(self, p_params: torch.Tensor, q_params: torch.Tensor) -> torch.Tensor:
        """KL(p || q) per row."""
        return kl_divergence(self.dist(p_params), self.dist(q_params))


class CategoricalHead(ActionHead):
    """Discrete actions; params are logits."""

    def __init__(self, n: int):
        self.param_dim = n

    def dist(self, params):
        return Categorical(logits=params)

    def mode(self, params):
        return params.argmax(-1)


class GaussianHead(ActionHead):
    """Continuous actions; params are mean and log-std concatenated on the last axis."""

    def __init__(self, dim: int):
        self.dim = dim
        self.param_dim = 2 * dim

    def dist(self, params):
        mean, log_std = params.split(self.dim, dim=-1)
        return Independent(Normal(mean, log_std.exp()), 1)

    def mode(self, params):
        return params[..., : self.dim]


def make_action_head(space: gym.Space) -> ActionHead:
    if isinstance(space, gym.spaces.Discrete):
        return CategoricalHead(int(space.n))
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return GaussianHead(int(space.shape[0]))
    raise TypeError(f"action space {space} is not supported: use Discrete or a 1-D Box")

"""Q-networks for discrete actions: an MLP or the Atari conv torso, with an optional dueling head."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from walle_ray.models.masking import action_mask, masked
from walle_ray.models.policy import MLP, ConvTorso, _init
from walle_ray.models.weights import NumpyWeights


class QNetwork(NumpyWeights, nn.Module):
    """Q(s, .) for every action; dueling splits it into V(s) + A(s, a) - mean_a A(s, a).
    Where the env masks actions (``env.action_mask``), forbidden actions' Q-values are
    ``models/masking.MASKED``: no greedy choice or target maximum takes them."""

    def __init__(self, obs_space: gym.Space, num_actions: int, hidden: list[int],
                 activation: str = "relu", dueling: bool = True, bf16: str | bool = "auto"):
        super().__init__()
        self.obs_shape = tuple(obs_space.shape)
        self.image = len(self.obs_shape) == 3
        self.dueling = dueling
        self.num_actions = num_actions
        self.mask = action_mask(obs_space, gym.spaces.Discrete(num_actions))
        if self.image:
            self.torso = ConvTorso(self.obs_shape[0], self.obs_shape[-1], ortho=True, bf16=bf16)
            width = self.torso.out_dim
        else:
            sizes = [int(np.prod(self.obs_shape)), *hidden]
            self.torso = MLP(sizes, activation, ortho=True, out_gain=math.sqrt(2))
            self.act_fn = torch.relu if activation == "relu" else torch.tanh
            width = sizes[-1]
        self.advantage = _init(nn.Linear(width, num_actions), 0.01, True)
        self.value = _init(nn.Linear(width, 1), 1.0, True) if dueling else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [N, *obs_shape] -> Q [N, num_actions]."""
        if self.image:
            h = self.torso(obs)
        else:
            h = self.act_fn(self.torso(obs.reshape(obs.shape[0], -1).float()))
        adv = self.advantage(h)
        if self.value is not None:
            adv = self.value(h) + adv - adv.mean(dim=-1, keepdim=True)
        return masked(self.mask, adv, obs)

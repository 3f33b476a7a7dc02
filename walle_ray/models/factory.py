"""The network factories the algorithms name (``Algorithm.make_model``): the built-in
network, or with ``model._target_`` the user's, behind the wrapper that gives it the
built-in one's interface (``models/user.py``)."""

from __future__ import annotations

import gymnasium as gym
from torch import nn

from walle_ray.config import ModelConfig
from walle_ray.models.deterministic import DeterministicActorCritic
from walle_ray.models.policy import ActorCritic
from walle_ray.models.q_network import QNetwork
from walle_ray.models.user import UserActorCritic, UserDeterministic, UserQNetwork


def make_actor_critic(obs_space: gym.Space, action_space: gym.Space, cfg: ModelConfig,
                      normalize_obs: bool = False) -> nn.Module:
    """``ActorCritic``, or with ``model._target_`` the user's network behind
    ``UserActorCritic`` (``models/user.py``; its contract: ``contracts.ActorCriticNet``)."""
    if cfg._target_:
        return UserActorCritic(obs_space, action_space, cfg, normalize_obs)
    return ActorCritic(obs_space, action_space, cfg, normalize_obs)


def make_q_network(obs_space: gym.Space, action_space: gym.Space, cfg) -> nn.Module:
    """The DQN family's network from ``cfg.algo`` (hidden, activation, dueling) and
    ``cfg.model.bf16``; with ``model._target_``, the user's network behind ``UserQNetwork``
    (``models/user.py``; its contract: ``contracts.QNet``)."""
    if cfg.model._target_:
        return UserQNetwork(obs_space, action_space, cfg.model)
    return QNetwork(obs_space, int(action_space.n), list(cfg.algo.hidden), cfg.algo.activation,
                    cfg.algo.dueling, cfg.model.bf16)


def make_deterministic_model(obs_space: gym.Space, action_space: gym.spaces.Box,
                             cfg) -> nn.Module:
    """The DDPG family's network from ``cfg.algo`` (hidden, activation, twin_critics).

    ``cfg.model``'s layer settings are the policy-gradient methods' and are not read here:
    these algorithms want ReLU 256x256 networks by default, unlike PPO's tanh 64x64. With
    ``model._target_`` it is the user's network behind ``UserDeterministic``
    (``models/user.py``; its contract: ``contracts.DeterministicNet``).
    """
    if cfg.model._target_:
        return UserDeterministic(obs_space, action_space, cfg.model)
    a = cfg.algo
    return DeterministicActorCritic(obs_space, action_space, list(a.hidden), a.activation,
                                    a.twin_critics)

"""What every algorithm folder exports: its config class, how it updates, how it runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import gymnasium as gym
from omegaconf import DictConfig


@dataclass(frozen=True)
class Algorithm:
    """One algorithm's wiring.

    ``make_update(cfg, model, collective, device)`` builds the object that turns fragments
    into a parameter update (it owns the optimizer); ``loop`` names the driver loop;
    ``validate(cfg)`` raises ConfigError for settings that cannot work;
    ``check_spaces(obs_space, action_space)`` refuses environments the algorithm cannot act in;
    ``fragment_length(cfg, topology)`` is the number of steps per env in one fragment.
    """

    name: str
    config_cls: type
    loop: str  # "sync" (collect, then learn) or "async" (samplers and learners overlap)
    make_update: Callable
    fragment_length: Callable
    validate: Callable[[DictConfig], None]
    check_spaces: Callable[[gym.Space, gym.Space], None]


def check_policy_spaces(algo_name: str) -> Callable[[gym.Space, gym.Space], None]:
    """A ``check_spaces`` for policy-gradient methods: Discrete or 1-D Box actions."""

    def check(obs_space: gym.Space, action_space: gym.Space) -> None:
        from walle_ray.config import ConfigError

        ok = isinstance(action_space, gym.spaces.Discrete) or (
            isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1)
        if not ok:
            raise ConfigError(f"{algo_name} needs a Discrete or 1-D Box action space; "
                              f"this env has {action_space}")

    return check

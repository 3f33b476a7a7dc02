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

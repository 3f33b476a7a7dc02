"""What every algorithm folder exports: its config class, how it updates, how it runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import gymnasium as gym
from omegaconf import DictConfig


@dataclass(frozen=True)
class Algorithm:
    """One algorithm's wiring.

    ``make_update(cfg, model, collective, device)`` builds the object that turns fragments
    into a parameter update (it owns the optimizer); ``loop`` names the driver loop;
    ``validate(cfg)`` raises ConfigError for settings that cannot work;
    ``check_spaces(obs_space, action_space)`` refuses environments the algorithm cannot act in;
    ``fragment_length(cfg, topology)`` is the number of steps per env in one fragment;
    ``make_model(obs_space, action_space, cfg)`` builds the network learners train and
    samplers act with (anything with ``get_weights`` / ``set_weights``);
    ``learner_bootstraps``: its learners value each fragment's last observation themselves,
    so samplers skip that value (``Sampler(bootstrap_value=False)``).

    Replay-based algorithms also name an ``explorer``: the class a replay sampler acts with
    (see ``walle_ray/actors/replay_sampler.py``); their memories are prioritized replay
    shards and their updates return new priorities.
    """

    name: str
    config_cls: type
    loop: str  # "sync" (collect, then learn) or "async" (samplers and learners overlap)
    make_update: Callable
    fragment_length: Callable
    validate: Callable[[DictConfig], None]
    check_spaces: Callable[[gym.Space, gym.Space], None]
    make_model: Callable[..., Any] = None  # type: ignore[assignment]  # set in __post_init__
    explorer: Optional[type] = None
    learner_bootstraps: bool = False

    def __post_init__(self) -> None:
        if self.make_model is None:
            object.__setattr__(self, "make_model", actor_critic_model)

    @property
    def replay(self) -> bool:
        """Whether samplers emit n-step transitions into replay shards."""
        return self.explorer is not None


def configured_fragment_length(cfg, topo) -> int:
    """``algo.fragment_length`` as configured (asynchronous and replay-based algorithms)."""
    return cfg.algo.fragment_length


def require_algo(checks: list[tuple[bool, str, str]]) -> None:
    """Raise ConfigError("algo.<key>: <message>") for the first (ok, key, message) not ok."""
    from walle_ray.config import ConfigError

    for ok, key, message in checks:
        if not ok:
            raise ConfigError(f"algo.{key}: {message}")


def actor_critic_model(obs_space: gym.Space, action_space: gym.Space, cfg):
    """The policy-gradient methods' network: ``ActorCritic`` from ``cfg.model`` and ``cfg.env``."""
    from walle_ray.models import make_actor_critic

    return make_actor_critic(obs_space, action_space, cfg.model, cfg.env.normalize_obs)


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


def check_discrete(algo_name: str) -> Callable[[gym.Space, gym.Space], None]:
    """A ``check_spaces`` for value-based methods that pick among finitely many actions."""

    def check(obs_space: gym.Space, action_space: gym.Space) -> None:
        from walle_ray.config import ConfigError

        if not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError(f"{algo_name} needs a discrete action space (gymnasium Discrete); "
                              f"this env has {action_space}. For continuous actions use "
                              "algo=td3, algo=ddpg or algo=ppo")

    return check


def check_continuous(algo_name: str) -> Callable[[gym.Space, gym.Space], None]:
    """A ``check_spaces`` for deterministic-policy methods: bounded 1-D Box actions."""

    def check(obs_space: gym.Space, action_space: gym.Space) -> None:
        import numpy as np

        from walle_ray.config import ConfigError

        if not (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1):
            raise ConfigError(f"{algo_name} needs a continuous action space (a 1-D gymnasium Box); "
                              f"this env has {action_space}. For discrete actions use "
                              "algo=dqn, algo=apex, algo=impala or algo=ppo")
        if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
            raise ConfigError(f"{algo_name} needs bounded actions; this env has {action_space}")

    return check

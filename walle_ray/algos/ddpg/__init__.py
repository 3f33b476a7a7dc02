"""DDPG, TD3 and Ape-X DDPG: deterministic policy gradient over replay shards."""

from __future__ import annotations

import functools

import torch
from omegaconf import DictConfig

from walle_ray.algos.ddpg.config import APEXDDPGConfig, DDPGConfig, TD3Config
from walle_ray.algos.ddpg.explorer import DDPGExplorer
from walle_ray.algos.ddpg.update import DDPGUpdate
from walle_ray.algos.replay import (ExplorerPolicy, replay_memory_needs, replay_memory_spec,
                                    replay_sampler_spec)
from walle_ray.algos.replay.checks import check_replay_settings
from walle_ray.algos.spec import (Algorithm, check_continuous, configured_fragment_length,
                                  packed_as_is, require_algo)
from walle_ray.models.deterministic import check_vector_obs
from walle_ray.models.factory import make_deterministic_model


def make_update(cfg: DictConfig, model, collective, device: torch.device) -> DDPGUpdate:
    return DDPGUpdate(cfg.algo, model, collective, device)


def validate(cfg: DictConfig) -> None:
    a = cfg.algo
    check_replay_settings(cfg)
    checks = [
        (a.actor_lr is None or a.actor_lr > 0, "actor_lr", "must be positive (or null for algo.lr)"),
        (a.critic_lr is None or a.critic_lr > 0, "critic_lr", "must be positive (or null for algo.lr)"),
        (0 < a.tau <= 1, "tau", "must be in (0, 1]"),
        (a.policy_delay >= 1, "policy_delay", "must be at least 1"),
        (a.target_noise >= 0, "target_noise", "must be zero (off) or positive"),
        (a.target_noise_clip >= 0, "target_noise_clip", "must be zero or positive"),
        (a.exploration in ("gaussian", "ou"), "exploration", f"got {a.exploration!r}; use gaussian or ou"),
        (a.exploration_noise >= 0, "exploration_noise", "must be zero or positive"),
        (0 <= a.ou_theta <= 1, "ou_theta", "must be in [0, 1]"),
        (a.random_steps >= 0, "random_steps", "must be zero or positive"),
        (len(a.hidden) >= 1 and min(a.hidden) > 0, "hidden", "list at least one positive width"),
        (a.activation in ("relu", "tanh"), "activation", f"got {a.activation!r}; use relu or tanh"),
    ]
    require_algo(checks)


def check_spaces(algo_name: str):
    """Bounded 1-D Box actions (``check_continuous``) and float vector observations."""
    check_actions = check_continuous(algo_name)

    def check(obs_space, action_space) -> None:
        check_actions(obs_space, action_space)
        check_vector_obs(obs_space, algo_name)

    return check


def _algorithm(name: str, config_cls: type, label: str) -> Algorithm:
    return Algorithm(name=name, config_cls=config_cls, loop="async", make_update=make_update,
                     fragment_length=configured_fragment_length, validate=validate,
                     check_spaces=check_spaces(label), make_model=make_deterministic_model,
                     sampler_spec=functools.partial(replay_sampler_spec, explorer=DDPGExplorer),
                     memory_spec=replay_memory_spec, estimate_memory=replay_memory_needs,
                     packed_learner=packed_as_is,
                     eval_policy=functools.partial(ExplorerPolicy, DDPGExplorer))


DDPG = _algorithm("ddpg", DDPGConfig, "DDPG")
TD3 = _algorithm("td3", TD3Config, "TD3")
APEX_DDPG = _algorithm("apex_ddpg", APEXDDPGConfig, "Ape-X DDPG")

"""DQN (double, dueling, n-step, prioritized) and Ape-X DQN over distributed replay shards."""

from __future__ import annotations

import functools

import torch
from omegaconf import DictConfig

from walle_ray.algos.dqn.config import APEXConfig, DQNConfig
from walle_ray.algos.dqn.explorer import DQNExplorer
from walle_ray.algos.dqn.update import DQNUpdate
from walle_ray.algos.replay import (ExplorerPolicy, replay_memory_needs, replay_memory_spec,
                                    replay_sampler_spec)
from walle_ray.algos.replay.checks import check_replay_settings
from walle_ray.algos.spec import (Algorithm, check_discrete, configured_fragment_length,
                                  packed_as_is, require_algo)
from walle_ray.models.factory import make_q_network


def make_update(cfg: DictConfig, model, collective, device: torch.device) -> DQNUpdate:
    return DQNUpdate(cfg.algo, model, collective, device)


def validate(cfg: DictConfig) -> None:
    a = cfg.algo
    check_replay_settings(cfg)
    checks = [
        (a.exploration in ("anneal", "apex"), "exploration",
         f"got {a.exploration!r}; use anneal or apex"),
        (0 <= a.epsilon_final <= a.epsilon_start <= 1, "epsilon_start",
         "need 0 <= epsilon_final <= epsilon_start <= 1"),
        (0 < a.apex_epsilon <= 1 and a.apex_alpha >= 0, "apex_epsilon",
         "apex_epsilon must be in (0, 1] and apex_alpha zero or positive"),
        (a.target_update_every >= 1, "target_update_every", "must be positive"),
        (0 <= a.tau <= 1, "tau", "must be in [0, 1] (0: hard target copies)"),
        (a.activation in ("relu", "tanh"), "activation", f"got {a.activation!r}; use relu or tanh"),
        (len(a.hidden) >= 1 and min(a.hidden) > 0, "hidden", "list at least one positive width"),
        (a.huber_delta > 0, "huber_delta", "must be positive"),
    ]
    require_algo(checks)


def _algorithm(name: str, config_cls: type) -> Algorithm:
    label = "Ape-X DQN" if name == "apex" else "DQN"
    return Algorithm(name=name, config_cls=config_cls, loop="async", make_update=make_update,
                     fragment_length=configured_fragment_length, validate=validate,
                     check_spaces=check_discrete(label), make_model=make_q_network,
                     sampler_spec=functools.partial(replay_sampler_spec, explorer=DQNExplorer),
                     memory_spec=replay_memory_spec, estimate_memory=replay_memory_needs,
                     packed_learner=packed_as_is,
                     eval_policy=functools.partial(ExplorerPolicy, DQNExplorer))


DQN = _algorithm("dqn", DQNConfig)
APEX = _algorithm("apex", APEXConfig)

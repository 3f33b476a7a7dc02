"""Algorithm registry: a new algorithm is a new folder here plus a YAML file in walle_ray/conf/algo/."""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig, OmegaConf

from walle_ray.algos.ddpg import APEX_DDPG, DDPG, TD3
from walle_ray.algos.dqn import APEX, DQN
from walle_ray.algos.es import ES
from walle_ray.algos.imitation import BC, MARWIL
from walle_ray.algos.impala import IMPALA
from walle_ray.algos.ppo import PPO
from walle_ray.algos.spec import Algorithm
from walle_ray.config import ConfigError

ALGORITHMS: dict[str, Algorithm] = {algo.name: algo for algo in (PPO, IMPALA, DQN, APEX, DDPG, TD3, APEX_DDPG,
                                                                   ES, BC, MARWIL)}


def algorithm_of(algo_section) -> Algorithm:
    """The algorithm a saved run's ``algo`` section (a plain mapping, e.g. from a checkpoint)
    belongs to: by name, else by the config class whose fields it has (``ppo_kl`` is PPO's
    config under another name)."""
    if algo_section.get("name") in ALGORITHMS:
        return ALGORITHMS[algo_section["name"]]
    keys = set(algo_section)
    for algo in ALGORITHMS.values():
        if keys == {f.name for f in dataclasses.fields(algo.config_cls)}:
            return algo
    raise ConfigError(f"algo: no algorithm has the settings of {algo_section.get('name')!r}; "
                      f"the registered ones are {', '.join(sorted(ALGORITHMS))}")


def algorithm_for(algo_cfg: DictConfig) -> Algorithm:
    """The algorithm whose config class this config node was built from."""
    cls = OmegaConf.get_type(algo_cfg)
    for algo in ALGORITHMS.values():
        if algo.config_cls is cls:
            return algo
    raise ConfigError(f"algo: no algorithm is registered for config {cls.__name__}; "
                      f"choose one of {', '.join(sorted(ALGORITHMS))}")

"""Algorithm registry: a new algorithm is a new folder here plus a YAML file in conf/algo/."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from walle_ray.algos.ddpg import APEX_DDPG, DDPG, TD3
from walle_ray.algos.dqn import APEX, DQN
from walle_ray.algos.impala import IMPALA
from walle_ray.algos.ppo import PPO
from walle_ray.algos.spec import Algorithm
from walle_ray.config import ConfigError

ALGORITHMS: dict[str, Algorithm] = {algo.name: algo for algo in (PPO, IMPALA, DQN, APEX, DDPG, TD3, APEX_DDPG)}


def algorithm_for(algo_cfg: DictConfig) -> Algorithm:
    """The algorithm whose config class this config node was built from."""
    cls = OmegaConf.get_type(algo_cfg)
    for algo in ALGORITHMS.values():
        if algo.config_cls is cls:
            return algo
    raise ConfigError(f"algo: no algorithm is registered for config {cls.__name__}; "
                      f"choose one of {', '.join(sorted(ALGORITHMS))}")

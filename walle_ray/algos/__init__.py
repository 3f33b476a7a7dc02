"""Algorithm registry: a new algorithm is a new folder here plus a YAML file in
walle_ray/conf/algo/, and one line in ``ALGORITHMS``.

The run resolves its algorithm here once (``algorithm_for``) and hands it down; the checks
of a config that need the algorithm (``validate``) and the Hydra schemas of every algorithm
(``register_configs``) live here, above the algorithms, so nothing below imports them."""

from __future__ import annotations

import copy

import dataclasses

from omegaconf import DictConfig, OmegaConf

from walle_ray.algos.ddpg import APEX_DDPG, DDPG, TD3
from walle_ray.algos.dqn import APEX, DQN
from walle_ray.algos.es import ES
from walle_ray.algos.imitation import BC, MARWIL
from walle_ray.algos.impala import IMPALA
from walle_ray.algos.ppo import PPO
from walle_ray.algos.spec import Algorithm
from walle_ray.config import ConfigError, register_schema, require
from walle_ray.config import validate as validate_schema
from walle_ray.models.precision import bf16_setting
from walle_ray.topology import parse_topology

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


def register_configs() -> None:
    """Register the root schema and every algorithm's schema with Hydra, and the resolver
    that names run directories."""
    from hydra.core.config_store import ConfigStore

    from walle_ray.runtime.run_dir import register_resolver

    register_schema()
    register_resolver()
    cs = ConfigStore.instance()
    for name, algo in ALGORITHMS.items():
        cs.store(group="schema/algo", name=name, node=algo.config_cls)


def validate(cfg: DictConfig, algo: Algorithm | None = None, own_checks: bool = True) -> None:
    """Every check of a config: the schema's (``config.validate``), those that need the
    algorithm (``algo``, or the one ``cfg.algo`` names), and, with ``own_checks``, the
    algorithm's own (``Algorithm.validate``; the driver runs those after it has checked that
    the algorithm can act in the env at all). Raises ConfigError naming the key."""
    validate_schema(cfg)
    if str(cfg.topology.spec).strip().lower() == "auto":  # checked as one process until chosen
        cfg = copy.deepcopy(cfg)
        cfg.topology.spec = "local"
    parse_topology(cfg.topology.spec)  # a malformed topology string says the grammar
    try:
        bf16_setting(cfg.model.bf16)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    algo = algo or algorithm_for(cfg.algo)
    _check_core(cfg, algo)
    snapshots = algo.memory_spec is not None and hasattr(algo.memory(cfg, 0)[0], "state_dict")
    require(not cfg.memory.checkpoint or snapshots, "memory.checkpoint",
            f"{cfg.algo.name}'s memories cannot be snapshotted (they hold on-policy fragments "
            "that are used once); only replay shards are")
    if own_checks:
        algo.validate(cfg)


def _check_core(cfg: DictConfig, algo: Algorithm) -> None:
    """``model.core``: on an algorithm whose learners unroll it, in the built-in networks;
    ``model.burn_in`` where replayed rows have a state to re-derive."""
    m = cfg.model
    if m.core is None:
        require(m.burn_in == 0, "model.burn_in", "applies to a recurrent core; set model.core too")
        return
    require(algo.recurrent, "model.core", f"algo={algo.name} has no recurrent networks; "
            "use algo=ppo, ppo_kl or impala, or leave model.core unset")
    if m.burn_in:
        replays = [r.type for r in cfg.algo.get("replay") or [] if r.type != "queue"]
        require(bool(replays), "model.burn_in", f"re-derives the state of replayed rows, and "
                f"algo={algo.name} replays none; add a replay type to algo.replay "
                "(algo=impala) or leave model.burn_in at 0")
        require(m.burn_in < cfg.algo.fragment_length, "model.burn_in",
                f"{m.burn_in} leaves no step of a {cfg.algo.fragment_length}-step fragment to "
                "learn from; use fewer steps than algo.fragment_length")
    require(m._target_ is None, "model.core", "is for the built-in networks; a network of "
            "yours (model._target_) cannot take a core yet: leave model.core unset")

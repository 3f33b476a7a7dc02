"""Learning from recorded episodes (a Minari dataset, ``dataset.path``), with no samplers:
behaviour cloning (``algo=bc``) and MARWIL (``algo=marwil``, Wang et al. 2018).

Memories read the dataset in shards of whole episodes (``buffers/dataset.py``) and learners
drain them as in any asynchronous run; the run's env steps count the recorded steps learned
from, so budgets, checkpoints and evaluation (``eval.every_env_steps``) work as elsewhere.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from walle_ray.algos.imitation.config import BCConfig, MARWILConfig
from walle_ray.algos.imitation.update import OfflineUpdate
from walle_ray.algos.spec import (Algorithm, check_learner_batch, check_policy_spaces, packed_as_is,
                                  require_algo)


def make_update(cfg: DictConfig, model, collective, device: torch.device) -> OfflineUpdate:
    return OfflineUpdate(cfg.algo, model, collective, cfg.env.normalize_reward,
                         cfg.run.total_env_steps, device)


def memory_spec(algo, cfg: DictConfig, k: int, gamma: float | None = None) -> tuple[type, tuple, dict]:
    """Memory k reads every M-th episode of the datasets (M memories); with ``gamma`` its
    rows carry their discounted returns (MARWIL)."""
    from walle_ray.buffers.dataset import DatasetMemory
    from walle_ray.datasets import dataset_paths
    from walle_ray.topology import parse_topology

    from walle_ray.algos.spec import learner_batch

    memories = parse_topology(cfg.topology.spec).memories
    return DatasetMemory, (dataset_paths(cfg.dataset.path), k, memories, learner_batch(cfg),
                           gamma, int(cfg.run.seed)), {}


def marwil_memory_spec(algo, cfg: DictConfig, k: int) -> tuple[type, tuple, dict]:
    return memory_spec(algo, cfg, k, float(cfg.algo.gamma))


def no_samplers(algo, cfg, topo, i: int):
    raise AssertionError("offline algorithms have no samplers")  # validate refuses any


def validate_marwil(cfg: DictConfig) -> None:
    a = cfg.algo
    validate(cfg, [(a.beta >= 0, "beta", "must be zero (behaviour cloning) or positive"),
                   (0 < a.gamma <= 1, "gamma", "must be in (0, 1]"),
                   (a.vf_coef >= 0, "vf_coef", "must be zero or positive"),
                   (0 < a.adv_norm_rate <= 1, "adv_norm_rate", "must be in (0, 1]"),
                   (a.adv_norm_init is None or a.adv_norm_init > 0, "adv_norm_init",
                    "must be positive, or null to start from the first batch"),
                   (a.max_weight is None or a.max_weight > 0, "max_weight",
                    "must be positive, or null for no clip")])


def validate(cfg: DictConfig, more_checks: list = ()) -> None:
    """BC's checks (MARWIL's add ``more_checks``), then the dataset and the topology."""
    from walle_ray.config import ConfigError
    from walle_ray.datasets import dataset_paths
    from walle_ray.topology import parse_topology

    a, name = cfg.algo, cfg.algo.name
    checks = [(a.batch_size > 0, "batch_size", "must be positive"),
              (a.lr > 0, "lr", "must be positive"),
              (a.lr_schedule in ("constant", "linear"), "lr_schedule", "use constant or linear"),
              (a.ent_coef >= 0, "ent_coef", "must be zero (off) or positive"),
              (a.adam_eps > 0, "adam_eps", "must be positive"),
              (a.max_grad_norm >= 0, "max_grad_norm", "must be zero (no clip) or positive"),
              (a.updates_per_call > 0, "updates_per_call", "must be positive"),
              (a.prefetch > 0, "prefetch", "must be positive"),
              (a.publish_every > 0, "publish_every", "must be positive"), *more_checks]
    require_algo(checks)
    check_learner_batch(cfg, "recorded steps")
    if not dataset_paths(cfg.dataset.path):
        raise ConfigError(f"dataset.path: algo={name} learns from a recorded dataset; record one "
                          "with python -m walle_ray mode=collect run.checkpoint=<ckpt> "
                          "collect.out=<dir>, then set dataset.path=<dir>")
    topo = parse_topology(cfg.topology.spec)
    if not topo.local and topo.samplers:
        raise ConfigError(f"topology={cfg.topology.spec}: algo={name} learns from dataset.path "
                          f"and has no use for samplers; use 0a{topo.memories}m{topo.learners}l")
    if cfg.memory.checkpoint:
        raise ConfigError(f"memory.checkpoint: algo={name}'s memories hold a dataset that stays "
                          "on disk; there is nothing to snapshot, so leave it false")


BC = Algorithm(name="bc", config_cls=BCConfig, loop="async", make_update=make_update,
               fragment_length=lambda cfg, topo: 1, validate=validate,
               check_spaces=check_policy_spaces("bc"), reads_dataset=True,
               sampler_spec=no_samplers, memory_spec=memory_spec, packed_learner=packed_as_is)
MARWIL = Algorithm(name="marwil", config_cls=MARWILConfig, loop="async", make_update=make_update,
                   fragment_length=lambda cfg, topo: 1, validate=validate_marwil,
                   check_spaces=check_policy_spaces("marwil"), reads_dataset=True,
                   sampler_spec=no_samplers, memory_spec=marwil_memory_spec,
                   packed_learner=packed_as_is)

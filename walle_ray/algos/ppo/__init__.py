"""PPO: clipped surrogate (algo=ppo) or adaptive KL penalty (algo=ppo_kl), synchronous."""

from __future__ import annotations

import copy
import math

import torch
from omegaconf import DictConfig

from walle_ray.algos.ppo.config import PPOConfig
from walle_ray.algos.ppo.update import PPOUpdate
from walle_ray.algos.spec import Algorithm, check_policy_spaces, require_algo
from walle_ray.config import ConfigError


def make_update(cfg: DictConfig, model, collective, device: torch.device) -> PPOUpdate:
    return PPOUpdate(cfg.algo, model, collective, cfg.env.normalize_reward,
                     cfg.run.total_env_steps, device, cfg.model.seq_len)


def fragment_length(cfg: DictConfig, topo) -> int:
    """Steps per env so that one round of all samplers fills ``algo.batch_size``."""
    return max(1, math.ceil(cfg.algo.batch_size / (topo.samplers * cfg.env.envs_per_sampler)))


def packed_learner(cfg: DictConfig, shards: int) -> DictConfig:
    """The config of a learner process holding ``shards`` of the topology's L learner
    shards. ``algo.minibatch_size`` is a whole gradient step's rows, however many learners
    share it: each shard takes 1/L of them, so every step's gradient, all-reduced, is the
    mean over the same rows one learner would take (docs/algorithms.md, "One update,
    however many learners"); a process with several shards takes their rows together."""
    from walle_ray.topology import parse_topology

    learners = 1 if cfg.topology.spec == "local" else parse_topology(cfg.topology.spec).learners
    if shards == learners:
        return cfg
    cfg = copy.deepcopy(cfg)
    cfg.algo.minibatch_size = max(1, cfg.algo.minibatch_size * shards // learners)
    return cfg


def validate(cfg: DictConfig) -> None:
    a = cfg.algo
    checks = [
        (a.objective in ("clip", "kl_penalty"), "objective", f"got {a.objective!r}; use clip or kl_penalty"),
        (a.lr_schedule in ("constant", "linear"), "lr_schedule", f"got {a.lr_schedule!r}; use constant or linear"),
        (a.batch_size > 0, "batch_size", "must be positive"),
        (a.minibatch_size > 0, "minibatch_size", "must be positive"),
        (a.minibatch_size <= a.batch_size, "minibatch_size",
         f"got {a.minibatch_size}, more than algo.batch_size={a.batch_size}; a gradient step "
         "takes its rows from one batch: use at most the batch size"),
        (a.epochs > 0, "epochs", "must be positive"),
        (a.lr > 0, "lr", "must be positive"),
        (0 < a.gamma <= 1, "gamma", "must be in (0, 1]"),
        (0 <= a.gae_lambda <= 1, "gae_lambda", "must be in [0, 1]"),
        (a.clip > 0, "clip", "must be positive"),
        (a.vf_clip is None or a.vf_clip > 0, "vf_clip", "must be positive (or null)"),
        (a.max_grad_norm > 0, "max_grad_norm", "must be positive"),
        (a.kl_target > 0, "kl_target", "must be positive"),
        (a.kl_beta_init > 0, "kl_beta_init", "must be positive"),
        (a.kl_early_stop > 1, "kl_early_stop", "must be above 1 (a multiple of kl_target)"),
    ]
    require_algo(checks)
    if a.compile and cfg.model.core:
        raise ConfigError("algo.compile=true compiles a feed-forward model's step; with "
                          f"model.core={cfg.model.core} set algo.compile=false")


PPO = Algorithm(name="ppo", config_cls=PPOConfig, loop="sync", make_update=make_update,
                fragment_length=fragment_length, validate=validate,
                check_spaces=check_policy_spaces("PPO"), packed_learner=packed_learner,
                recurrent=True)

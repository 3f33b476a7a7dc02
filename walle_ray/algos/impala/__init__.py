"""IMPALA: asynchronous samplers and learners, V-trace, replay mixing, CLEAR and LASER."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from walle_ray.algos.impala.config import IMPALAConfig
from walle_ray.algos.impala.update import IMPALAUpdate
from walle_ray.algos.spec import (Algorithm, check_policy_spaces, configured_fragment_length,
                                  packed_as_is, require_algo)
from walle_ray.buffers.mixed import BufferSpec, MixedMemory
from walle_ray.config import ConfigError

REPLAY_TYPES = ("queue", "uniform")


def make_update(cfg: DictConfig, model, collective, device: torch.device) -> IMPALAUpdate:
    return IMPALAUpdate(cfg.algo, model, collective, cfg.env.normalize_reward,
                        cfg.run.total_env_steps, device, cfg.model.burn_in)


def buffer_specs(algo_cfg) -> list[BufferSpec]:
    """The memory mix of each memory actor, with default capacities filled in."""
    return [BufferSpec(type=r.type, ratio=r.ratio, capacity=r.capacity or 4 * algo_cfg.batch_size,
                       start_rows=r.start_rows) for r in algo_cfg.replay]


def memory_spec(cfg: DictConfig, k: int) -> tuple[type, tuple, dict]:
    """Memory k: the on-policy queue and replay buffers, mixed by ratio into each batch."""
    return MixedMemory, (buffer_specs(cfg.algo), cfg.algo.batch_size, cfg.run.seed + k), {}


def check_replay(algo_cfg) -> None:
    """Ratios sum to 1 and give whole rows of every batch; known types; one queue at most."""
    replay, n = algo_cfg.replay, algo_cfg.batch_size
    if not replay:
        raise ConfigError("algo.replay: list at least one memory type, e.g. [{type: queue, ratio: 1.0}]")
    for i, r in enumerate(replay):
        if r.type not in REPLAY_TYPES:
            raise ConfigError(f"algo.replay[{i}].type: got {r.type!r}; use one of {', '.join(REPLAY_TYPES)}")
        if not 0 < r.ratio <= 1:
            raise ConfigError(f"algo.replay[{i}].ratio: got {r.ratio}; must be in (0, 1]")
        rows = r.ratio * n
        if abs(rows - round(rows)) > 1e-6:
            raise ConfigError(
                f"algo.replay[{i}].ratio: {r.ratio} of algo.batch_size={n} is {rows:g} rows, not a "
                f"whole number; pick ratios that are multiples of 1/{n}")
        if r.capacity < 0 or r.start_rows < 0:
            raise ConfigError(f"algo.replay[{i}]: capacity and start_rows must be zero or positive")
        if r.capacity and r.capacity < round(rows):
            raise ConfigError(f"algo.replay[{i}].capacity: {r.capacity} rows cannot serve {round(rows)} "
                              "rows per batch")
    total = sum(r.ratio for r in replay)
    if abs(total - 1.0) > 1e-6:
        raise ConfigError(f"algo.replay: the ratios sum to {total:g}; they must sum to 1")
    if sum(r.type == "queue" for r in replay) > 1:
        raise ConfigError("algo.replay: list the on-policy queue once")


def validate(cfg: DictConfig) -> None:
    a = cfg.algo
    checks = [
        (a.fragment_length > 0, "fragment_length", "must be positive"),
        (a.batch_size > 0, "batch_size", "must be positive"),
        (a.optimizer in ("rmsprop", "adam"), "optimizer", f"got {a.optimizer!r}; use rmsprop or adam"),
        (a.lr_schedule in ("constant", "linear"), "lr_schedule", f"got {a.lr_schedule!r}; use constant or linear"),
        (a.lr > 0, "lr", "must be positive"),
        (a.eps > 0, "eps", "must be positive"),
        (0 < a.gamma <= 1, "gamma", "must be in (0, 1]"),
        (min(a.rho_bar, a.c_bar, a.pg_rho_bar) > 0, "rho_bar", "rho_bar, c_bar and pg_rho_bar must be positive"),
        (0 <= a.vtrace_lambda <= 1, "vtrace_lambda", "must be in [0, 1]"),
        (a.max_grad_norm > 0, "max_grad_norm", "must be positive"),
        (min(a.clear_policy_coef, a.clear_value_coef) >= 0, "clear_policy_coef",
         "CLEAR weights must be zero (off) or positive"),
        (a.laser_kl_threshold is None or a.laser_kl_threshold > 0, "laser_kl_threshold",
         "must be positive (or null for off)"),
        (min(a.fragments_per_call, a.updates_per_call, a.prefetch, a.publish_every) > 0,
         "fragments_per_call", "fragments_per_call, updates_per_call, prefetch and publish_every "
         "must be positive"),
    ]
    require_algo(checks)
    check_replay(a)
    # The running statistics count fresh (queue) rows only, so each row counts once.
    if not any(r.type == "queue" for r in a.replay):
        for key in ("normalize_obs", "normalize_reward"):
            if cfg.env[key]:
                raise ConfigError(f"env.{key}: the running statistics count fresh rows, and a "
                                  "memory mix without a queue has none; add "
                                  "{type: queue, ratio: ...} to algo.replay or set "
                                  f"env.{key}=false")


# V-trace bootstraps from the learner's own value of each fragment's last observation.
IMPALA = Algorithm(name="impala", config_cls=IMPALAConfig, loop="async", make_update=make_update,
                   fragment_length=configured_fragment_length, validate=validate,
                   check_spaces=check_policy_spaces("IMPALA"), learner_bootstraps=True,
                   memory_spec=memory_spec, packed_learner=packed_as_is, recurrent=True)

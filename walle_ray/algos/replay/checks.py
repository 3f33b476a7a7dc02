"""Setting checks every replay-based algorithm shares."""

from __future__ import annotations

from walle_ray.algos.spec import check_learner_batch, learner_batch, require_algo
from walle_ray.config import ConfigError


def check_replay_settings(cfg) -> None:
    """Raise ConfigError naming the first ReplayConfig setting that cannot work."""
    a = cfg.algo
    per_fragment = a.fragment_length * cfg.env.envs_per_sampler
    lead = a.max_lead or 2 * max(1, learner_batch(cfg))
    checks = [
        (0 < a.gamma <= 1, "gamma", "must be in (0, 1]"),
        (a.n_step >= 1, "n_step", "must be at least 1"),
        (a.batch_size >= 1, "batch_size", "must be positive"),
        (a.capacity >= a.batch_size, "capacity", f"must hold at least one batch ({a.batch_size})"),
        (0 <= a.learning_starts <= a.capacity, "learning_starts",
         f"must be between 0 and algo.capacity ({a.capacity})"),
        (a.priority_alpha >= 0, "priority_alpha", "must be zero or positive"),
        (0 <= a.priority_beta <= 1, "priority_beta", "must be in [0, 1]"),
        (a.beta_anneal_updates >= 0, "beta_anneal_updates", "must be zero (off) or positive"),
        (a.replay_ratio is None or a.replay_ratio > 0, "replay_ratio",
         "must be positive, or null for free-running learners"),
        (a.max_lead >= 0, "max_lead", "must be zero (two batches) or positive"),
        (a.replay_ratio is None or per_fragment <= lead, "max_lead",
         f"a fragment of {per_fragment} transitions (algo.fragment_length x "
         f"env.envs_per_sampler) exceeds the {lead} samplers may run ahead of "
         "algo.replay_ratio, so no sampler could ever put one; raise algo.max_lead or "
         "shorten algo.fragment_length"),
        (a.fragment_length >= 1, "fragment_length", "must be positive"),
        (min(a.fragments_per_call, a.updates_per_call, a.prefetch, a.publish_every) > 0,
         "fragments_per_call", "fragments_per_call, updates_per_call, prefetch and publish_every "
         "must be positive"),
        (a.lr > 0, "lr", "must be positive"),
        (a.max_grad_norm >= 0, "max_grad_norm", "must be zero (off) or positive"),
    ]
    require_algo(checks)
    check_learner_batch(cfg, "transitions")
    # Replay samplers feed raw observations and rewards; these switches would be ignored.
    for key in ("normalize_obs", "normalize_reward"):
        if cfg.env[key]:
            raise ConfigError(f"env.{key}: {a.name} learns from raw observations and rewards; "
                              f"set env.{key}=false")

"""Run metrics as Ray gauges: they reach the Prometheus endpoint that the dashboard's
Grafana reads, named ``ray_walle_*`` there and tagged with the run."""

from __future__ import annotations

import math

# metrics record key -> (gauge name, description)
_GAUGES = {
    "env_steps": ("walle_env_steps", "env steps sampled so far"),
    "env_steps_per_s": ("walle_env_steps_per_s", "env steps sampled per second"),
    "consumed_per_s": ("walle_consumed_per_s", "env steps learned from per second"),
    "updates_per_s": ("walle_learner_updates_per_s", "learner updates per second"),
    "policy_lag_mean": ("walle_policy_lag", "learner version minus behaviour version (mean)"),
    "policy_lag_max": ("walle_policy_lag_max", "learner version minus behaviour version (max)"),
    "return": ("walle_return", "mean episode return over the return window"),
    "eval/return": ("walle_eval_return", "mean greedy evaluation return"),
    "learner_busy": ("walle_learner_busy", "share of time the learners compute"),
    "collect_share": ("walle_collect_share", "share of an iteration spent collecting"),
    "faults/sampler_restarts": ("walle_sampler_restarts", "samplers restarted after a fault"),
    "faults/stalls": ("walle_stalls", "roles found stalled and restarted"),
}
# per-memory keys (memory/<k>/<key>) -> gauge name; several keys can share a gauge
_MEMORY_GAUGES = {"queue_size": "walle_queue_depth", "size": "walle_replay_size",
                  "uniform_size": "walle_replay_size", "fill": "walle_replay_fill",
                  **{f"{kind}_{key}": f"walle_replay_{key}" for kind in ("elite", "attentive")
                     for key in ("dist_kept", "dist_drawn", "candidates", "lambda", "rank_share")},
                  "elite_size": "walle_replay_size", "attentive_size": "walle_replay_size"}
_TYPES = ("queue", "uniform", "elite", "attentive")  # IMPALA's memory types; else a replay shard
_MEMORY_TEXT = {"walle_queue_depth": "rows waiting in an on-policy memory",
                "walle_replay_size": "rows or transitions held by a replay memory",
                "walle_replay_fill": "fraction of a replay shard's capacity in use",
                "walle_replay_dist_kept": "mean distance of the rows a ranking replay kept",
                "walle_replay_dist_drawn": "mean distance of the candidates a ranking replay drew",
                "walle_replay_candidates": "candidates a ranking replay drew for one batch",
                "walle_replay_lambda": "a ranking replay's candidates per row served, annealed",
                "walle_replay_rank_share": "share of the time a ranking replay spends ranking"}


class RayMetrics:
    """Sets one gauge per known metric from each record; unknown keys are ignored."""

    def __init__(self, run: str, algo: str, env: str):
        from ray.util.metrics import Gauge

        self.tags = {"run": run, "algo": algo, "env": env}
        keys = tuple(self.tags)
        self.gauges = {key: Gauge(name, description=text, tag_keys=keys)
                       for key, (name, text) in _GAUGES.items()}
        by_name = {name: Gauge(name, description=text, tag_keys=(*keys, "memory", "type"))
                   for name, text in _MEMORY_TEXT.items()}
        self.memory_gauges = {key: by_name[name] for key, name in _MEMORY_GAUGES.items()}

    def write(self, record: dict) -> None:
        for key, value in record.items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            if key in self.gauges:
                self.gauges[key].set(value, tags=self.tags)
            elif key.startswith("memory/"):
                _, index, name = key.split("/", 2)
                if name in self.memory_gauges:
                    # A memory mixing types reports each type's figures under the same gauge.
                    kind = name.split("_")[0] if "_" in name and name.split("_")[0] in _TYPES else "shard"
                    self.memory_gauges[name].set(value, tags={**self.tags, "memory": index, "type": kind})

    def close(self, exit_code: int = 0) -> None:
        pass

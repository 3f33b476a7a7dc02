"""The asynchronous loop (IMPALA): samplers and learners overlap; the driver reports and saves."""

from __future__ import annotations

import time

from omegaconf import DictConfig

from walle_ray.runtime.sync_loop import stop_reason


class _Interval:
    """What happened since the last metrics record."""

    def __init__(self) -> None:
        self.steps = self.consumed = self.updates = self.fragments = 0
        self.collect_s = self.put_wait_s = self.batch_wait_s = self.train_s = 0.0
        self.lag_max = 0.0
        self.sums: dict[str, float] = {}
        self.calls = 0
        self.explore: dict[str, list[float]] = {}  # exploration settings, one per sampler report

    def add_sampler(self, r: dict) -> None:
        for key, value in r.items():
            if key.startswith("explore/"):
                self.explore.setdefault(key, []).append(value)
        self.steps += r["env_steps"]
        self.fragments += r.get("fragments", 1)
        self.collect_s += r["collect_s"]
        self.put_wait_s += r.get("put_wait_s", 0.0)

    def add_learner(self, m: dict) -> None:
        if not m["updates"]:
            return
        self.updates += m.pop("updates")
        self.consumed += m.pop("env_steps_consumed")
        self.batch_wait_s += m.pop("batch_wait_s")
        self.train_s += m.pop("train_s", 0.0)
        self.lag_max = max(self.lag_max, m.pop("policy_lag_max"))
        for k, v in m.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.calls += 1


def run_async(cfg: DictConfig, fleet, counters: dict, window, metrics, progress, signals,
              checkpoint, start: tuple[float, int] | None = None) -> str:
    """Poll the fleet until a stop condition; write a record every ``run.report_every_s``."""
    last = time.perf_counter()
    # A loop restarted after a rebuild keeps the run's start: its wall budget and rates.
    started, steps_at_start = start or (last, counters["env_steps"])
    counters.setdefault("env_steps_consumed", 0)
    counters.setdefault("updates", 0)
    counters.setdefault("dropped_fragments", 0)
    fleet.start()
    interval = _Interval()
    shard_counts: dict[str, float] = {}  # replay shards' insert and sample counters at the last record

    def flush(now: float) -> None:
        nonlocal interval, last
        counters["wall_s"] += now - last
        counters["iterations"] += 1
        counters["env_steps_consumed"] += interval.consumed
        counters["updates"] += interval.updates
        record = _record(counters, window, interval, now - last, steps_at_start, now - started,
                         fleet, shard_counts)
        metrics.write(record)
        progress.update(record)
        interval, last = _Interval(), now

    while (reason := stop_reason(cfg, counters, window, started, signals)) is None:
        reports, learned = fleet.poll(counters["env_steps"])
        for r in reports:
            interval.add_sampler(r)
            window.add(r["episode_returns"], r["episode_lengths"])
            counters["episodes"] += len(r["episode_returns"])
            counters["env_steps"] += r["env_steps"]
            counters["dropped_fragments"] += r.get("dropped", 0)
        for m in learned:
            interval.add_learner(m)
        now = time.perf_counter()
        if now - last >= cfg.run.report_every_s:
            flush(now)
            if counters["iterations"] % cfg.run.checkpoint_every == 0:
                checkpoint()
    flush(time.perf_counter())  # the last partial interval, so the file ends where the run did
    return reason


# Replay-shard stats worth a metric each; counters among them also give a rate.
_SHARD_KEYS = ("size", "fill", "mean_priority", "beta", "frames", "obs_bytes")
_SHARD_RATES = {"inserted": "inserts_per_s", "sampled": "samples_per_s"}


def _record(counters, window, iv: _Interval, dt: float, steps_at_start: int, elapsed: float,
            fleet, shard_counts: dict) -> dict:
    memories = fleet.memory_stats()
    learner = {f"learn/{k}": v / iv.calls for k, v in iv.sums.items()} if iv.calls else {}
    record = {
        "iteration": counters["iterations"], "env_steps": counters["env_steps"],
        "env_steps_consumed": counters["env_steps_consumed"], "updates": counters["updates"],
        "episodes": counters["episodes"], "return": window.mean,
        "episode_length": window.mean_length, "wall_s": counters["wall_s"],
        "env_steps_per_s": iv.steps / dt, "consumed_per_s": iv.consumed / dt,
        "updates_per_s": iv.updates / dt,
        "env_steps_per_s_avg": (counters["env_steps"] - steps_at_start) / elapsed,
        "batch_wait_s": iv.batch_wait_s, "learner_busy": (iv.train_s - iv.batch_wait_s) / dt,
        "sampler_put_wait_s": iv.put_wait_s, "fragments": iv.fragments,
        "policy_lag_mean": learner.get("learn/policy_lag_mean", float("nan")),
        "policy_lag_max": iv.lag_max,
        "dropped_fragments": counters["dropped_fragments"],
        **{f"faults/{k}": v for k, v in fleet.faults.items()},
        **learner,
        **{key: sum(values) / len(values) for key, values in iv.explore.items()},
    }
    for k, m in enumerate(memories):
        for key, value in m.items():
            if key.endswith("_size") or key in _SHARD_KEYS:
                record[f"memory/{k}/{key}"] = value
            elif key in _SHARD_RATES:
                name = f"memory/{k}/{key}"
                record[f"memory/{k}/{_SHARD_RATES[key]}"] = (value - shard_counts.get(name, 0)) / dt
                shard_counts[name] = value
    return record

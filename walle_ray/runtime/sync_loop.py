"""The synchronous loop (PPO as in WALL-E): broadcast, collect in parallel, learn, repeat."""

from __future__ import annotations

import time

from omegaconf import DictConfig


def stop_reason(cfg: DictConfig, counters: dict, window, started: float, signals) -> str | None:
    if signals.requested is not None:
        return "signal"
    if counters["env_steps"] >= cfg.run.total_env_steps:
        return "budget"
    if cfg.run.max_wall_s is not None and time.perf_counter() - started >= cfg.run.max_wall_s:
        return "wall"
    if cfg.run.stop_at_return is not None and window.full and window.mean >= cfg.run.stop_at_return:
        return "return"
    return None


def run_sync(cfg: DictConfig, fleet, counters: dict, window, metrics, progress, signals,
             checkpoint, start: tuple[float, int] | None = None) -> str:
    """Iterate until a stop condition; returns its name. Each iteration records collection
    and learning time separately (WALL-E's timing breakdown)."""
    # A loop restarted after a rebuild keeps the run's start: its wall budget and rates.
    started, steps_at_start = start or (time.perf_counter(), counters["env_steps"])
    fleet.publish()
    while (reason := stop_reason(cfg, counters, window, started, signals)) is None:
        t0 = time.perf_counter()
        stats = fleet.collect()
        t1 = time.perf_counter()
        learn = fleet.learn(counters["env_steps"])
        fleet.publish()
        t2 = time.perf_counter()
        steps = sum(s["env_steps"] for s in stats)
        for s in stats:
            window.add(s["episode_returns"], s["episode_lengths"])
            counters["episodes"] += len(s["episode_returns"])
        counters["env_steps"] += steps
        counters["iterations"] += 1
        counters["wall_s"] += t2 - t0
        iter_s = t2 - t0
        record = {
            "iteration": counters["iterations"], "env_steps": counters["env_steps"],
            "episodes": counters["episodes"], "return": window.mean,
            "episode_length": window.mean_length, "wall_s": counters["wall_s"],
            "collect_s": t1 - t0, "learn_s": t2 - t1, "iter_s": iter_s,
            "collect_share": (t1 - t0) / iter_s, "learn_share": (t2 - t1) / iter_s,
            "env_steps_per_s": steps / iter_s,
            "env_steps_per_s_avg": (counters["env_steps"] - steps_at_start) / (t2 - started),
            "sampler_collect_s_max": max(s["collect_s"] for s in stats),
            **{f"faults/{k}": v for k, v in fleet.faults.items()},
            **{f"learn/{k}": v for k, v in learn.items()},
        }
        metrics.write(record)
        progress.update(record)
        if counters["iterations"] % cfg.run.checkpoint_every == 0:
            checkpoint()
    return reason

"""The driver loop, one for every algorithm: step the fleet, keep the counters, make a
metrics record, and pass it through the periodic hooks (evaluation, the report to the sinks
and the progress line, a checkpoint), each of which acts when its interval comes.

An offline fleet (no samplers; ``algo=bc``) counts the recorded steps its learners took
as the run's env steps, so budgets, evaluation and checkpoints keep their meaning.

A synchronous fleet's step is one iteration (collect, then learn) and gets a record of its
own, with WALL-E's collection vs learning split; an asynchronous fleet's steps are polls,
summed into a record every ``run.report_every_s``.
"""

from __future__ import annotations

import time
from typing import Callable

from omegaconf import DictConfig

from walle_ray.runtime.times import RunTimes


class Periodic:
    """Calls ``fn(record)`` each time ``record[key]`` passes another multiple of ``every``
    (Sample Factory's periodic timers, on a counter). What ``fn`` returns is added to the
    record, so an evaluation's results are written with it."""

    def __init__(self, key: str, every: float, fn: Callable[[dict], dict | None],
                 start: float = 0):
        """``start``: the counter's value now (a resumed run's), so the first call comes at
        the next multiple of ``every`` after it."""
        self.key, self.every, self.fn = key, every, fn
        self.next_at = (start // every + 1) * every

    def __call__(self, record: dict) -> dict:
        if record[self.key] < self.next_at:
            return {}
        self.next_at = (record[self.key] // self.every + 1) * self.every
        return self.fn(record) or {}


def stop_reason(cfg: DictConfig, counters: dict, window, started: float, signals) -> str | None:
    if signals.requested is not None:
        return "signal"
    if counters["env_steps"] >= cfg.run.total_env_steps:
        return "budget"
    if cfg.run.max_wall_s is not None and time.perf_counter() - started >= cfg.run.max_wall_s:
        return "wall"
    if cfg.run.stop_at_return is not None and window.reaches(cfg.run.stop_at_return, []):
        return "return"
    return None


class Interval:
    """What happened since the last metrics record."""

    def __init__(self) -> None:
        self.steps = self.consumed = self.updates = self.fragments = 0
        self.put_wait_s = self.batch_wait_s = self.train_s = 0.0
        self.lag_max = 0.0
        self.sums: dict[str, float] = {}
        self.calls = 0
        self.explore: dict[str, list[float]] = {}  # exploration settings, one per sampler report
        self.collect_s_max = 0.0  # the slowest sampler's collection time

    def add_sampler(self, r: dict) -> None:
        for key, value in r.items():
            if key.startswith("explore/"):
                self.explore.setdefault(key, []).append(value)
        self.steps += r["env_steps"]
        if not r.get("lane"):  # samplers stepping together share their fragments
            self.fragments += r.get("fragments", 1)
        self.collect_s_max = max(self.collect_s_max, r["collect_s"])
        self.put_wait_s += r.get("put_wait_s", 0.0)

    def add_learner(self, m: dict) -> None:
        if not m["updates"]:
            return
        self.updates += m.pop("updates")
        self.consumed += m.pop("env_steps_consumed")
        self.batch_wait_s += m.pop("batch_wait_s")
        self.train_s += m.pop("train_s", 0.0)
        self.lag_max = max(self.lag_max, m.pop("policy_lag_max"))
        m.pop("learner", None)  # which learner process: the report's, not a metric
        for k, v in m.items():
            self.sums[k] = self.sums.get(k, 0) + v
        self.calls += 1

    def learner_means(self) -> dict:
        """The mean of each learner metric over the calls (one call: its values as given)."""
        return {f"learn/{k}": v if self.calls == 1 else v / self.calls
                for k, v in self.sums.items()}


def run_loop(cfg: DictConfig, fleet, counters: dict, window, hooks: list[Periodic], signals,
             start: tuple[float, int], times: RunTimes | None = None) -> str:
    """Step ``fleet`` until a stop condition; returns its name. Each record goes through the
    ``hooks`` in order (evaluation adds its keys, the report writes the record, then the
    checkpoint). ``start`` is the run's (perf_counter, env steps) at its start, which a loop
    restarted after a rebuild keeps for its wall budget and rates. ``times`` adds up where
    each role's time went, for the bottleneck report (``runtime/times.py``)."""
    started, steps_at_start = start
    times = times if times is not None else RunTimes()
    for key in ("env_steps_consumed", "updates", "dropped_fragments"):
        counters.setdefault(key, 0)
    fleet.start(counters["env_steps"])
    offline = fleet.offline  # no samplers: the algorithm reads a dataset (Algorithm.reads_dataset)
    interval, last = Interval(), time.perf_counter()
    rates: dict[str, float] = {}  # memory counters at the last record, for their rates

    def flush(now: float, timing: dict | None) -> None:
        nonlocal interval, last
        # A synchronous iteration is timed from its collection to its new weights, without
        # the hooks of the record before it (WALL-E's split adds up).
        dt = timing["collect_s"] + timing["learn_s"] if timing else now - last
        counters["wall_s"] += dt
        counters["iterations"] += 1
        counters["env_steps_consumed"] += interval.consumed
        counters["updates"] += interval.updates
        # A synchronous record reads no memory stats: its learners take the fragments directly.
        memories = [] if timing is not None else fleet.memory_stats()
        times.add_record(dt, timing, memories)
        record = make_record(counters, window, interval, dt, steps_at_start, now - started,
                             fleet, timing, rates, memories)
        for hook in hooks:
            record.update(hook(record))
        interval, last = Interval(), time.perf_counter()

    timing = None
    target = cfg.run.stop_at_return

    def learn_after(reports: list[dict]) -> bool:
        """A synchronous fleet makes no update after the episodes that bring the return to
        ``run.stop_at_return``: the run stops, and its checkpoint keeps the weights that
        played them rather than one update past them, which no episode has scored. (With
        ``algo.overlap`` the episodes are a version older than the weights: the fleet has its
        learners go back one update, ``Learner.rewind``.)"""
        return target is None or not window.reaches(
            target, [x for r in reports for x in r["episode_returns"]])

    while (reason := stop_reason(cfg, counters, window, started, signals)) is None:
        step = fleet.step(counters["env_steps"], learn_if=learn_after)
        for r in step.reports:
            interval.add_sampler(r)
            times.add_sampler(r)
            window.add(r["episode_returns"], r["episode_lengths"])
            counters["episodes"] += len(r["episode_returns"])
            counters["env_steps"] += r["env_steps"]
            counters["dropped_fragments"] += r.get("dropped", 0)
        for m in step.learned:
            if offline:  # no samplers: the run's env steps are the recorded ones learned from
                counters["env_steps"] += m["env_steps_consumed"]
                interval.steps += m["env_steps_consumed"]
            if "first_update_at" in m:  # when it happened, not when its call reported it
                counters.setdefault("first_update_at", m.pop("first_update_at"))
            times.add_learner(m)  # first: the interval pops the counters it sums
            interval.add_learner(m)
        timing = step.timing
        now = time.perf_counter()
        if timing is not None or now - last >= cfg.run.report_every_s:
            flush(now, timing)
    if not fleet.sync:  # the last partial interval, so the file ends where the run did
        flush(time.perf_counter(), None)
    return reason


# Replay-shard and dataset stats worth a metric each; counters among them also give a rate.
_SHARD_KEYS = ("size", "fill", "mean_priority", "beta", "frames", "obs_bytes", "priority_updates",
               "epochs", "dataset_episodes")
_SHARD_RATES = {"inserted": "inserts_per_s", "sampled": "samples_per_s"}
# A ranking replay's stats (``<type>_<key>``, buffers/ranked.py), and its seconds spent
# ranking, recorded as the share of the interval (``<type>_rank_share``).
_RANKED_KEYS = ("_lambda", "_candidates", "_dist_kept", "_dist_drawn", "_ready_frac",
                "_weights_version")


def make_record(counters, window, iv: Interval, dt: float, steps_at_start: int, elapsed: float,
                fleet, timing: dict | None, rates: dict, memories: list[dict]) -> dict:
    """One metrics record: the run's counters, the interval's rates and the learners' mean
    metrics; a synchronous iteration adds its collect/learn split, an asynchronous interval
    its learners' load, policy lag and memories (``memories``: their stats now)."""
    record = {
        "iteration": counters["iterations"], "env_steps": counters["env_steps"],
        "episodes": counters["episodes"], "return": window.mean,
        "episode_length": window.mean_length, "wall_s": counters["wall_s"],
        "env_steps_per_s": iv.steps / dt,
        "env_steps_per_s_avg": (counters["env_steps"] - steps_at_start) / elapsed,
        **{f"faults/{k}": v for k, v in fleet.faults.items()},
    }
    learner = iv.learner_means()
    if timing is not None:
        collect_s, learn_s = timing["collect_s"], timing["learn_s"]
        return {**record, "collect_s": collect_s, "learn_s": learn_s, "iter_s": dt,
                "collect_share": collect_s / dt, "learn_share": learn_s / dt,
                "sampler_collect_s_max": iv.collect_s_max,
                **learner, "learn/policy_lag_max": iv.lag_max}
    record.update({
        "env_steps_consumed": counters["env_steps_consumed"], "updates": counters["updates"],
        "consumed_per_s": iv.consumed / dt, "updates_per_s": iv.updates / dt,
        "batch_wait_s": iv.batch_wait_s, "learner_busy": (iv.train_s - iv.batch_wait_s) / dt,
        "sampler_put_wait_s": iv.put_wait_s, "fragments": iv.fragments,
        "policy_lag_mean": learner.get("learn/policy_lag_mean", float("nan")),
        "policy_lag_max": iv.lag_max, "dropped_fragments": counters["dropped_fragments"],
        **learner,
        **{key: sum(values) / len(values) for key, values in iv.explore.items()},
    })
    for k, m in enumerate(memories):
        for key, value in m.items():
            if key.endswith(("_size", *_RANKED_KEYS)) or key in _SHARD_KEYS:
                record[f"memory/{k}/{key}"] = value
            elif key.endswith("_rank_s"):
                name = f"memory/{k}/{key}"
                record[f"memory/{k}/{key.removesuffix('_s')}_share"] = (value - rates.get(name, 0)) / dt
                rates[name] = value
            elif key in _SHARD_RATES:
                name = f"memory/{k}/{key}"
                record[f"memory/{k}/{_SHARD_RATES[key]}"] = (value - rates.get(name, 0)) / dt
                rates[name] = value
    return record

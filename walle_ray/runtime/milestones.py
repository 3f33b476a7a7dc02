"""Time and cost to a score: when a run's return first reached each of ``run.milestones``.

For each milestone the run records the wall minutes since its command started, the agent
steps, and the core-hours spent so far: the CPU time of every role process and of the driver
(``CostMeter``), plus GPU-hours where learners hold GPUs. A resumed run adds the minutes
and hours of the runs before it (``counters``), so the figures are those of the whole run.
"""

from __future__ import annotations

import math
import time

from walle_ray.report import describe_milestone, score_key
from walle_ray.runtime.footprint import since_start


def milestone_targets(run_cfg) -> list[float]:
    """``run.milestones`` and ``run.stop_at_return``, sorted, each once."""
    targets = {float(m) for m in run_cfg.milestones or []}
    if run_cfg.stop_at_return is not None:
        targets.add(float(run_cfg.stop_at_return))
    return sorted(targets)


class CostMeter:
    """The CPU seconds of the driver and of every role process, and the GPU seconds of the
    processes that hold GPUs, as of the last answers from the fleet (``Placed.usage``).

    ``ask`` sends the fleet's processes a usage call without waiting (at most one in flight
    per process) and takes the answers that have come; ``measure`` waits for fresh ones, up
    to ``timeout_s``, keeping the last known figures of a process that did not answer. A
    process that died keeps the cost it reported last, so a restart loses little of it.
    """

    def __init__(self, before_core_s: float = 0.0, before_gpu_s: float = 0.0):
        self.before_core_s, self.before_gpu_s = before_core_s, before_gpu_s
        self.latest: dict[str, tuple[float, float]] = {}  # process -> (cpu_s, gpu_s)
        self.asked: list = []  # usage calls in flight
        self.asked_at = -math.inf

    def _take(self, fleet, timeout_s: float) -> None:
        if not self.asked:
            return
        answers, self.asked = fleet.usage_answers(self.asked, timeout_s)
        for answer in answers:
            self.latest[answer["process"]] = (answer["cpu_s"], answer["gpu_s"])

    def ask(self, fleet, every_s: float = 10.0) -> None:
        """Take the answers that came; ask again once every ``every_s``."""
        self._take(fleet, 0.0)
        if not self.asked and time.monotonic() - self.asked_at >= every_s:
            self.asked = fleet.ask_usage()
            self.asked_at = time.monotonic()

    def measure(self, fleet, timeout_s: float = 2.0) -> None:
        """Fresh figures from every process that answers within ``timeout_s``."""
        self._take(fleet, timeout_s)
        self.asked = fleet.ask_usage()
        self.asked_at = time.monotonic()
        self._take(fleet, timeout_s)

    @property
    def core_s(self) -> float:
        """CPU seconds of the whole run: the driver's own and its role processes'."""
        return self.before_core_s + time.process_time() + sum(c for c, _ in self.latest.values())

    @property
    def gpu_s(self) -> float:
        return self.before_gpu_s + sum(g for _, g in self.latest.values())


class Milestones:
    """A hook on every metrics record: the cost so far in the record (``core_hours``, and
    ``gpu_hours`` where learners hold GPUs), and the first time the run's mean return (its
    window full) reaches each target, a line and ``milestones/<score>/...`` keys.

    What was reached is kept in ``counters["milestones"]`` (a checkpoint carries it), as
    ``{score: {"minutes", "agent_steps", "core_hours", "gpu_hours"}}``; ``counters`` also
    keeps the command seconds and core seconds of earlier runs of a resumed run.
    """

    def __init__(self, targets: list[float], counters: dict, fleet, window):
        self.targets, self.counters, self.fleet, self.window = targets, counters, fleet, window
        self.reached: dict = counters.setdefault("milestones", {})
        self.before_s = counters.get("command_s", 0.0)  # the runs this one resumes
        self.meter = CostMeter(counters.get("core_s", 0.0), counters.get("gpu_s", 0.0))

    def minutes(self) -> float:
        """Wall minutes since the command started, with a resumed run's earlier runs."""
        return (self.before_s + since_start()) / 60.0

    def keep_totals(self) -> None:
        """The whole run's command seconds and cost into ``counters`` (before a checkpoint,
        and at the end)."""
        self.counters["command_s"] = self.before_s + since_start()
        self.counters["core_s"] = self.meter.core_s
        self.counters["gpu_s"] = self.meter.gpu_s

    def finish(self) -> None:
        """The last figures, while the fleet still answers."""
        try:
            self.meter.measure(self.fleet())
        except Exception:  # a fleet that lost a role: keep the figures it gave last
            pass
        self.keep_totals()

    def __call__(self, record: dict) -> dict:
        ret = record.get("return")
        due = [m for m in self.targets if score_key(m) not in self.reached]
        crossed = [m for m in due if self.window.full and ret is not None
                   and math.isfinite(ret) and ret >= m]
        fleet = self.fleet()
        if crossed:
            self.meter.measure(fleet)
        else:
            self.meter.ask(fleet)
        out = {"core_hours": self.meter.core_s / 3600}
        if self.meter.gpu_s:
            out["gpu_hours"] = self.meter.gpu_s / 3600
        for m in crossed:
            entry = {"minutes": self.minutes(), "agent_steps": int(record["env_steps"]),
                     "core_hours": out["core_hours"], "gpu_hours": out.get("gpu_hours", 0.0)}
            self.reached[score_key(m)] = entry
            out.update({f"milestones/{score_key(m)}/{k}": v for k, v in entry.items()
                        if k != "gpu_hours" or v})
            print(f"walle_ray: {describe_milestone(m, entry)}", flush=True)
        return out

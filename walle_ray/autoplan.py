"""``topology=auto``: the split of a run's work that a throughput model predicts fastest, from
costs measured on this machine (``runtime/calibrate.py``, or a finished run's report) and the
CPUs and GPUs each node offers. docs/topology_auto.md describes the model and its limits.

The model counts seconds of one CPU:

- a sampler process steps its envs and acts on one CPU: ``sampler_s(E)`` seconds per agent
  step with E envs per sampler, ``env_s + act_s / E`` (an act serves every env at once);
- a learner update takes ``update_s(t)`` seconds with t torch threads (measured at 1 and 2,
  beyond by Amdahl's law) and consumes ``steps_per_update`` agent steps: an asynchronous
  algorithm's fresh rows, a synchronous one's whole iteration; L learners split each update;
- a memory process spends ``memory_s`` per agent step it stores and serves;
- every process shares the cluster's CPUs, less a reserve for the driver and each process.

Asynchronous rate: the least of what the samplers, the learners, the memories and the CPUs
can do. Synchronous rate: an iteration's steps over its collect time (its samplers at once,
at most one per CPU) plus its learn time.

What auto varies is what the algorithm's rule leaves free (docs/algorithms.md, "One update,
however many learners"): the batch and learning rate of an update never change. It holds the
env's ``envs_per_sampler`` for an asynchronous algorithm (each fragment's rows), and the
total envs of a synchronous one (its fragment length is the batch over them), dividing them
among samplers differently.

This module imports neither torch nor Ray: the report command uses it in an instant.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

# CPUs the driver keeps busy (its loop, Ray's calls), and what each role process costs
# besides its work (Ray's threads in it). Ties within TIE of the best rate go to the plan
# with fewer processes.
DRIVER_CPUS = 0.1
PROCESS_CPUS = 0.02
TIE = 0.03
MAX_THREADS = 8
# What splitting an update across learner processes costs besides the split work (their
# all-reduces), as a share of the split update; the model splits updates across processes
# only where one node's threads cannot take them (docs/topology_auto.md).
SPLIT_OVERHEAD = 0.25


@dataclass(frozen=True)
class Costs:
    """What the model needs of one algorithm, env and network on one machine."""

    loop: str  # "sync" or "async"
    envs_per_sampler: int  # as configured (async: held)
    env_s: float  # CPU seconds per agent step in a sampler, besides the act's fixed part
    act_s: float  # CPU seconds of an act's fixed part (whatever its batch)
    update_s: dict  # {torch threads: seconds per update}, measured
    steps_per_update: float  # agent steps one update consumes
    update_cpu_s: dict = field(default_factory=dict)  # {torch threads: CPU seconds per update}
    memory_s: float = 0.0  # seconds of a memory process per agent step
    move_s: float = 0.0  # CPU seconds per agent step to move a fragment between processes once
    total_envs: int = 0  # sync: the envs held (the fragment length is the batch over them)
    # sync: pieces of an iteration's work dealt among the samplers whatever their envs (ES's
    # pairs; ``Algorithm.split_work``): the envs per sampler are held instead, not the total
    split_work: int = 0
    learner_counts: tuple = (1,)  # learner counts the algorithm's rule accepts for this batch
    gpus_per_learner: float = 0.0  # learner.num_gpus: update_s is a GPU's then
    # The learners update as fast as they can, whatever the samplers bring (a replay memory
    # without a replay ratio): no agent steps per update, a learner busy all the time.
    free_running: bool = False

    def sampler_s(self, envs: int) -> float:
        """A sampler process's CPU seconds per agent step: its envs, its act, handing the
        fragment on."""
        return self.env_s + self.act_s / max(1, envs) + self.move_s

    def update(self, threads: int) -> float:
        """Seconds per update with ``threads`` torch threads: measured, or Amdahl's law
        through the measured ones."""
        measured = {int(k): float(v) for k, v in self.update_s.items()}
        if threads in measured:
            return measured[threads]
        one = measured.get(1, min(measured.values()))
        two = measured.get(2)
        if two is None or two >= one:
            return min(measured.values())
        parallel = min(1.0, 2.0 * (1.0 - two / one))
        return one * ((1.0 - parallel) + parallel / threads)

    def update_cpu(self, threads: int) -> float:
        """CPU seconds per update with ``threads`` torch threads: measured, or every thread
        busy for the update's time."""
        measured = {int(k): float(v) for k, v in self.update_cpu_s.items()}
        return measured.get(threads, threads * self.update(threads))

    def to_json(self) -> dict:
        out = asdict(self)
        for key in ("update_s", "update_cpu_s"):
            out[key] = {str(k): v for k, v in getattr(self, key).items()}
        out["learner_counts"] = list(self.learner_counts)
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Costs":
        """Costs from their JSON (a cache file: numbers only, checked); ValueError where
        anything is missing, of the wrong type or out of range."""
        try:
            data = {key: data[key] for key in data if key in cls.__dataclass_fields__}
            for key in ("update_s", "update_cpu_s"):
                data[key] = {int(k): _number(v) for k, v in dict(data.get(key, {})).items()}
            data["learner_counts"] = tuple(int(n) for n in data.get("learner_counts", (1,)))
            costs = cls(**data)
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a set of costs: {exc}") from None
        numbers = [costs.env_s, costs.act_s, costs.memory_s, costs.move_s, costs.gpus_per_learner,
                   costs.steps_per_update, *costs.update_s.values(), *costs.update_cpu_s.values()]
        whole = [costs.envs_per_sampler, costs.total_envs, costs.split_work]
        if (not all(isinstance(n, int) and not isinstance(n, bool) for n in whole)
                or not isinstance(costs.free_running, bool)):
            raise ValueError("not a set of costs: a value of the wrong type")
        if (costs.loop not in ("sync", "async") or not costs.update_s
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                           and math.isfinite(x) and x >= 0 for x in numbers)
                or min(costs.update_s.values()) <= 0 or costs.sampler_s(1) <= 0
                or costs.envs_per_sampler < 1 or min(costs.learner_counts, default=0) < 1
                or (costs.steps_per_update <= 0 and not costs.free_running)
                or costs.split_work < 0 or (costs.loop == "sync" and costs.total_envs < 1)):
            raise ValueError("not a set of costs: a value is missing or out of range")
        return costs


@dataclass(frozen=True)
class Plan:
    """One split of the work and what the model predicts for it."""

    samplers: int
    memories: int
    learners: int
    threads: int  # torch threads per learner
    envs_per_sampler: int
    rate: float = 0.0  # predicted agent steps per second
    bound: str = ""  # sampler-bound, learner-bound, memory-bound, CPU-bound
    limits: dict = field(default_factory=dict)  # the rate each part allows

    @property
    def spec(self) -> str:
        return f"{self.samplers}a{self.memories}m{self.learners}l"

    @property
    def processes(self) -> int:
        return self.samplers + self.memories + self.learners

    def line(self, costs: Costs) -> str:
        """'auto: 6a2m1l, 16 envs per sampler, learner 1 thread; predicted 2300 agent
        steps/s, learner-bound'."""
        learners = "learner" if self.learners == 1 else f"{self.learners} learners"
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        held = ("envs per sampler held" if costs.loop == "async" or costs.split_work
                else f"{costs.total_envs} envs in all held")
        return (f"auto: {self.spec}, {self.envs_per_sampler} envs per sampler ({held}), "
                f"{learners} {threads}{' each' if self.learners > 1 else ''}; predicted "
                f"{self.rate:.0f} agent steps/s, {self.bound}")

    def to_json(self) -> dict:
        return {**asdict(self), "spec": self.spec}


def predict(costs: Costs, plan: Plan, cpus: list[float]) -> Plan:
    """``plan`` with the rate the model predicts on nodes of ``cpus`` CPUs, and its bound."""
    total = sum(cpus)
    threads = plan.threads
    update = costs.update(threads)
    if plan.learners > 1:
        update *= (1.0 + SPLIT_OVERHEAD) / plan.learners
    sampler = costs.sampler_s(plan.envs_per_sampler)
    memory_procs = plan.memories if costs.loop == "async" else 0
    spare = total - DRIVER_CPUS - PROCESS_CPUS * (plan.samplers + memory_procs + plan.learners)
    learner_cpu = 0.0 if costs.gpus_per_learner else costs.update_cpu(threads)
    if costs.loop == "sync":
        # Each sampler process runs its share of the iteration's steps; at most one per CPU
        # at a time. Then the learners update, the samplers waiting.
        at_once = max(1e-9, min(plan.samplers, spare))
        collect = costs.steps_per_update * sampler / at_once
        rate = costs.steps_per_update / (collect + update)
        bound = "sampler-bound" if collect >= update else "learner-bound"
        limits = {"collect_s": collect, "learn_s": update}
        return _with(plan, rate, bound, limits)
    # A fragment's rows go sampler -> memory -> learner: a second move, in the readers.
    per_step = sampler + costs.memory_s + costs.move_s
    if costs.free_running:  # busy learner threads take their turns on the CPUs as samplers do
        busy = 0 if costs.gpus_per_learner else threads * plan.learners
        spare *= plan.samplers / (plan.samplers + busy)
        limits = {"sampler-bound": plan.samplers / sampler}
    else:
        per_step += learner_cpu / costs.steps_per_update
        limits = {"sampler-bound": plan.samplers / sampler,
                  "learner-bound": costs.steps_per_update / update}
    limits["CPU-bound"] = max(0.0, spare) / per_step
    if costs.memory_s > 0:
        limits["memory-bound"] = memory_procs / costs.memory_s
    bound = min(limits, key=limits.get)
    return _with(plan, limits[bound], bound, limits)


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{value!r} is not a number")
    return float(value)


def _with(plan: Plan, rate: float, bound: str, limits: dict) -> Plan:
    return Plan(plan.samplers, plan.memories, plan.learners, plan.threads,
                plan.envs_per_sampler, rate, bound, {k: float(v) for k, v in limits.items()})


def candidates(costs: Costs, cpus: list[float], gpus: float = 0.0,
               keep: Plan | None = None) -> list[Plan]:
    """Every split the model weighs on nodes of ``cpus`` CPUs with ``gpus`` GPUs in all; with
    ``keep``, those with its memories and learners only."""
    total, biggest = sum(cpus), max(cpus)
    out = []
    # One learner process takes a node's threads; more only across nodes (or GPUs).
    learner_counts = [n for n in costs.learner_counts if n <= len(cpus)] or [1]
    if costs.gpus_per_learner > 0:  # one learner per GPU share the cluster has
        fit = int(gpus / costs.gpus_per_learner + 1e-9)
        learner_counts = [n for n in costs.learner_counts if n <= fit] or [1]
    if keep is not None:
        learner_counts = [keep.learners]
    for learners in learner_counts:
        most = min(MAX_THREADS, max(1, int(biggest)), max(1, int(total) // learners))
        memory_counts = ([keep.memories] if keep is not None
                         else _memory_counts(costs, learners, total))
        for threads in range(1, most + 1):
            for memories in memory_counts:
                for samplers, envs in _sampler_splits(costs, total):
                    # every memory needs a sampler, and a synchronous learner its own ones
                    if samplers < memories or (costs.loop == "sync" and samplers % learners):
                        continue
                    out.append(Plan(samplers, memories, learners, threads, envs))
    return out


def _memory_counts(costs: Costs, learners: int, total: float) -> list[int]:
    """Memories: one per learner and multiples of it (each learner reads the same number)."""
    if costs.loop == "sync":
        return [learners]
    return [learners * k for k in (1, 2, 4, 8) if learners * k <= max(learners, int(total))]


def _sampler_splits(costs: Costs, total: float) -> list[tuple[int, int]]:
    """(samplers, envs per sampler): async, any count up to two per CPU with the env's
    envs per sampler; sync, the held total envs divided evenly, or, where the samplers deal
    an iteration's pieces of work among them (``split_work``), any count up to two per CPU
    that divides them and leaves each sampler's envs an episode each, with the env's envs
    per sampler."""
    if costs.split_work:
        # A sampler steps all its envs until its last piece ends: beyond a piece (two
        # episodes, ``Algorithm.split_work``) per two envs, more samplers only add idle envs.
        n, envs = costs.split_work, costs.envs_per_sampler
        fit = [a for a in range(1, n + 1) if n % a == 0 and a <= max(1, 2 * total)]
        return [(a, envs) for a in fit if 2 * n // a >= envs or a == 1]
    if costs.loop == "sync":
        n = max(1, costs.total_envs)
        return [(a, n // a) for a in range(1, n + 1) if n % a == 0 and a <= max(1, 2 * total)]
    return [(a, costs.envs_per_sampler) for a in range(1, max(1, int(2 * total)) + 1)]


def choose(costs: Costs, cpus: list[float], gpus: float = 0.0, keep: Plan | None = None) -> Plan:
    """The plan with the best predicted rate; among those within ``TIE`` of it, the one with
    the fewest processes, then the fewest threads. With ``keep``, only plans with its
    memories and learners (a re-plan keeps what the checkpoint's state is made of)."""
    plans = [predict(costs, plan, cpus) for plan in candidates(costs, cpus, gpus, keep)]
    if keep is None and not costs.gpus_per_learner:
        # Split an update across CPU learner processes only where one learner, with every
        # thread of a node, is what holds the run back: the split's all-reduces are not
        # measured, and where anything else binds they only cost.
        one = [p for p in plans if p.learners == 1]
        if one and max(one, key=lambda p: p.rate).bound != "learner-bound":
            plans = one
    if not plans:  # too few samplers could ever feed the kept memories: as many as they need
        plans = [predict(costs, Plan(max(keep.memories, keep.learners), keep.memories,
                                     keep.learners, 1, costs.envs_per_sampler), cpus)]
    best = max(plan.rate for plan in plans)
    close = [p for p in plans if p.rate >= (1.0 - TIE) * best]
    return min(close, key=lambda p: (p.processes, p.threads, -p.rate))


def costs_from_report(report: dict, config: dict) -> Costs | None:
    """The costs a finished run measured (its ``report.json`` ``totals``: the CPU seconds of
    its samplers per agent step and of its learners per update) as the model takes them, for
    the report command to say what auto would choose; ``config`` is the run's
    ``config.yaml``. None where the run measured too little (a run from before CPU seconds
    were reported, or one with no update). A run measures each sampler at one width, so an
    act's fixed part is not split from the per-env work."""
    totals = report.get("totals") or {}
    samplers = (totals.get("samplers") or {}).values()
    cpu = sum(s.get("cpu_s", 0.0) for s in samplers)
    steps = sum(s.get("env_steps", 0) for s in samplers)
    learners = totals.get("learners") or {}
    updates, learn_cpu = learners.get("updates", 0), learners.get("cpu_s", 0.0)
    if not cpu or not steps or not updates or not learn_cpu:
        return None
    run = report.get("run", {})
    envs = int((config.get("env") or {}).get("envs_per_sampler", 1))
    sync = run.get("loop") == "sync"
    counts = (report.get("auto") or {}).get("costs", {}).get("learner_counts")
    return Costs(loop="sync" if sync else "async", envs_per_sampler=envs, env_s=cpu / steps,
                 # an update's CPU seconds, as one thread would spend them
                 act_s=0.0, update_s={1: learn_cpu / updates}, update_cpu_s={1: learn_cpu / updates},
                 steps_per_update=steps / updates,
                 total_envs=envs * int(report.get("samplers", {}).get("count") or 1) if sync else 0,
                 split_work=int(run.get("split_work") or 0) if sync else 0,
                 learner_counts=tuple(counts or (int(run.get("learners") or 1),)))

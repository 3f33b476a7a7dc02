"""A sampler process's body (``SamplerWorker``): one or more logical samplers, their
weights and where their fragments go. ``runtime/remote.py`` makes it a Ray actor.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from walle_ray.actors.restart import RestartingSampler
from walle_ray.pulse import PULSE, thread_stacks, working
from walle_ray.runtime.process import prepare_process
from walle_ray.runtime.role_process import Placed, Watched, actor_handle, process_usage


# A sampler's per-fragment stats that a call's report sums over its fragments.
SUMMED_STATS = ("env_steps", "collect_s", "transitions", "sampler_restarts", "lost_fragments",
                "env_s", "act_s", "cpu_s")


def pin_to_cpu(slot: int | None) -> int | None:
    """Pin the calling thread, and the threads it starts from now on, to one of the CPUs
    this process may use: the one at ``slot`` mod their count. Returns that CPU, or None
    with no ``slot`` or where the OS has no CPU affinity (macOS). Threads already running
    (Ray's) stay free."""
    if slot is None or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[slot % len(cpus)]
    os.sched_setaffinity(0, {cpu})
    return cpu


@dataclass(frozen=True)
class SlotSpec:
    """One sampler of a sampler process: the class and arguments the algorithm names
    (``Algorithm.sampler_spec``) and, for an asynchronous algorithm, where its fragments go:
    (memory, the rows of each fragment it takes: a slice, a list, or None for all) pairs
    (``Topology.routes``; for samplers stepping together, ``topology.lane_routes``)."""

    cls: type
    args: tuple
    kwargs: dict = field(default_factory=dict)
    routes: tuple = ()


class SamplerWorker(Watched, Placed):
    """One sampler process running one or more logical samplers (``topology.pack``), each with
    its own envs, seed, memory and fault accounting, in turn; or, with ``lanes``, one sampler
    that steps one sampler's envs for several logical samplers together (``process_lanes``),
    its reports split among them. The process keeps the newest weights it has pulled from the parameter
    server, and gives each sampler them before its next fragment.

    Synchronous algorithms call ``collect`` (a fragment of every sampler, routed by the
    caller); asynchronous ones call ``run``, which pushes fragments into each sampler's
    memory and waits while that memory is full.
    """

    def __init__(self, weights_source, slots: list[SlotSpec], pin: int | None = None,
                 lanes: tuple[int, ...] | None = None):
        """``weights_source`` is the parameter server's handle or name. With ``pin``, the
        samplers and their env threads run on one CPU (``pin_to_cpu``), chosen before any env
        starts its threads so that they inherit it. With ``lanes``, the one slot steps
        envs for those logical samplers together (``topology.lane_envs``), and ``run``
        reports for each of them."""
        self.cpu = pin_to_cpu(pin)
        self.lanes = lanes
        prepare_process(torch_threads=1)
        self.source = actor_handle(weights_source)
        self.specs = slots
        # Each sampler is built when it first collects: the first ones' fragments reach the
        # memories while the others are still making their envs.
        self.slots: list[RestartingSampler | None] = [None] * len(slots)
        self.routes = [_by_process(spec.routes) for spec in slots]
        self.version, self.weights = -1, None  # the newest weights this process has
        self.asked = None  # a latest() call in flight
        self.asked_again = False  # it was asked right before a fragment (``_ask``)
        self.weights_wait_s = 0.0
        self.ask_lead = 0  # steps before a fragment ends to ask at; set by the first sampler

    def _slot(self, s: int) -> RestartingSampler:
        """Sampler ``s`` of this process, built on first use."""
        if self.slots[s] is None:
            spec = self.specs[s]
            self.slots[s] = RestartingSampler(spec.cls, spec.args, spec.kwargs)
            if not self.ask_lead:
                self.ask_lead = max(1, -(-self.slots[s].sampler.fragment_length // 8))
        return self.slots[s]

    def _take(self, latest) -> None:
        """Keep ``latest`` (version, box) when it is newer than what this process has."""
        if latest is not None and latest[0] > self.version:
            with PULSE.waiting("weights"):
                self.version, self.weights = latest[0], ray.get(latest[1][0])

    def _fetch(self) -> None:
        """Blocking: the newest weights from the source, when newer than this process's."""
        with PULSE.waiting("weights"):
            self._take(ray.get(self.source.latest.remote(self.version)))

    def _give(self, sampler) -> None:
        if sampler.version < self.version:
            sampler.set_weights(self.weights, self.version)

    def _ask(self, again: bool = False) -> None:
        """Ask for newer weights; ``again``: right before a fragment, after a wait for room,
        whose late answer says nothing about when to ask during a fragment."""
        self.asked = self.source.latest.remote(self.version)
        self.asked_again = again

    # The asynchronous samplers' weights feed (``contracts.WeightsFeed``) is the process
    # itself: what one sampler asked for ahead, the next one gets.

    @property
    def lead(self) -> int:
        return self.ask_lead

    def ahead(self) -> None:
        self._ask()

    def refresh(self, sampler) -> None:
        """Newer weights before a fragment, from the request sent ``ask_lead`` steps before
        the last fragment ended, so the round trip overlaps collection. The lead adapts:
        twice as many steps after an answer that came late, one fewer after one in time.
        With no weights yet (the first fragment) it pulls, blocking."""
        t0 = time.perf_counter()
        asked, self.asked = self.asked, None
        if asked is not None:
            with PULSE.waiting("weights"):
                latest = ray.get(asked)
            if self.asked_again:
                pass
            elif time.perf_counter() - t0 > 5e-4:  # it had to wait for the answer: ask earlier
                self.ask_lead = min(2 * self.ask_lead, sampler.fragment_length)
            else:  # in time: ask a step later next time, for fresher weights
                self.ask_lead = max(1, self.ask_lead - 1)
            self._take(latest)
        if self.weights is None:
            self._fetch()
        self._give(sampler)
        self.weights_wait_s += time.perf_counter() - t0

    def _pull(self, sampler, version: int | None, weights: list | None) -> None:
        """Weights at least as new as ``version`` (the newest if None), blocking: from
        ``weights`` (the box holding that version's ref) when the caller sent them."""
        t0 = time.perf_counter()
        if weights is not None and version is not None:
            self._take((version, weights))
        elif version is None or version > self.version:
            self._fetch()
        self._give(sampler)
        self.weights_wait_s += time.perf_counter() - t0

    def ready(self) -> bool:
        """Answers once the actor is up (again, after a restart)."""
        return True

    @working
    @ray.method(num_returns=2)
    def collect(self, version: int | None = None, weights: list | None = None):
        """A fragment of every sampler of this process, then their stats: ``(fragment_0,
        ..., fragment_k-1, [stats_0, ..., stats_k-1])``, as separate objects, so each
        fragment can be routed by reference (a process of k samplers is called with
        ``.options(num_returns=k + 1)``)."""
        fragments, stats = [], []
        feed = GivenWeights(self, version, weights)
        for s in range(len(self.specs)):
            self.weights_wait_s = 0.0
            fragment, report = self._slot(s).collect(feed)
            report["weights_wait_s"] = self.weights_wait_s
            fragments.append(fragment)
            stats.append(report)
        return (*fragments, stats)

    @working
    def run(self, num_fragments: int) -> list[dict]:
        """``num_fragments`` fragments of each sampler, in turn, into its memories (a
        fragment's rows dealt across them, or whole: ``Topology.routes``). Returns one report
        per logical sampler (``split_lanes`` where they step together).

        This process keeps at most one put in flight to each memory process (one call for
        the pieces of a fragment that go to its memories): before it puts there again it
        waits until the last put was taken, so a full memory holds back at most one
        fragment's worth from each sampler process, however many logical samplers it runs,
        while the next fragment is collected (docs/algorithms.md, "One update, however many
        learners").

        Each fragment starts from the newest weights published until shortly before it
        (``refresh``): asking for them a few steps ahead hides the round trip without the
        fragment of policy lag a request left in flight for a whole fragment would add (which
        cost IMPALA on CartPole more env steps to learn); at the start of a call and after a
        wait for a memory they are asked for again."""
        totals = [{"env_steps": 0, "episode_returns": [], "episode_lengths": [],
                   "collect_s": 0.0, "put_wait_s": 0.0, "fragments": 0, "weights_wait_s": 0.0}
                  for _ in self.specs]
        # An answer from before this call is stale: ask again, so the call's first fragment
        # starts from the newest weights (a process of one sampler collecting one fragment a
        # call would otherwise never take newer ones).
        if self.weights is not None:
            self._ask(again=True)
        pending: dict = {}  # memory process -> (the sampler that put, its put's ref)
        for _ in range(num_fragments):
            for s in range(len(self.specs)):
                slot = self._slot(s)
                totals[s]["sampler"] = slot.sampler.index
                self.weights_wait_s = 0.0
                rollout, stats = slot.collect(self)
                totals[s]["weights_wait_s"] += self.weights_wait_s
                waited = 0.0
                for name, actor, parts in self.routes[s]:
                    if name in pending:
                        owner, ref = pending.pop(name)
                        t0 = time.perf_counter()
                        with PULSE.waiting("a memory"):
                            totals[owner]["put_wait_s"] += ray.get(ref)
                        waited += time.perf_counter() - t0
                    items = [(rollout if rows is None else rollout.rows(rows), key)
                             for key, rows in parts]
                    pending[name] = (s, actor.put.remote(*items[0]) if len(items) == 1
                                     else actor.put_many.remote(items))
                if waited > 1e-3:  # the weights asked for during the fragment are old now
                    self._ask(again=True)
                _add_stats(totals[s], stats)
        with PULSE.waiting("a memory"):
            for owner, ref in pending.values():
                totals[owner]["put_wait_s"] += ray.get(ref)
        return totals if self.lanes is None else split_lanes(totals[0], self.lanes)


@dataclass
class GivenWeights:
    """The synchronous samplers' weights feed: the version an iteration was called with
    (its box sent along, or pulled when the process has older ones); nothing to ask ahead."""

    worker: SamplerWorker
    version: int | None
    weights: list | None
    lead: int = 0

    def refresh(self, sampler) -> None:
        self.worker._pull(sampler, self.version, self.weights)

    def ahead(self) -> None:
        pass


def _by_process(routes) -> list[tuple[str, Any, list[tuple[int, Any]]]]:
    """A sampler's routes (``SlotSpec.routes``) grouped by memory process: (its name, its
    handle, [(logical memory, the rows it takes)]), so one call carries a fragment's pieces
    for all the memories of a process."""
    groups: dict = {}
    for memory, rows in routes:
        name = memory.actor if isinstance(memory.actor, str) else id(memory.actor)
        if name not in groups:
            groups[name] = (name, memory.resolve().actor, [])
        groups[name][2].append((memory.key, rows))
    return list(groups.values())


# What a lanes sampler's report shares among its lanes; the rest (fragments, the
# policy's version and exploration) holds for each of them.
_SHARED = (*SUMMED_STATS, "put_wait_s", "weights_wait_s")
_ONCE = ("sampler_restarts", "lost_fragments")  # a failure of the one sampler counts once


def split_lanes(total: dict, lanes: tuple[int, ...]) -> list[dict]:
    """A lanes sampler's ``run`` report as one report per logical sampler: its env steps
    and seconds shared evenly (so each sampler's shares of its time are the sampler's),
    the finished episodes and failures under the first, and the fragments credited to
    each (each sampler took part in every one). ``lane`` numbers the reports, so that the
    run counts the process's fragments once (``lane`` 0) in its totals and memories."""
    n = len(lanes)
    reports = []
    for j, i in enumerate(lanes):
        report = {key: value for key, value in total.items()
                  if key not in _SHARED and key not in ("episode_returns", "episode_lengths")}
        report["sampler"], report["lane"] = i, j
        for key in _SHARED:
            if key not in total:
                continue
            if key in _ONCE:
                report[key] = total[key] if j == 0 else 0
            elif isinstance(total[key], int):
                report[key] = total[key] // n + (j < total[key] % n)
            else:
                report[key] = total[key] / n
        report["episode_returns"] = total["episode_returns"] if j == 0 else []
        report["episode_lengths"] = total["episode_lengths"] if j == 0 else []
        reports.append(report)
    return reports


def _add_stats(total: dict, stats: dict) -> None:
    """A fragment's stats added to a call's report."""
    for key, value in stats.items():
        if key in SUMMED_STATS:
            total[key] = total.get(key, 0) + value
        elif key.startswith("explore/"):
            total[key] = value  # the newest exploration setting
    total["episode_returns"] += stats["episode_returns"]
    total["episode_lengths"] += stats["episode_lengths"]
    total["fragments"] += 1
    total["policy_version"] = stats["policy_version"]


class MainThreadSamplerWorker(SamplerWorker):
    """A sampler process whose calls run on its main thread, for envs that need it (signal
    handlers, some renderers): no thread answers for it while a call runs, so it is not
    watched for stalls (``run.stall_s=null``)."""

    def progress(self) -> dict:
        return PULSE.progress()

    def stacks(self) -> str:
        return thread_stacks()

    def usage(self) -> dict:
        return process_usage()

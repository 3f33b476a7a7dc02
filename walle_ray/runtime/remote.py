"""The one place that turns role classes into Ray actors.

Weights are put in the object store once per version and passed by reference; fragments
travel as task results and arguments, read zero-copy from the object store where they land.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import ray
import torch

from walle_ray.actors.param_server import ParameterServer
from walle_ray.actors.restart import RestartingSampler
from walle_ray.runtime.memory_worker import AsyncMemoryWorker, Placed
from walle_ray.pulse import PULSE, thread_stacks, working
from walle_ray.runtime.process import prepare_process
from walle_ray.runtime.threads import ThreadChoice


# A sampler's per-fragment stats that a call's report sums over its fragments.
SUMMED_STATS = ("env_steps", "collect_s", "transitions", "sampler_restarts", "lost_fragments",
                "env_s", "act_s", "cpu_s")


def _actor(handle_or_name):
    """An actor handle, looked up in this job's namespace when given by name."""
    return ray.get_actor(handle_or_name) if isinstance(handle_or_name, str) else handle_or_name


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
class MemoryRef:
    """Logical memory ``key`` in a memory process: ``actor`` is its handle, or its name where
    a sampler looks it up (a handle among a sampler's arguments would tie Ray's restart of
    the sampler to that handle's lifetime, ray-project/ray#53727)."""

    actor: Any
    key: int

    def resolve(self) -> "MemoryRef":
        return MemoryRef(_actor(self.actor), self.key)


@dataclass(frozen=True)
class SlotSpec:
    """One logical sampler of a sampler process: the class and arguments the algorithm names
    (``Algorithm.sampler_spec``) and, for an asynchronous algorithm, where its fragments go:
    (memory, the rows of each fragment it takes, None for all) pairs (``Topology.routes``)."""

    cls: type
    args: tuple
    kwargs: dict = field(default_factory=dict)
    routes: tuple = ()


class Watched:
    """What a process that runs its own work (samplers, learners) answers on a thread of its
    own, even while a call is under way or stuck (``runtime/stalls.py``)."""

    @ray.method(concurrency_group="watch")
    def progress(self) -> dict:
        return PULSE.progress()

    @ray.method(concurrency_group="watch")
    def stacks(self) -> str:
        return thread_stacks()


class SamplerWorker(Watched, Placed):
    """One sampler process running one or more logical samplers (``topology.pack``), each with
    its own envs, seed, memory and fault accounting, in turn. The process keeps the newest
    weights it has pulled from the parameter server, and gives each sampler them before its
    next fragment.

    Synchronous algorithms call ``collect`` (a fragment of every sampler, routed by the
    caller); asynchronous ones call ``run``, which pushes fragments into each sampler's
    memory and waits while that memory is full.
    """

    def __init__(self, weights_source, slots: list[SlotSpec], pin: int | None = None):
        """``weights_source`` is the parameter server's handle or name. With ``pin``, the
        samplers and their env threads run on one CPU (``pin_to_cpu``), chosen before any env
        starts its threads so that they inherit it."""
        self.cpu = pin_to_cpu(pin)
        prepare_process(torch_threads=1)
        self.source = _actor(weights_source)
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
        per sampler.

        This process keeps at most one put in flight to each memory process (one call for
        the pieces of a fragment that go to its memories): before it puts there again it
        waits until the last put was taken, so a full memory holds back at most one
        fragment's worth from each sampler process, however many logical samplers it runs,
        while the next fragment is collected (docs/algorithms.md, "One update, however many
        learners").

        Each fragment starts from the newest weights published until shortly before it
        (``refresh``): asking for them a few steps ahead hides the round trip without the
        fragment of policy lag a request left in flight for a whole fragment would add (which
        cost IMPALA on CartPole more env steps to learn); after a wait for a memory they are
        asked for again."""
        totals = [{"env_steps": 0, "episode_returns": [], "episode_lengths": [],
                   "collect_s": 0.0, "put_wait_s": 0.0, "fragments": 0, "weights_wait_s": 0.0}
                  for _ in self.specs]
        self.asked = None  # an answer from before this call is stale
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
        return totals


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


@dataclass
class Source:
    """Memories of one process that a learner process asks in one call (``sample_many``);
    ``shards[i]`` is the learner shard that ``keys[i]`` serves."""

    actor: Any
    keys: list[int]
    shards: list[int]

    def ask(self):
        return self.actor.sample_many.remote(self.keys)


def batch_sources(shards: list[list[MemoryRef]]) -> list[Source]:
    """Where a learner process asks for batches. When each of its shards reads one memory,
    a call per memory process covers the shards whose memories live there (a packed
    learner of 4 shards reading 4 memories in 2 processes makes 2 calls per update, not
    4); when a shard reads several, each memory is asked on its own and the shard takes
    whichever serves first, so one that has nothing to serve (below ``learning_starts``,
    ahead of its replay ratio) holds up none of the others."""
    if all(len(memories) == 1 for memories in shards):
        grouped: dict = {}
        for j, (memory,) in enumerate(shards):
            source = grouped.setdefault(memory.actor, Source(memory.actor, [], []))
            source.keys.append(memory.key)
            source.shards.append(j)
        return list(grouped.values())
    return [Source(m.actor, [m.key], [j]) for j, memories in enumerate(shards) for m in memories]


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


class LearnerWorker(Watched, Placed):
    """A learner process, for one or more learner shards (``topology.pack``): it reads
    fragments from the memories of its shards and publishes weights by reference. With
    several shards each update takes a batch from each and learns from them together: the
    mean gradient over their rows, which the all-reduce of one process per shard computes.

    It also serves as the parameter server when the topology has none (``...0p``).
    """

    def __init__(self, spec: tuple[type, tuple, dict], obs_space, action_space,
                 device: str = "cpu", threads: int = 1, choose_threads: bool = False):
        """``spec``: the learner the algorithm names (``Algorithm.learner``), built here with
        the env's spaces after ``threads`` torch threads are set up. ``choose_threads``: a
        synchronous learner times its first updates with those threads and with one, and
        keeps the faster (``runtime/threads.py``)."""
        prepare_process(torch_threads=threads)
        self.threads = ThreadChoice(torch.get_num_threads()) if choose_threads else None
        cls, args, kwargs = spec
        self.learner = cls(*args, obs_space, action_space, device=device, **kwargs)
        self.ps = ParameterServer()
        self.shards: list[list[MemoryRef]] = []
        self.publish_to = None
        self.publishes = False
        self.sources: list[Source] = []
        self.inflight: list[tuple] = []  # (source, ref of a sample_many call), oldest first
        self.held: list[deque] = []  # per shard: (memory, batch) served beyond an update's need
        self.first_update_at = 0.0  # wall-clock time of this process's first update

    def attach(self, shards: list[list[MemoryRef]], publish_to=None, publishes: bool = False,
               prefetch: int = 2, publish_every: int = 1) -> None:
        """Asynchronous mode: the memories each shard of this process reads, and whether it
        publishes weights (learner 0 does, every ``publish_every`` updates) to
        ``publish_to`` (the parameter server, or itself when None)."""
        self.shards, self.publish_to, self.publishes = shards, publish_to, publishes
        self.sources = batch_sources(shards)
        self.inflight = []
        self.held = [deque() for _ in shards]
        self.prefetch = prefetch
        self.publish_every = publish_every

    def _next_batches(self, timeout_s: float = 2.0) -> list:
        """A (memory, batch) pair for each shard, from the requests in flight (each source
        keeps ``prefetch``; ``batch_sources``), or None for a shard that none served within
        ``timeout_s``. Batches served beyond what this update needs wait for the next."""
        served = [held.popleft() if held else None for held in self.held]
        for source in self.sources:  # keep ``prefetch`` requests in flight to each source
            asked = sum(src is source for src, _ in self.inflight)
            self.inflight += [(source, source.ask())
                              for _ in range(self.prefetch - asked) if self._wants(source)]
        deadline = time.perf_counter() + timeout_s
        while any(pair is None for pair in served):
            refs = [ref for _, ref in self.inflight]
            if not refs:  # every source's shards hold batches enough: a shard starves
                time.sleep(min(timeout_s, 0.05))
                break
            ready, _ = ray.wait(refs, num_returns=1,
                                timeout=max(0.0, deadline - time.perf_counter()))
            if not ready:
                break
            source, ref = self.inflight.pop(refs.index(ready[0]))
            if self._wants(source):
                self.inflight.append((source, source.ask()))  # keep its prefetch
            for key, shard, batch in zip(source.keys, source.shards, ray.get(ref), strict=True):
                if batch is None:
                    continue
                pair = (MemoryRef(source.actor, key), batch)
                if served[shard] is None:
                    served[shard] = pair
                else:
                    self.held[shard].append(pair)
            if time.perf_counter() >= deadline:
                break
        return served

    def _wants(self, source: Source) -> bool:
        """Whether to ask ``source`` again: not while one of its shards already holds
        ``prefetch`` batches (another shard's memory starving would otherwise pile up the
        batches of the shards it feeds)."""
        return all(len(self.held[shard]) < self.prefetch for shard in source.shards)

    @working
    def train(self, num_updates: int, env_steps: int) -> dict:
        """Up to ``num_updates`` updates on batches pulled from the memories; averaged
        metrics plus timings. Returns early when data stops coming (e.g. while the run
        stops), so the actor stays free to answer; all learners stop at the same update."""
        sums: dict[str, float] = {}
        wait_s = 0.0
        lag_max = 0.0
        rows = 0
        done = 0
        first_at = 0.0
        t_start = time.perf_counter()
        for _ in range(num_updates):
            t0 = time.perf_counter()
            with PULSE.waiting("memories"):
                served = self._next_batches()
            wait_s += time.perf_counter() - t0
            have = all(pair is not None for pair in served)
            everyone = self.learner.collective.all_reduce_min(torch.tensor([float(have)]))
            if not everyone.item():
                for s, pair in enumerate(served):
                    if pair is not None:
                        self.held[s].appendleft(pair)  # keep it for the next call
                break
            batches = [batch for _, batch in served]
            metrics = self.learner.update(batches, env_steps)
            first_at = first_at or time.time()
            feedback = self.learner.memory_feedback()
            if feedback is not None:  # back to the memories that served the batches
                parts = ([feedback] if len(batches) == 1
                         else feedback.split([b.num_steps for b in batches]))
                for (memory, _), part in zip(served, parts, strict=True):
                    memory.actor.feedback.remote(part, memory.key)
            done += 1
            rows += sum(batch.num_steps for batch in batches)
            lag_max = max(lag_max, metrics.pop("policy_lag_max"))
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
            if self.publishes and self.learner.version % self.publish_every == 0:
                self.publish(self.publish_to, wait=False)
        out = {k: v / done for k, v in sums.items()} if done else {}
        out.update(version=self.learner.version, policy_lag_max=lag_max, updates=done,
                   env_steps_consumed=rows, batch_wait_s=wait_s,
                   train_s=time.perf_counter() - t_start)
        if done and not self.first_update_at:
            out["first_update_at"] = self.first_update_at = first_at
        return out

    def group_address(self) -> tuple[str, int]:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def gpus(self) -> list[tuple[str, str]]:
        """The GPUs Ray gave this process, as (node, GPU id) pairs."""
        context = ray.get_runtime_context()
        return [(context.get_node_id(), str(g)) for g in context.get_accelerator_ids().get("GPU", [])]

    def join_group(self, address: str, port: int, rank: int, world_size: int,
                   backend: str | None = None) -> None:
        self.learner.join_group(address, port, rank, world_size, backend)

    @working
    def learn(self, fragments: list, env_steps: int, publishes: bool = False,
              publish_to=None) -> tuple:
        """A synchronous update on the iteration's fragments its shards learn from (their
        references, read zero-copy here). Returns its metrics and, when it ``publishes``,
        the new weights' (version, box) as ``publish`` does (else None), so the update and
        the publish cost the caller one round trip."""
        with PULSE.waiting("samplers"):
            fragments = ray.get(fragments)
        if self.threads is None or self.threads.chosen is not None:
            metrics = self.learner.update(fragments, env_steps)
            metrics["torch_threads"] = torch.get_num_threads()
        else:
            metrics = self._timed_update(fragments, env_steps)
        return metrics, (self.publish(publish_to, wait=False) if publishes else None)

    def _timed_update(self, fragments: list, env_steps: int) -> dict:
        """An update while the learner chooses its torch threads (``runtime/threads.py``)."""
        threads = self.threads.next()
        torch.set_num_threads(threads)
        started = time.perf_counter()
        metrics = self.learner.update(fragments, env_steps)
        metrics["torch_threads"] = threads
        steps = metrics.get("grad_steps")
        line = self.threads.timed(threads, time.perf_counter() - started,
                                  None if steps is None else int(steps))
        if self.threads.chosen is not None:
            torch.set_num_threads(self.threads.chosen)
        if line is not None:
            print(line, flush=True)
        return metrics

    def publish(self, ps=None, wait: bool = True) -> tuple[int, list]:
        """Put the weights in the object store once and hand their box (a list holding the
        ref) to ``ps`` (this actor's own when None); returns (version, box), so a caller
        can pass the box on to the samplers itself."""
        version, weights = self.learner.weights()
        box = [ray.put(weights)]
        if ps is None:
            self.ps.publish(version, box)
        elif wait:
            ray.get(ps.publish.remote(version, box))
        else:
            ps.publish.remote(version, box)  # calls from one caller stay in order
        return version, box

    @ray.method(concurrency_group="weights")
    def latest(self, have_version: int = -1):
        """Weights for samplers (``...0p``), answered on a thread of its own, so samplers
        need not wait for a long ``train`` call to end."""
        return self.ps.latest(have_version)

    def state_dict(self) -> dict:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state)

    def close(self) -> None:
        self.learner.close()


class ParameterServerWorker(ParameterServer, Placed):
    """The parameter server's process (``walle/ps``)."""


class MainThreadSamplerWorker(SamplerWorker):
    """A sampler process whose calls run on its main thread, for envs that need it (signal
    handlers, some renderers): no thread answers for it while a call runs, so it is not
    watched for stalls (``run.stall_s=null``)."""

    def progress(self) -> dict:
        return PULSE.progress()

    def stacks(self) -> str:
        return thread_stacks()


RemoteSampler = ray.remote(concurrency_groups={"watch": 1})(SamplerWorker)
RemoteMainThreadSampler = ray.remote(MainThreadSamplerWorker)
RemoteLearner = ray.remote(concurrency_groups={"weights": 1, "watch": 1})(LearnerWorker)
# Defined from their own light modules, so memory and parameter-server processes import
# neither torch nor the environments.
RemoteAsyncMemory = ray.remote(AsyncMemoryWorker)
RemoteParameterServer = ray.remote(ParameterServerWorker)

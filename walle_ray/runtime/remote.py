"""The one place that turns role classes into Ray actors.

Weights are put in the object store once per version and passed by reference; fragments
travel as task results and arguments, read zero-copy from the object store where they land.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import ray
import torch

from walle_ray.actors.param_server import ParameterServer
from walle_ray.actors.restart import RestartingSampler
from walle_ray.runtime.memory_worker import AsyncMemoryWorker, MemoryHost, Placed
from walle_ray.learners import Learner


# A sampler's per-fragment stats that a call's report sums over its fragments.
SUMMED_STATS = ("env_steps", "collect_s", "transitions", "sampler_restarts", "lost_fragments",
                "env_s", "act_s")


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
    (``Algorithm.sampler_spec``) and, for an asynchronous algorithm, its memory."""

    cls: type
    args: tuple
    kwargs: dict = field(default_factory=dict)
    memory: MemoryRef | None = None


class SamplerWorker(Placed):
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
        self.source = _actor(weights_source)
        self.specs = slots
        # Each sampler is built when it first collects: the first ones' fragments reach the
        # memories while the others are still making their envs.
        self.slots: list[RestartingSampler | None] = [None] * len(slots)
        self.memories = [spec.memory.resolve() if spec.memory else None for spec in slots]
        self.version, self.weights = -1, None  # the newest weights this process has
        self.asked = None  # a latest() call in flight
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
            self.version, self.weights = latest[0], ray.get(latest[1][0])

    def _fetch(self) -> None:
        """Blocking: the newest weights from the source, when newer than this process's."""
        self._take(ray.get(self.source.latest.remote(self.version)))

    def _give(self, sampler) -> None:
        if sampler.version < self.version:
            sampler.set_weights(self.weights, self.version)

    def _ask(self) -> None:
        self.asked = self.source.latest.remote(self.version)

    def _refresh(self, sampler) -> None:
        """Newer weights before a fragment, from the request sent ``ask_lead`` steps before
        the last fragment ended, so the round trip overlaps collection. The lead adapts:
        twice as many steps after an answer that came late, one fewer after one in time.
        With no weights yet (the first fragment) it pulls, blocking."""
        t0 = time.perf_counter()
        asked, self.asked = self.asked, None
        if asked is not None:
            latest = ray.get(asked)
            if time.perf_counter() - t0 > 5e-4:  # it had to wait for the answer: ask earlier
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

    @ray.method(num_returns=2)
    def collect(self, version: int | None = None, weights: list | None = None):
        """A fragment of every sampler of this process, then their stats: ``(fragment_0,
        ..., fragment_k-1, [stats_0, ..., stats_k-1])``, as separate objects, so each
        fragment can be routed by reference (a process of k samplers is called with
        ``.options(num_returns=k + 1)``)."""
        fragments, stats = [], []
        for s in range(len(self.specs)):
            self.weights_wait_s = 0.0
            fragment, report = self._slot(s).collect(
                lambda sampler: self._pull(sampler, version, weights))
            report["weights_wait_s"] = self.weights_wait_s
            fragments.append(fragment)
            stats.append(report)
        return (*fragments, stats)

    def run(self, num_fragments: int) -> list[dict]:
        """``num_fragments`` fragments of each sampler into its memory, in turn; one put in
        flight per sampler, so collection overlaps it and a full memory holds only its own
        samplers' next put. Returns one report per sampler.

        Each fragment starts from the newest weights published until shortly before it
        (``_refresh``): asking for them a few steps ahead hides the round trip without the
        fragment of policy lag a request left in flight for a whole fragment would add (which
        cost IMPALA on CartPole more env steps to learn)."""
        totals = [{"env_steps": 0, "episode_returns": [], "episode_lengths": [],
                   "collect_s": 0.0, "put_wait_s": 0.0, "fragments": 0, "weights_wait_s": 0.0}
                  for _ in self.specs]
        self.asked = None  # an answer from before this call is stale
        pending: list = [None] * len(self.specs)
        for _ in range(num_fragments):
            for s in range(len(self.specs)):
                slot = self._slot(s)
                totals[s]["sampler"] = slot.sampler.index
                self.weights_wait_s = 0.0
                ask_at = slot.sampler.fragment_length - self.ask_lead
                rollout, stats = slot.collect(self._refresh, ask_at=ask_at, ask=self._ask)
                total = totals[s]
                total["weights_wait_s"] += self.weights_wait_s
                if pending[s] is not None:
                    total["put_wait_s"] += ray.get(pending[s])
                memory = self.memories[s]
                pending[s] = memory.actor.put.remote(rollout, memory.key)
                _add_stats(total, stats)
        for s, ref in enumerate(pending):
            if ref is not None:
                totals[s]["put_wait_s"] += ray.get(ref)
        return totals


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


class LearnerWorker(Placed):
    """A learner process, for one or more learner shards (``topology.pack``): it reads
    fragments from the memories of its shards and publishes weights by reference. With
    several shards each update takes a batch from each and learns from them together: the
    mean gradient over their rows, which the all-reduce of one process per shard computes.

    It also serves as the parameter server when the topology has none (``...0p``).
    """

    def __init__(self, *learner_args, **learner_kwargs):
        self.learner = Learner(*learner_args, **learner_kwargs)
        self.ps = ParameterServer()
        self.shards: list[list[MemoryRef]] = []
        self.publish_to = None
        self.publishes = False
        self.inflight: list[list] = []  # per shard: (memory, ref of a sample call), oldest first
        self.held: list = []  # per shard: (memory, batch) kept while another shard had none
        self.first_update_at = 0.0  # wall-clock time of this process's first update

    def attach(self, shards: list[list[MemoryRef]], publish_to=None, publishes: bool = False,
               prefetch: int = 2, publish_every: int = 1) -> None:
        """Asynchronous mode: the memories each shard of this process reads, and whether it
        publishes weights (learner 0 does, every ``publish_every`` updates) to
        ``publish_to`` (the parameter server, or itself when None)."""
        self.shards, self.publish_to, self.publishes = shards, publish_to, publishes
        self.inflight = [[] for _ in shards]
        self.held = [None] * len(shards)
        self.prefetch = prefetch
        self.publish_every = publish_every

    def _next_batch(self, shard: int, timeout_s: float = 2.0) -> tuple:
        """A shard's memory and the batch it served: the first of the requests in flight to be
        ready (each memory keeps ``prefetch``), so one memory that has nothing to serve yet
        (a shard below ``learning_starts`` or ahead of its replay ratio) holds up none of the
        others. The batch is None when no memory served one within ``timeout_s``."""
        if self.held[shard] is not None:
            served, self.held[shard] = self.held[shard], None
            return served
        inflight = self.inflight[shard]
        if not inflight:
            inflight += [(m, m.actor.sample.remote(m.key)) for _ in range(self.prefetch)
                         for m in self.shards[shard]]
        deadline = time.perf_counter() + timeout_s
        while True:
            refs = [ref for _, ref in inflight]
            ready, _ = ray.wait(refs, num_returns=1, timeout=max(0.0, deadline - time.perf_counter()))
            if not ready:
                return None, None
            memory, ref = inflight.pop(refs.index(ready[0]))
            inflight.append((memory, memory.actor.sample.remote(memory.key)))  # keep its prefetch
            batch = ray.get(ref)
            if batch is not None or time.perf_counter() >= deadline:
                return memory, batch

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
            served = [self._next_batch(s) for s in range(len(self.shards))]
            wait_s += time.perf_counter() - t0
            have = all(batch is not None for _, batch in served)
            everyone = self.learner.collective.all_reduce_min(torch.tensor([float(have)]))
            if not everyone.item():
                for s, pair in enumerate(served):
                    if pair[1] is not None:
                        self.held[s] = pair  # keep it for the next call
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

    def learn(self, memories: list[MemoryRef], env_steps: int, publishes: bool = False,
              publish_to=None) -> tuple:
        """A synchronous update on every fragment its shards' memories hold. Returns its
        metrics and, when it ``publishes``, the new weights' (version, box) as ``publish``
        does (else None), so the update and the publish cost the caller one round trip."""
        taken = ray.get([m.actor.take.remote(m.key) for m in memories])
        refs = [box[0] for items in taken for box in items]
        metrics = self.learner.update(ray.get(refs), env_steps)
        return metrics, (self.publish(publish_to, wait=False) if publishes else None)

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


RemoteSampler = ray.remote(SamplerWorker)
RemoteLearner = ray.remote(concurrency_groups={"weights": 1})(LearnerWorker)
# Defined from their own light modules, so memory and parameter-server processes import
# neither torch nor the environments.
RemoteAsyncMemory = ray.remote(AsyncMemoryWorker)
RemoteMemoryHost = ray.remote(MemoryHost)
RemoteParameterServer = ray.remote(ParameterServerWorker)

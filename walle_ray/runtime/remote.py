"""The one place that turns role classes into Ray actors.

Weights are put in the object store once per version and passed by reference; fragments
travel as task results and arguments, read zero-copy from the object store where they land.
"""

from __future__ import annotations

import os
import socket
import time

import ray
import torch

from walle_ray.actors.param_server import ParameterServer
from walle_ray.actors.restart import RestartingSampler
from walle_ray.actors.sampler import Sampler
from walle_ray.runtime.memory_worker import AsyncMemoryWorker
from walle_ray.learners import Learner


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


class SamplerWorker:
    """A Sampler that pulls newer weights from the parameter server before each fragment.

    Synchronous algorithms call ``collect`` and route the fragment themselves; asynchronous
    ones call ``run``, which pushes fragments into ``memory`` and waits while it is full.
    """

    def __init__(self, weights_source, *sampler_args, memory=None, sampler_cls: type = Sampler,
                 pin: int | None = None, **sampler_kwargs):
        """``weights_source`` and ``memory`` are actor handles or names of actors. With
        ``pin``, the sampler and its env threads run on one CPU (``pin_to_cpu``), chosen
        before the env starts its threads so that they inherit it."""
        self.cpu = pin_to_cpu(pin)
        self.source = _actor(weights_source)
        self.memory = _actor(memory)
        self.slot = RestartingSampler(sampler_cls, sampler_args, sampler_kwargs)
        self.asked = None  # (a latest() call in flight, the version it was asked with)
        length = self.slot.sampler.fragment_length
        self.ask_lead = max(1, -(-length // 8))  # steps before a fragment ends to ask at

    def _pull(self, sampler, version: int | None = None, weights: list | None = None) -> None:
        """Newer weights, blocking: ``weights`` (a box holding their ref) when the caller
        sent them with their ``version``; else asked of the source, which with a known
        ``version`` is asked only when that is newer than the sampler's."""
        if version is not None and version <= sampler.version:
            return
        if weights is not None:
            sampler.set_weights(ray.get(weights[0]), version)
            return
        self._apply(sampler, ray.get(self.source.latest.remote(sampler.version)))

    @staticmethod
    def _apply(sampler, latest) -> None:
        if latest is not None and latest[0] > sampler.version:
            version, box = latest
            sampler.set_weights(ray.get(box[0]), version)

    def _ask(self) -> None:
        version = self.slot.sampler.version
        self.asked = (self.source.latest.remote(version), version)

    def _refresh(self, sampler) -> None:
        """Newer weights before a fragment, from the request sent ``ask_lead`` steps before
        the last one ended, so the round trip overlaps collection. The answer holds what was
        published until then. The lead adapts: twice as many steps after an answer that came
        late, one fewer after one in time. With no request out (the first fragment, a
        rebuilt sampler) it pulls, blocking."""
        asked, self.asked = self.asked, None
        if asked is None or asked[1] != sampler.version:
            self._pull(sampler)
            return
        t0 = time.perf_counter()
        latest = ray.get(asked[0])
        if time.perf_counter() - t0 > 5e-4:  # it had to wait for the answer: ask earlier
            self.ask_lead = min(2 * self.ask_lead, sampler.fragment_length)
        else:  # in time: ask a step later next time, for fresher weights
            self.ask_lead = max(1, self.ask_lead - 1)
        self._apply(sampler, latest)

    def ready(self) -> bool:
        """Answers once the actor is up (again, after a restart)."""
        return True

    @ray.method(num_returns=2)
    def collect(self, version: int | None = None, weights: list | None = None):
        """One fragment with weights at least as new as ``version`` (the newest if None);
        ``weights`` is the box holding that version's ref, when the caller has it."""
        return self.slot.collect(lambda sampler: self._pull(sampler, version, weights))

    def run(self, num_fragments: int) -> dict:
        """Collect fragments into the memory, one put in flight so collection overlaps it.

        Each fragment starts from the newest weights published until shortly before it
        (``_refresh``): asking for them a few steps ahead hides the round trip without the
        fragment of policy lag a request left in flight for a whole fragment would add (which
        cost IMPALA on CartPole more env steps to learn)."""
        total = {"sampler": self.slot.sampler.index, "env_steps": 0, "episode_returns": [],
                 "episode_lengths": [], "collect_s": 0.0, "put_wait_s": 0.0, "fragments": 0}
        self.asked = None  # an answer from before this call is stale: the first fragment pulls
        pending = None
        for _ in range(num_fragments):
            ask_at = self.slot.sampler.fragment_length - self.ask_lead
            rollout, stats = self.slot.collect(self._refresh, ask_at=ask_at, ask=self._ask)
            if pending is not None:
                total["put_wait_s"] += ray.get(pending)
            pending = self.memory.put.remote(rollout)
            for key, value in stats.items():
                if key in ("env_steps", "collect_s", "transitions", "sampler_restarts",
                           "lost_fragments"):
                    total[key] = total.get(key, 0) + value
                elif key.startswith("explore/"):
                    total[key] = value  # the newest exploration setting
            total["episode_returns"] += stats["episode_returns"]
            total["episode_lengths"] += stats["episode_lengths"]
            total["fragments"] += 1
            total["policy_version"] = stats["policy_version"]
        total["put_wait_s"] += ray.get(pending)
        return total


class LearnerWorker:
    """A Learner that reads fragments from its memories and publishes weights by reference.

    It also serves as the parameter server when the topology has none (``...0p``).
    """

    def __init__(self, *learner_args, **learner_kwargs):
        self.learner = Learner(*learner_args, **learner_kwargs)
        self.ps = ParameterServer()
        self.memories: list = []
        self.publish_to = None
        self.publishes = False
        self.inflight: list = []  # (memory, ref of a sample call), oldest first
        self.held = None  # (memory, batch) this learner got while another learner got none

    def attach(self, memories: list, publish_to=None, publishes: bool = False, prefetch: int = 2,
               publish_every: int = 1) -> None:
        """Asynchronous mode: the memories this learner reads, and whether it publishes weights
        (learner 0 does, every ``publish_every`` updates) to ``publish_to`` (the parameter
        server, or itself when None)."""
        self.memories, self.publish_to, self.publishes = memories, publish_to, publishes
        self.prefetch = prefetch
        self.publish_every = publish_every

    def _next_batch(self, timeout_s: float = 2.0) -> tuple:
        """The memory and the batch it served: the first of the requests in flight to be
        ready (each memory keeps ``prefetch``), so one memory that has nothing to serve yet
        (a shard below ``learning_starts`` or ahead of its replay ratio) holds up none of the
        others. The batch is None when no memory served one within ``timeout_s``."""
        if self.held is not None:
            served, self.held = self.held, None
            return served
        if not self.inflight:
            self.inflight = [(m, m.sample.remote()) for _ in range(self.prefetch) for m in self.memories]
        deadline = time.perf_counter() + timeout_s
        while True:
            refs = [ref for _, ref in self.inflight]
            ready, _ = ray.wait(refs, num_returns=1, timeout=max(0.0, deadline - time.perf_counter()))
            if not ready:
                return None, None
            i = refs.index(ready[0])
            memory, ref = self.inflight.pop(i)
            self.inflight.append((memory, memory.sample.remote()))  # keep its prefetch
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
        t_start = time.perf_counter()
        for _ in range(num_updates):
            t0 = time.perf_counter()
            memory, batch = self._next_batch()
            wait_s += time.perf_counter() - t0
            everyone = self.learner.collective.all_reduce_min(torch.tensor([float(batch is not None)]))
            if not everyone.item():
                if batch is not None:
                    self.held = (memory, batch)  # keep it for the next call
                break
            metrics = self.learner.update([batch], env_steps)
            feedback = self.learner.memory_feedback()
            if feedback is not None:  # back to the memory that served the batch
                memory.feedback.remote(feedback)
            done += 1
            rows += batch.num_steps
            lag_max = max(lag_max, metrics.pop("policy_lag_max"))
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
            if self.publishes and self.learner.version % self.publish_every == 0:
                self.publish(self.publish_to, wait=False)
        out = {k: v / done for k, v in sums.items()} if done else {}
        out.update(version=self.learner.version, policy_lag_max=lag_max, updates=done,
                   env_steps_consumed=rows, batch_wait_s=wait_s,
                   train_s=time.perf_counter() - t_start)
        return out

    def group_address(self) -> tuple[str, int]:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def join_group(self, address: str, port: int, rank: int, world_size: int) -> None:
        self.learner.join_group(address, port, rank, world_size)

    def learn(self, memories: list, env_steps: int) -> dict:
        taken = ray.get([m.take.remote() for m in memories])
        refs = [box[0] for items in taken for box in items]
        return self.learner.update(ray.get(refs), env_steps)

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


RemoteSampler = ray.remote(SamplerWorker)
RemoteLearner = ray.remote(concurrency_groups={"weights": 1})(LearnerWorker)
# Defined from their own light modules, so memory and parameter-server processes import
# neither torch nor the environments.
RemoteAsyncMemory = ray.remote(AsyncMemoryWorker)
RemoteParameterServer = ray.remote(ParameterServer)

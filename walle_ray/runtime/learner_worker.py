"""A learner process's body (``LearnerWorker``): one or more learner shards, the batches
they ask the memories for, and the weights they publish. ``runtime/remote.py`` makes it a
Ray actor.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import ray
import torch

from walle_ray.actors.param_server import ParameterServer
from walle_ray.pulse import PULSE, working
from walle_ray.runtime.process import prepare_process
from walle_ray.runtime.role_process import MemoryRef, Placed, Watched
from walle_ray.runtime.threads import ThreadChoice


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
        self.threads = ThreadChoice(torch.get_num_threads(), choose=choose_threads)
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
        self.stopping = False  # the run's loop is over: wait for no more batches

    def attach(self, shards: list[list[MemoryRef]], publish_to=None, publishes: bool = False,
               prefetch: int = 2, publish_every: int = 1) -> None:
        """Asynchronous mode: the memories each shard of this process reads, and whether it
        publishes weights (learner 0 does, every ``publish_every`` updates) to
        ``publish_to`` (the parameter server, or itself when None)."""
        self.shards, self.publish_to, self.publishes = shards, publish_to, publishes
        self.sources = batch_sources(shards)
        self.inflight = []
        self.stopping = False
        self.held = [deque() for _ in shards]
        self.prefetch = prefetch
        self.publish_every = publish_every

    def _next_batches(self, timeout_s: float = 2.0) -> list:
        """A (memory, batch) pair for each shard, from the requests in flight (each source
        keeps ``prefetch``; ``batch_sources``), or None for a shard that none served within
        ``timeout_s`` (or at all, once ``stop_waiting`` was called). Batches served beyond
        what this update needs wait for the next."""
        served = [held.popleft() if held else None for held in self.held]
        for source in self.sources if not self.stopping else []:
            # keep ``prefetch`` requests in flight to each source; none once the loop is over
            # (a queue hands out what it serves, and a snapshotted memory should keep it)
            asked = sum(src is source for src, _ in self.inflight)
            self.inflight += [(source, source.ask())
                              for _ in range(self.prefetch - asked) if self._wants(source)]
        deadline = time.perf_counter() + timeout_s
        while any(pair is None for pair in served) and not self.stopping:
            refs = [ref for _, ref in self.inflight]
            if not refs:  # every source's shards hold batches enough: a shard starves
                time.sleep(min(timeout_s, 0.05))
                break
            # in slices, so that ``stop_waiting`` is seen within one
            ready, _ = ray.wait(refs, num_returns=1,
                                timeout=max(0.0, min(0.1, deadline - time.perf_counter())))
            if not ready:
                if time.perf_counter() >= deadline:
                    break
                continue
            source, ref = self.inflight.pop(refs.index(ready[0]))
            if self._wants(source) and not self.stopping:
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
        metrics = self.threads.update(self.learner, fragments, env_steps)
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

    @ray.method(concurrency_group="watch")
    def stop_waiting(self) -> None:
        """The run's loop is over (``Run._close``): a ``train`` call that waits for batches
        the stopped samplers will not send ends now, rather than after its timeout, so the
        final checkpoint's ``state_dict`` is answered at once."""
        self.stopping = True

    def state_dict(self) -> dict:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state)

    def rewind(self) -> None:
        self.learner.rewind()

    def close(self) -> None:
        self.learner.close()

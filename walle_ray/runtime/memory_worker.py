"""The memory and parameter-server processes' bodies, in a module that imports neither
torch nor envs.

A memory process holds one or more logical memories (``topology.pack``), each under its
topology index; every call names the one it is for.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from walle_ray.actors.param_server import ParameterServer
from walle_ray.runtime.process import prepare_process
from walle_ray.runtime.role_process import Placed

if TYPE_CHECKING:
    from walle_ray.contracts import Memory

Specs = dict  # logical index -> (memory class, args, kwargs)


class AsyncMemoryWorker(Placed):
    """Memories (``MixedMemory``, ``PrioritizedReplay`` shards) behind asyncio: ``put`` waits
    for room, ``sample`` waits for a batch.

    Waiting here is the back-pressure: a full queue (or a replay shard ahead of its replay
    ratio) holds its samplers, an empty one its learners. Each memory waits on its own
    condition, so a full memory never holds another's samplers.

    A memory that ranks its rows with the current policy (``wants_weights``: elite and
    attentive replay) gets the newest weights from ``weights_source`` (the parameter
    server, or the learner that serves weights; a handle or its name) and ranks the next
    batch on a thread as soon as it has served one, so the ranking runs while the learner
    computes and the event loop keeps taking fragments.
    """

    def __init__(self, specs: Specs, weights_source=None):
        prepare_process()
        self.memories: dict[int, Memory] = {k: cls(*args, **kwargs)
                                            for k, (cls, args, kwargs) in specs.items()}
        self.changed: dict[int, asyncio.Condition] = {}
        self.source = weights_source
        self.ahead: dict[int, asyncio.Task] = {}  # per ranking memory: the next batch's ranking

    def _condition(self, key: int) -> asyncio.Condition:
        if key not in self.changed:  # made inside the actor's event loop
            self.changed[key] = asyncio.Condition()
        return self.changed[key]

    async def _pull_weights(self, key: int) -> None:
        """The newest weights for a memory that ranks rows, when newer than its own."""
        memory = self.memories[key]
        if isinstance(self.source, str):
            import ray

            self.source = ray.get_actor(self.source)
        latest = await self.source.latest.remote(memory.weights_version)
        if latest is not None:
            weights = await latest[1][0]
            await asyncio.to_thread(memory.set_weights, weights, latest[0])

    async def _rank_ahead(self, key: int) -> None:
        """The newest weights, then the next batch's rows ranked on a thread (``prepare``)."""
        await self._pull_weights(key)
        await asyncio.to_thread(self.memories[key].prepare)

    async def put(self, item, key: int) -> float:
        """Store a fragment once there is room; returns the seconds spent waiting."""
        t0 = time.perf_counter()
        memory, cond = self.memories[key], self._condition(key)
        async with cond:
            await cond.wait_for(lambda: memory.has_room(item))
            memory.put(item)
            cond.notify_all()
        return time.perf_counter() - t0

    async def sample(self, key: int, timeout_s: float = 2.0):
        """A batch, or None when none could be composed within ``timeout_s``. A memory that
        ranks rows composes it on a thread (its buffers lock themselves against the ranking
        ahead), then starts ranking the next one."""
        memory = self.memories[key]
        ranks = getattr(memory, "wants_weights", False)
        if ranks and memory.weights_version < 0:
            await self._pull_weights(key)
        cond = self._condition(key)
        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(memory.can_sample), timeout_s)
            except asyncio.TimeoutError:
                return None
            batch = await asyncio.to_thread(memory.sample) if ranks else memory.sample()
            cond.notify_all()
        if ranks and (key not in self.ahead or self.ahead[key].done()):
            self.ahead[key] = asyncio.create_task(self._rank_ahead(key))
        return batch

    async def put_many(self, items: list[tuple[Any, int]]) -> float:
        """``put`` of each (item, key), in one call from a process that writes to several of
        this process's memories; returns the longest wait."""
        waits = await asyncio.gather(*(self.put(item, key) for item, key in items))
        return max(waits, default=0.0)

    async def sample_many(self, keys: list[int], timeout_s: float = 2.0) -> list:
        """``sample`` of each memory in ``keys`` at once (a learner process reading several
        of this process's memories asks in one call): a batch or None for each."""
        return list(await asyncio.gather(*(self.sample(k, timeout_s) for k in keys)))

    async def feedback(self, item, key: int) -> int:
        """What an update sends back about the batch this memory served (``Memory.feedback``)."""
        async with self._condition(key):  # not while a snapshot copies the memory
            return self.memories[key].feedback(item)

    async def stats(self) -> dict[int, dict]:
        return {k: m.stats() for k, m in self.memories.items()}

    async def state_dict(self) -> dict[int, dict]:
        """Each memory's snapshot (``memory.checkpoint=true``), copied on a thread while its
        condition is held: nothing is put into it or served from it meanwhile, and the event
        loop goes on answering, the stall watch's progress question included, however long
        a large replay takes to copy."""
        states = {}
        for k, memory in self.memories.items():
            async with self._condition(k):
                states[k] = await asyncio.to_thread(memory.state_dict)
        return states

    async def load_state_dict(self, states: dict[int, Any]) -> None:
        for k, state in states.items():
            cond = self._condition(k)
            async with cond:
                await asyncio.to_thread(self.memories[k].load_state_dict, state)
                cond.notify_all()


class ParameterServerWorker(ParameterServer, Placed):
    """The parameter server's process (``walle/ps``)."""

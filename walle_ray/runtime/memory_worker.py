"""The asynchronous memory actor's body, in a module that imports neither torch nor envs."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from walle_ray.contracts import Memory


class AsyncMemoryWorker:
    """A memory (``MixedMemory`` or a ``PrioritizedReplay`` shard) behind asyncio: ``put``
    waits for room, ``sample`` waits for a batch.

    Waiting here is the back-pressure: a full queue (or a replay shard ahead of its replay
    ratio) holds samplers, an empty one learners.
    """

    def __init__(self, memory_cls: type, *memory_args, **memory_kwargs):
        self.memory: Memory = memory_cls(*memory_args, **memory_kwargs)
        self.changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self.changed is None:  # made inside the actor's event loop
            self.changed = asyncio.Condition()
        return self.changed

    async def put(self, item) -> float:
        """Store a fragment once there is room; returns the seconds spent waiting."""
        t0 = time.perf_counter()
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: self.memory.has_room(item))
            self.memory.put(item)
            cond.notify_all()
        return time.perf_counter() - t0

    async def sample(self, timeout_s: float = 2.0):
        """A batch, or None when none could be composed within ``timeout_s``."""
        cond = self._condition()
        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(self.memory.can_sample), timeout_s)
            except asyncio.TimeoutError:
                return None
            batch = self.memory.sample()
            cond.notify_all()
        return batch

    async def feedback(self, item) -> int:
        """What an update sends back about the batch this memory served (``Memory.feedback``)."""
        return self.memory.feedback(item)

    async def stats(self) -> dict:
        return self.memory.stats()

    async def state_dict(self) -> dict:
        return self.memory.state_dict()

    async def load_state_dict(self, state: dict) -> None:
        cond = self._condition()
        async with cond:
            self.memory.load_state_dict(state)
            cond.notify_all()

"""What the role processes share (``runtime/sampler_worker.py``, ``learner_worker.py``,
``memory_worker.py``): the answers every one gives (``Placed``), the thread that answers
while a process works (``Watched``), and how a logical memory is named (``MemoryRef``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import ray

from walle_ray.pulse import PULSE, thread_stacks


def actor_handle(handle_or_name):
    """An actor handle, looked up in this job's namespace when given by name."""
    return ray.get_actor(handle_or_name) if isinstance(handle_or_name, str) else handle_or_name


class Placed:
    """What every role process answers: the id of the Ray node it runs on
    (``RayFleet.placement``), and what it has cost (``usage``)."""

    def where(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def progress(self) -> dict:
        """How long this process's own work has gone without progress (``walle_ray/pulse.py``);
        a process busy in one call answers only once it ends, which is how a stuck memory or
        parameter server shows (``runtime/stalls.py``)."""
        return PULSE.progress()

    def stacks(self) -> str:
        return thread_stacks()

    def usage(self) -> dict:
        return process_usage()


def process_usage() -> dict:
    """This process's cost so far (``runtime/milestones.py``): ``cpu_s``, the CPU time of all
    its threads (env threads included); ``gpu_s``, the GPUs Ray gave it times its lifetime.
    ``process`` names it across restarts (node and pid), so a process that died keeps the
    cost it reported last."""
    import psutil

    context = ray.get_runtime_context()
    gpus = float(context.get_assigned_resources().get("GPU", 0.0))
    alive_s = time.time() - psutil.Process().create_time()
    return {"process": f"{context.get_node_id()[:12]}:{os.getpid()}",
            "cpu_s": time.process_time(), "gpu_s": gpus * alive_s}


class Watched:
    """What a process that runs its own work (samplers, learners) answers on a thread of its
    own, even while a call is under way or stuck (``runtime/stalls.py``); its cost too, so
    that the run's cost is read without waiting for a sampler's fragment or a learner's
    update to end."""

    @ray.method(concurrency_group="watch")
    def progress(self) -> dict:
        return PULSE.progress()

    @ray.method(concurrency_group="watch")
    def stacks(self) -> str:
        return thread_stacks()

    @ray.method(concurrency_group="watch")
    def usage(self) -> dict:
        return process_usage()


@dataclass(frozen=True)
class MemoryRef:
    """Logical memory ``key`` in a memory process: ``actor`` is its handle, or its name where
    a sampler looks it up (a handle among a sampler's arguments would tie Ray's restart of
    the sampler to that handle's lifetime, ray-project/ray#53727)."""

    actor: Any
    key: int

    def resolve(self) -> "MemoryRef":
        return MemoryRef(actor_handle(self.actor), self.key)

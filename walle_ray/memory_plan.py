"""Whether a run's plan fits the memory it will run in, checked before any role starts.

The estimate is the role processes the packing plan starts, times what one such process
holds with torch and Ray imported (``ROLE_PROCESS_BYTES``), plus what the run's memories
hold once full: each algorithm says so, by the setting that sizes it (``MemoryNeed``, from
``Algorithm.memory_needs``; the replay shards' ``algo.capacity``, IMPALA's
``algo.replay[i].capacity``, ES's noise table ``algo.noise_size``). A plan whose estimate
exceeds the memory available is refused with one line naming whichever of ``topology`` and
the memories' setting holds more, and what would fit. The estimate leaves out what roles
allocate as they work (a learner's batches and activations), so a plan that only just fits
may still run short.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from walle_ray.config import ConfigError

GIB = 2 ** 30
MIB = 2 ** 20

# The proportional set size of one role process with torch and Ray imported and its roles
# built, before they hold data: measured in docs/performance.md ("What a run holds in
# memory"), where the command that measures it is given.
ROLE_PROCESS_BYTES = 200 * MIB


@dataclass(frozen=True)
class MemoryNeed:
    """What a run's memories hold once full, all of them together, and the setting that
    sizes it (the whole run's, split evenly across ``memories`` memories)."""

    key: str  # the setting, as a user writes it: "algo.capacity"
    value: int  # its value
    held: Callable[[int], float]  # bytes the memories hold at a value of the setting
    memories: int = 1

    @property
    def bytes(self) -> float:
        return self.held(self.value)

    @property
    def per_memory(self) -> float:
        """What one memory holds (it lives in one process, on one node)."""
        return self.bytes / self.memories

    def largest(self, room: float) -> int:
        """The largest value of the setting, below ``value``, at which the memories hold at
        most ``room`` bytes (0 if none does)."""
        low, high = 0, self.value  # held(low) fits (or low is 0); held(high) does not
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if self.held(mid) <= room else (low, mid)
        return low


@dataclass(frozen=True)
class MemoryEstimate:
    """A plan's memory: ``processes`` role processes and what its memories hold."""

    processes: int
    needs: tuple[MemoryNeed, ...] = ()
    process_bytes: float = ROLE_PROCESS_BYTES

    @property
    def role_bytes(self) -> float:
        return self.processes * self.process_bytes

    @property
    def memory_bytes(self) -> float:
        return sum(need.bytes for need in self.needs)

    @property
    def total(self) -> float:
        return self.role_bytes + self.memory_bytes

    def describe(self) -> str:
        """'about 3.3 GiB: 5 role processes 1.0 GiB, memories 2.3 GiB'."""
        return (f"about {gib(self.total)}: {self.processes} role processes "
                f"{gib(self.role_bytes)}, memories {gib(self.memory_bytes)}")


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def check_memory(estimate: MemoryEstimate, available: float, where: str, topology: str,
                 fewer: str) -> None:
    """Raise ConfigError when the plan's ``estimate`` exceeds the ``available`` bytes of
    ``where`` ("this machine", "the cluster's 3 nodes"), naming what holds more: the
    largest memory need's setting, with the largest value of it that fits, or ``topology``
    (its role processes; ``fewer`` says how to start fewer, e.g. "use topology.pack=auto
    (5 role processes on 2 CPUs)")."""
    if estimate.total <= available:
        return
    short = f"more than the {gib(available)} available on {where}"
    need = max(estimate.needs, key=lambda n: n.bytes, default=None)
    if need is not None and need.bytes >= estimate.role_bytes:
        fit = need.largest(available - estimate.total + need.bytes)
        beside = (f", with the {estimate.processes} role processes about {gib(estimate.total)}"
                  if estimate.processes else "")
        raise ConfigError(
            f"{need.key}={need.value}: the memories would hold about {gib(need.bytes)}{beside}, "
            f"{short}; " + (f"{need.key}={fit} fits" if fit else
                            f"nothing fits beside the role processes: {fewer}"))
    per = estimate.process_bytes
    most = max(0, math.floor((available - estimate.memory_bytes) / per))
    memories = (f" (with the memories, {gib(estimate.total)})" if estimate.memory_bytes >= GIB / 10
                else "")
    raise ConfigError(
        f"topology={topology}: {estimate.processes} role processes of about {per / MIB:.0f} MiB "
        f"each would hold about {gib(estimate.role_bytes)}{memories}, {short}; at most "
        f"{most} role processes fit: {fewer}")


def check_memory_nodes(needs: tuple[MemoryNeed, ...], nodes: list[float], per_process: int = 1,
                       process_bytes: float = ROLE_PROCESS_BYTES) -> None:
    """Raise ConfigError when one memory process, holding ``per_process`` logical memories,
    would hold more than the largest of the ``nodes`` (their memory in bytes) that may run
    it: a memory lives in one process on one node."""
    largest = max(nodes, default=0.0)
    for need in needs:
        held = need.per_memory * per_process
        if held and held + process_bytes > largest:
            room = (largest - process_bytes) * need.memories / per_process
            fit = need.largest(room)
            raise ConfigError(
                f"{need.key}={need.value}: one memory process would hold about "
                f"{gib(held + process_bytes)}, more than the {gib(largest)} of the largest "
                "node that may run it; "
                + (f"{need.key}={fit} fits, or give the topology more memories"
                   if fit else "give the topology more memories"))

"""What a role process sets up before it builds its roles (``prepare_process``): how it
hands memory back to the OS, and how many threads torch computes with.

By default glibc's malloc serves each large block (a batch of frames, a conv layer's
activations) with a fresh ``mmap``, or from the top of the heap, and returns it to the OS
when freed, so every update faults the same pages in again, in the kernel. Keeping freed
memory in the process lets the next update reuse it. docs/performance.md ("Freed memory")
has the measurements.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts; larger blocks are still mapped afresh
TRIM_THRESHOLD = 1 << 30  # free memory at the top of the heap kept rather than given back
TOP_PAD = 256 << 20  # extra grown with each extension of the heap


@functools.cache
def keep_freed_memory() -> bool:
    """Make this process's malloc keep and reuse freed blocks of up to ``MMAP_THRESHOLD``
    (and their pages) instead of unmapping them. Once per process; True where it applied,
    False where the C library is not glibc (macOS, musl), which is left as it is."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (_M_TOP_PAD, TOP_PAD)))


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity; the machine's where the OS has none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def prepare_process(torch_threads: int | None = None) -> None:
    """What every role process (``runtime/remote.py``'s actors, and ``LocalFleet`` for the
    driver) does first: keep freed memory for reuse and, in a process that computes with
    torch, run ``torch_threads`` intra-op threads, at most the CPUs it may use. A sampler
    process runs one: many share few cores, and more threads only contend."""
    keep_freed_memory()
    if torch_threads is not None:
        import torch

        torch.set_num_threads(max(1, min(torch_threads, usable_cpus())))

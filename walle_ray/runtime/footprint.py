"""What a run costs the machine: how long until its first learner update, how many
processes it runs and how much memory they hold."""

from __future__ import annotations

import time

import psutil

GIB = 2 ** 30


START = psutil.Process().create_time()  # when this process (the command) started


def since_start() -> float:
    """Seconds since this process (the command) started."""
    return time.time() - START


def _pss(process: psutil.Process) -> int:
    """Resident bytes with shared pages split among the processes sharing them (PSS), so
    that a sum over processes counts the object store's shared memory once."""
    try:
        info = process.memory_full_info()
        return int(getattr(info, "pss", info.rss))
    except (psutil.Error, OSError):
        return 0


def local_tree() -> list[psutil.Process]:
    """This process and every process it started (with a local Ray instance: the raylet,
    the GCS, the dashboard and every worker)."""
    me = psutil.Process()
    try:
        return [me, *me.children(recursive=True)]
    except psutil.Error:
        return [me]


def resident_bytes(processes: list[psutil.Process]) -> int:
    return sum(_pss(p) for p in processes)


class Footprint:
    """A periodic hook: every record gets the fleet's role processes (``processes``) and the
    memory all the run's processes on this machine hold (``resident_gib``: the driver and
    what it started, Ray's own processes included; measured at most every ``every_s``); the
    record in which the first learner update arrives gets ``first_update_s``, seconds since
    the command started, and a line says so."""

    def __init__(self, fleet, counters: dict, every_s: float = 10.0):
        self.fleet, self.counters, self.every_s = fleet, counters, every_s
        self.measured_at = -float("inf")
        self.resident_gib = 0.0
        self.first_seen = counters.get("updates", 0) > 0  # a resumed run has had its first

    def __call__(self, record: dict) -> dict:
        fleet = self.fleet()
        out = {"processes": fleet.processes()}
        now = time.monotonic()
        first = not self.first_seen and self.counters.get("updates", 0) > 0
        if first or now - self.measured_at >= self.every_s:
            self.resident_gib = resident_bytes(local_tree()) / GIB
            self.measured_at = now
        out["resident_gib"] = self.resident_gib
        if first:
            self.first_seen = True
            # A learner process reports the time of its first update with the call that made
            # it, which may end long after; in one process the driver sees it at once.
            at = self.counters.get("first_update_at")
            out["first_update_s"] = at - START if at else since_start()
            print(f"walle_ray: first learner update {out['first_update_s']:.1f} s after the "
                  f"command started; {out['processes']} role processes, "
                  f"{self.resident_gib:.2f} GiB resident", flush=True)
        return out

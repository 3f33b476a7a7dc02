"""Stalled roles (docs/faults.md, "Stalled roles").

The driver asks each role process, every few seconds, how long its own work has gone
without progress (``walle_ray/pulse.py``). A process over its limit (``run.stall_s``;
``run.stall_start_s`` until its first call of own work has ended), or one that has not
answered for as long, is stalled: it is named on the console, its threads' stacks are
written to ``<run dir>/stalls/<role>-<time>.txt``, and the fleet restarts it as it would a
dead one.

The stacks come from the process itself: samplers and learners answer on a thread of their
own (``role_process.Watched``), which works on every node and needs no permission to trace
another process. A process that cannot answer (native code holding the interpreter lock)
is dumped with ``py-spy`` where it runs on this machine and py-spy is installed.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

STACKS_TIMEOUT_S = 10.0


@dataclass
class Stall:
    name: str  # the role process, as the fleet names it: walle/sampler-3
    seconds: float
    answered: bool  # False: the process did not answer the progress question
    waiting_on: str = ""

    @property
    def role(self) -> str:
        return self.name.removeprefix("walle/")

    def describe(self, limit_key: str) -> str:
        if self.answered:
            return f"its own work made no progress for {self.seconds:.0f} s ({limit_key})"
        return f"it did not answer for {self.seconds:.0f} s ({limit_key})"


class StallWatch:
    """Asks the processes ``roles()`` names (name -> Ray actor handle) for their progress and
    says which are stalled (``check``)."""

    def __init__(self, ray, roles: Callable[[], dict], stall_s: float, start_s: float,
                 out_dir: Path | None):
        self.ray, self.roles = ray, roles
        self.stall_s, self.start_s = stall_s, start_s
        self.out_dir = out_dir
        self.period_s = min(5.0, stall_s / 4)
        self.next_at = 0.0
        self.asked: dict = {}  # ObjectRef of a progress call -> (process name, when asked)
        self.started: dict[str, bool] = {}  # process name -> its first call of own work ended
        self.last: dict[str, dict] = {}  # process name -> its last answer

    def limit(self, name: str) -> tuple[float, str]:
        """The limit for process ``name``, and the key that sets it: ``run.stall_start_s``
        until its last answer said it has started (memories and the parameter server, with
        no own work to time, never do)."""
        if self.started.get(name):
            return self.stall_s, "run.stall_s"
        return self.start_s, "run.stall_start_s"

    def check(self, skip: set[str] = frozenset()) -> list[Stall]:
        """The processes found stalled since the last look (at most every few seconds);
        those in ``skip`` (restarting) are not asked."""
        now = time.monotonic()
        if now < self.next_at:
            return []
        self.next_at = now + self.period_s
        stalls = []
        if self.asked:
            ready, _ = self.ray.wait(list(self.asked), num_returns=len(self.asked), timeout=0)
            for ref in ready:
                name, _ = self.asked.pop(ref)
                try:
                    answer = self.ray.get(ref)
                except self.ray.exceptions.RayError:  # dead or restarting: not a stall
                    continue
                self.last[name] = answer
                self.started[name] = answer["started"]
                if answer["stuck_s"] > self.limit(name)[0]:
                    stalls.append(Stall(name, answer["stuck_s"], True, answer["waiting_on"]))
        in_flight = {name: when for name, when in self.asked.values()}
        for name, handle in self.roles().items():
            if name in skip or any(s.name == name for s in stalls):
                continue
            if name not in in_flight:
                self.asked[handle.progress.remote()] = (name, now)
            elif now - in_flight[name] > self.limit(name)[0]:
                stalls.append(Stall(name, now - in_flight[name], False))
        return stalls

    def forget(self, name: str) -> None:
        """``name`` is being restarted: its next process starts again."""
        self.asked = {ref: v for ref, v in self.asked.items() if v[0] != name}
        self.started.pop(name, None)
        self.last.pop(name, None)

    def report(self, stall: Stall, handle) -> Path | None:
        """Name the stalled process on the console and write its threads' stacks; returns
        the file."""
        stacks, how = self._stacks(stall, handle)
        path = None
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            stem = f"{stall.role}-{time.strftime('%Y%m%d-%H%M%S')}"
            path = self.out_dir / f"{stem}.txt"
            for n in range(2, 1000):
                if not path.exists():
                    break
                path = self.out_dir / f"{stem}-{n}.txt"
            path.write_text(f"{stall.role}: {stall.describe(self.limit(stall.name)[1])}\n"
                            f"stacks taken by {how}, innermost call last\n\n{stacks}\n")
        where = f"; its threads' stacks are in {path}" if path else ""
        print(f"walle_ray: {stall.role} stalled: {stall.describe(self.limit(stall.name)[1])}"
              f"{where}; restarting it", file=sys.stderr, flush=True)
        return path

    def _stacks(self, stall: Stall, handle) -> tuple[str, str]:
        if stall.answered:
            try:
                text = self.ray.get(handle.stacks.remote(), timeout=STACKS_TIMEOUT_S)
                return text, "the process itself (sys._current_frames)"
            except (self.ray.exceptions.GetTimeoutError, self.ray.exceptions.RayError):
                pass
        last = self.last.get(stall.name, {})
        if last.get("host") == socket.gethostname() and shutil.which("py-spy"):
            try:
                done = subprocess.run(["py-spy", "dump", "--pid", str(last["pid"])],
                                      capture_output=True, text=True, timeout=30)
                if done.returncode == 0:
                    return done.stdout, f"py-spy dump --pid {last['pid']}"
                reason = done.stderr.strip().splitlines()[-1:] or ["no output"]
                return f"py-spy could not read the process: {reason[0]}", "py-spy"
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"py-spy failed: {exc}", "py-spy"
        return ("the process did not answer, and py-spy cannot reach it from here (it runs on "
                "another node, or py-spy is not installed)", "nothing")

"""Each role process's pulse: how long its own work has gone without progress, and its
threads' stacks, for the driver to find roles that stall (``runtime/stalls.py``,
docs/faults.md, "Stalled roles").

A process has one ``PULSE``. A role marks the calls that do its own work (``working``), the
waits inside them for another role (``waiting``: a full memory, weights, a peer learner),
and each step of progress (``beat``; a hot loop may set ``at`` itself, and beats once at
its end). Time spent waiting, or idle between calls, is never a stall: the role waited for
is watched itself. Until a call of own work has ended with progress the process is
starting (envs made, the first update compiled), which has a longer limit.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
import time
import traceback
from contextlib import contextmanager


class Pulse:
    def __init__(self) -> None:
        self.at: float | None = None  # perf_counter of the last progress; None: idle or waiting
        self.progressed = False  # a beat since the current call of own work began
        self.started = False  # a call of own work has ended with progress
        self.waiting_on = ""

    def beat(self) -> None:
        self.at = time.perf_counter()
        self.progressed = True

    def begin_again(self) -> None:
        """The process makes its envs or models again: starting, as after its launch."""
        self.started = False

    @contextmanager
    def working(self):
        """A call that does this role's own work."""
        self.at, self.progressed = time.perf_counter(), False
        try:
            yield
        finally:
            self.at = None
            self.started = self.started or self.progressed

    @contextmanager
    def waiting(self, on: str):
        """A wait for another role inside a call: not this role's stall."""
        was, self.at, self.waiting_on = self.at, None, on
        try:
            yield
        finally:
            self.waiting_on = ""
            self.at = None if was is None else time.perf_counter()

    def progress(self) -> dict:
        """``stuck_s``: seconds its own work has gone without progress (0 when idle or
        waiting); ``started``: whether a call of own work has ended with progress (see the
        module's docstring); where it runs (``host``, ``pid``)."""
        at = self.at
        return {"stuck_s": 0.0 if at is None else time.perf_counter() - at,
                "started": self.started, "waiting_on": self.waiting_on,
                "host": socket.gethostname(), "pid": os.getpid()}


PULSE = Pulse()


def working(method):
    """``method`` (of a role process) does the role's own work: ``PULSE.working`` around it."""

    @functools.wraps(method)
    def run(*args, **kwargs):
        with PULSE.working():
            return method(*args, **kwargs)

    return run


def thread_stacks() -> str:
    """Every thread's Python stack in this process, innermost call last, as text."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    parts = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        parts.append(f"Thread {names.get(ident, '?')} ({ident}):\n"
                     + "".join(traceback.format_stack(frame)))
    return "\n".join(parts)

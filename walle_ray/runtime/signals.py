"""Ctrl-C and SIGTERM ask the run to stop cleanly: checkpoint, metrics, then exit."""

from __future__ import annotations

import signal
import sys
import threading


class StopSignals:
    """The first SIGINT/SIGTERM sets ``requested``; a second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.requested: int | None = None
        self.starting = True  # the roles are still starting: the run stops as soon as they are up
        self._previous = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            return self  # only the main thread may take signals (walle_ray.train from a thread)
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = signum
        name = signal.Signals(signum).name
        now = "waiting for the roles to start" if self.starting else "finishing this iteration"
        print(f"\nwalle_ray: {name} received; {now}, then writing a checkpoint "
              "(press Ctrl-C again to stop at once)", file=sys.stderr, flush=True)

    @property
    def exit_code(self) -> int:
        return 128 + self.requested if self.requested is not None else 0

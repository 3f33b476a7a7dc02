"""A synchronous learner's torch threads, chosen by timing its own updates.

In PPO's synchronous loop the samplers wait while the learner updates, so the learner may
take their CPUs as torch threads (``role_setup.learner_threads``). Whether that pays depends
on the work in each gradient step: a wide network's matrix products split well across
threads, while a small MLP's many tiny operations meet at a barrier after each one, and
whichever other process holds a CPU for a moment (Ray's own among them) stalls them all.
On a small machine the difference runs both ways and is large (docs/performance.md,
"Overlap or threads"), so the learner measures it rather than guessing.
"""

from __future__ import annotations

import time

import torch


class ThreadChoice:
    """Leaves one update untimed at each count (the first builds what it needs, and a
    compiled step compiles again for a new count), then times updates with ``threads`` torch
    threads and with one, taking turns (so that what else the machine does in the run's
    first seconds weighs on both alike), per gradient step. Another process can only slow an
    update down, so each count is judged by its fastest. From the second round of two on, it
    keeps the faster count where it is ``clear`` times faster, and after ``rounds`` rounds
    in any case, for the rest of the run. With ``threads`` of 1, or ``choose`` false, there
    is nothing to choose; an update that reports no gradient steps (ES's) keeps ``threads``."""

    def __init__(self, threads: int, rounds: int = 3, clear: float = 1.5, choose: bool = True):
        self.threads, self.rounds, self.clear = threads, rounds, clear
        self.calls = 0
        self.per_step: dict[int, list[float]] = {threads: [], 1: []}
        self.chosen: int | None = threads if threads <= 1 or not choose else None

    def next(self) -> int:
        """The torch threads for the next update: 1, ``threads`` (both untimed), then in turns."""
        if self.chosen is not None:
            return self.chosen
        return self.threads if self.calls % 2 else 1

    def timed(self, threads: int, seconds: float, steps: int | None) -> str | None:
        """An update's wall seconds with ``threads`` threads (what ``next`` gave) over its
        ``steps`` gradient steps; returns a line saying what was chosen, once, when it is."""
        if self.chosen is not None:
            return None
        if steps is None:  # no gradient steps to time: keep the threads given
            self.chosen = self.threads
            return None
        if self.calls >= 2:
            self.per_step[threads].append(seconds / max(1, steps))
        self.calls += 1
        timed = self.calls - 2
        if timed < 4 or timed % 2:
            return None
        fastest = {t: min(times) for t, times in self.per_step.items()}
        best = min(fastest, key=fastest.__getitem__)
        if timed < 2 * self.rounds and max(fastest.values()) < self.clear * fastest[best]:
            return None
        self.chosen = best
        other = 1 if self.chosen != 1 else self.threads
        return (f"walle_ray: learner: {self.chosen} torch thread{'s' * (self.chosen > 1)}, "
                f"{fastest[self.chosen] * 1e3:.2f} ms a gradient step against "
                f"{fastest[other] * 1e3:.2f} ms with {other} (measured on its first updates; "
                "learner.torch_threads sets it)")

    def update(self, learner, batches: list, env_steps: int, steps: int | None = None) -> dict:
        """``learner.update(batches, env_steps)`` with the threads ``next`` gives, timed while
        the choice is open; prints the choice once it is made. ``steps``: the update's
        gradient steps where its metrics do not report them (``grad_steps``)."""
        if self.chosen is not None:
            metrics = learner.update(batches, env_steps)
            metrics["torch_threads"] = torch.get_num_threads()
            return metrics
        threads = self.next()
        torch.set_num_threads(threads)
        started = time.perf_counter()
        metrics = learner.update(batches, env_steps)
        metrics["torch_threads"] = threads
        steps = metrics.get("grad_steps", steps)
        line = self.timed(threads, time.perf_counter() - started,
                          None if steps is None else int(steps))
        if self.chosen is not None:
            torch.set_num_threads(self.chosen)
        if line is not None:
            print(line, flush=True)
        return metrics

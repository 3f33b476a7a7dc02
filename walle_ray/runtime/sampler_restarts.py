"""``SamplerRestarts``: the sampler processes of a ``RayFleet`` that died and that Ray is
starting again, and what each death cost (``faults/``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from walle_ray.runtime.checkpoint import first_line
from walle_ray.runtime.fleet import RoleFailed


class SamplerRestarts:
    """A sampler process that dies (its actor, or its node) is started again by Ray; the
    fleet asks it whether it is back once ``due`` says so, and calls it again once it is
    (``back``). A death costs the process's call in flight: ``faults/sampler_restarts``
    counts each logical sampler that lost it (one for samplers that step together, as an env
    failure counts them) and ``faults/lost_fragments`` the fragments it would have brought.
    More than ``MAX_DEATHS`` deaths of one process with no report between fail the run."""

    MAX_DEATHS = 3
    ASK_AFTER_S = 0.2  # how soon a restarted process is asked whether it is back

    def __init__(self, names: list[str], cost: list[tuple[int, int]], faults: dict,
                 forget: Callable[[str], None] | None = None):
        """``names``: each sampler process's actor name; ``cost``: (samplers, fragments) that
        one death of each process loses; ``faults``: the fleet's counts, added to here;
        ``forget``: the stall watch's, told that a process is new."""
        self.names, self.cost, self.faults, self.forget = names, cost, faults, forget
        self.deaths = [0] * len(names)  # of each process since its last report
        self.when: dict[int, float] = {}  # restarting process -> when to ask whether it is back

    def died(self, p: int, exc: BaseException) -> None:
        """The one path for a dead sampler process: count what it lost, ask again soon."""
        self.deaths[p] += 1
        if self.forget is not None:
            self.forget(self.names[p])  # the process Ray starts again is new
        if self.deaths[p] > self.MAX_DEATHS:
            cause = getattr(exc, "cause", None) or exc  # not Ray's wrapper
            raise RoleFailed(f"{self.names[p].removeprefix('walle/')} keeps dying "
                             f"({type(cause).__name__}: {first_line(cause)})")
        samplers, fragments = self.cost[p]
        self.faults["sampler_restarts"] += samplers
        self.faults["lost_fragments"] += fragments
        self.not_back(p)

    def not_back(self, p: int) -> None:
        """Process p did not answer whether it is back (it died again meanwhile): ask again."""
        self.when[p] = time.monotonic() + self.ASK_AFTER_S

    def due(self, asking: set[int]) -> list[int]:
        """The restarting processes to ask now, but for those in ``asking`` (asked already)."""
        now = time.monotonic()
        return [p for p, when in self.when.items() if now >= when and p not in asking]

    def back(self, p: int) -> None:
        self.when.pop(p, None)

    def reported(self, p: int) -> None:
        self.deaths[p] = 0

    def restarting(self) -> set[str]:
        """The names of the processes not back yet."""
        return {self.names[p] for p in self.when}

    def __bool__(self) -> bool:
        return bool(self.when)

    def __iter__(self):
        return iter(self.when)

"""A sampler that is rebuilt when its environment fails, so one bad env step costs one
fragment, not the run."""

from __future__ import annotations

import sys
import traceback
from typing import Callable


class SamplerFailed(RuntimeError):
    """A sampler's env failed several times in a row, even with fresh envs."""


class RestartingSampler:
    """Holds one ``Sampler`` and builds a fresh one, with new envs and weights pulled again,
    when ``collect`` raises. The fragment that was being collected is lost and collected
    again; after ``max_failures`` failures in a row the error is raised as ``SamplerFailed``."""

    def __init__(self, cls: type, args: tuple, kwargs: dict | None = None, max_failures: int = 3):
        self.cls, self.args, self.kwargs = cls, args, kwargs or {}
        self.max_failures = max_failures
        self.sampler = cls(*args, **self.kwargs)
        self.restarts = 0  # since the start

    def collect(self, prepare: Callable, **collect_kwargs) -> tuple:
        """``prepare(sampler)`` (give it weights), then one fragment (``collect_kwargs`` go to
        the sampler's ``collect``); the stats say how many fragments were lost to failures on
        the way (``lost_fragments``)."""
        failures = 0
        while True:
            prepare(self.sampler)
            try:
                rollout, stats = self.sampler.collect(**collect_kwargs)
            except Exception as exc:  # whatever the env raised: rebuild, try again
                failures += 1
                where = f"sampler-{self.sampler.index}"
                if failures >= self.max_failures:
                    raise SamplerFailed(
                        f"{where}: its env failed {failures} times in a row, with fresh envs "
                        f"each time; last error: {type(exc).__name__}: {exc}") from exc
                last = traceback.extract_tb(exc.__traceback__)[-1]
                print(f"walle_ray: {where}: env failed ({type(exc).__name__}: {exc} at "
                      f"{last.filename}:{last.lineno}); restarting the sampler", file=sys.stderr,
                      flush=True)
                self.rebuild()
                continue
            stats["sampler_restarts"] = failures
            stats["lost_fragments"] = failures
            return rollout, stats

    def rebuild(self) -> None:
        try:
            self.sampler.close()
        except Exception:  # a broken env may not close cleanly; its replacement matters
            pass
        self.sampler = self.cls(*self.args, **self.kwargs)
        self.restarts += 1

    def close(self) -> None:
        self.sampler.close()

"""A sampler that is rebuilt when its environment fails, so one bad env step costs one
fragment, not the run."""

from __future__ import annotations

import sys
import traceback

from walle_ray.config import ConfigError
from walle_ray.envs.masks import NoActionAllowed
from walle_ray.pulse import PULSE


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

    def collect(self, feed=None) -> tuple:
        """One fragment, its weights from ``feed`` (``contracts.WeightsFeed``); the stats say
        how many fragments were lost to failures on the way (``lost_fragments``). A rebuilt
        sampler gets its weights from the feed again. What the feed raises (a parameter
        server that died) is not the env's failure: it goes to the caller as it was."""
        failures = 0
        guarded = None if feed is None else _Guarded(feed)
        while True:
            try:
                rollout, stats = self.sampler.collect(guarded)
            except Exception as exc:  # whatever the env raised: rebuild, try again
                if guarded is not None and guarded.error is exc:
                    raise
                where = f"sampler-{self.sampler.index}"
                if isinstance(exc, (ConfigError, NoActionAllowed)):  # fresh envs would repeat it
                    raise SamplerFailed(f"{where}: {exc}") from exc
                failures += 1
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
        PULSE.begin_again()  # its envs are made again: the start-up limit applies
        self.sampler = self.cls(*self.args, **self.kwargs)
        self.restarts += 1

    def close(self) -> None:
        self.sampler.close()


class _Guarded:
    """A weights feed that remembers the error it raised, so that ``RestartingSampler`` can
    tell it from the env's."""

    def __init__(self, feed):
        self.feed, self.error = feed, None

    @property
    def lead(self) -> int:
        return self.feed.lead

    def refresh(self, sampler) -> None:
        self._call(self.feed.refresh, sampler)

    def ahead(self) -> None:
        self._call(self.feed.ahead)

    def _call(self, method, *args) -> None:
        try:
            method(*args)
        except BaseException as exc:
            self.error = exc
            raise

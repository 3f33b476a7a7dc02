"""Per-iteration metrics: the windowed return, metrics.jsonl, and the console progress line."""

from __future__ import annotations

import json
import math
import sys
import time
from collections import deque
from pathlib import Path

from walle_ray.runtime.files import write_atomic


class ReturnWindow:
    """Mean of the last ``size`` episode returns (NaN before the first episode)."""

    def __init__(self, size: int, initial: list[float] | None = None):
        self.returns: deque[float] = deque(initial or [], maxlen=size)
        self.lengths: deque[int] = deque(maxlen=size)

    def add(self, returns: list[float], lengths: list[int]) -> None:
        self.returns.extend(returns)
        self.lengths.extend(lengths)

    @property
    def mean(self) -> float:
        return sum(self.returns) / len(self.returns) if self.returns else float("nan")

    @property
    def mean_length(self) -> float:
        return sum(self.lengths) / len(self.lengths) if self.lengths else float("nan")

    @property
    def full(self) -> bool:
        return len(self.returns) == self.returns.maxlen

    def reaches(self, target: float, returns: list[float]) -> bool:
        """Whether the window, with ``returns`` added, would be full with a mean of at least
        ``target`` (``run.stop_at_return``'s test, asked before the returns are added)."""
        after = deque(self.returns, maxlen=self.returns.maxlen)
        after.extend(returns)
        return len(after) == after.maxlen and sum(after) / len(after) >= target


class MetricsFile:
    """One JSON object per line, flushed every line so a crash loses nothing.

    A new run creates the file, and fails (FileExistsError) where it exists: the first
    run to create it owns its directory. A resumed run appends to it, after
    ``keep_records_until`` has cut it back to the checkpoint.
    """

    def __init__(self, path: Path, append: bool = False):
        self.path = Path(path)
        self.file = open(self.path, "a" if append else "x", buffering=1)

    def write(self, record: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                 for k, v in record.items()}
        self.file.write(json.dumps(clean) + "\n")

    def close(self, exit_code: int = 0) -> None:
        self.file.close()


class Sinks:
    """Each record goes to every sink: metrics.jsonl first, then W&B, TensorBoard and Ray
    gauges when configured.

    Media are files already written (evaluation videos, the timing figure); ``media`` hands
    them to the sinks that have a ``media(step, images, videos)`` method, and the others
    (metrics.jsonl, Ray gauges) never see them. ``also_close``: objects holding resources
    (the evaluation env) that close with the sinks. ``at_close``: callables given these
    sinks, run before the sinks close, for what the end of a run adds (its timing figure).
    """

    def __init__(self, sinks: list, also_close: list | None = None,
                 at_close: list | None = None):
        self.sinks = sinks
        self.also_close = also_close or []
        self.at_close = at_close or []

    def write(self, record: dict) -> None:
        for sink in self.sinks:
            sink.write(record)

    def summary(self, values: dict) -> None:
        """The run's end figures (milestones, cost) for the sinks that keep a summary."""
        for sink in self.sinks:
            if hasattr(sink, "summary"):
                sink.summary(values)

    @property
    def takes_media(self) -> bool:
        return any(hasattr(sink, "media") for sink in self.sinks)

    def media(self, step: int, images: dict[str, Path] | None = None,
              videos: dict[str, list[Path]] | None = None) -> None:
        """``images``: name -> PNG file; ``videos``: name -> MP4 files; at ``step`` env steps."""
        for sink in self.sinks:
            if hasattr(sink, "media"):
                sink.media(step, images=images or {}, videos=videos or {})

    def close(self, exit_code: int = 0) -> None:
        """Run ``at_close``, close every sink (the metrics file first), then what else holds
        resources, going on when one fails."""
        errors = []
        closers = [("the end-of-run media", lambda f=fn: f(self)) for fn in self.at_close]
        closers += [(type(sink).__name__, lambda s=sink: s.close(exit_code)) for sink in self.sinks]
        closers += [(type(other).__name__, other.close) for other in self.also_close]
        for owner, close in closers:
            try:
                close()
            except Exception as exc:  # a W&B upload failing must not hide the run's own end
                errors.append(f"{owner}: {exc}")
        for error in errors:
            print(f"walle_ray: warning: closing {error}", file=sys.stderr, flush=True)


def keep_records_until(path: Path, iteration: int) -> int:
    """Cut a metrics.jsonl back to its records up to ``iteration`` (a checkpoint's counter),
    dropping those after it and any torn line, as a new file renamed over the old one (a
    missing file stays missing). Returns the number of lines dropped.

    A run killed after its last checkpoint wrote records the resumed run writes again; a
    line torn by the kill would swallow the first record appended to it."""
    path = Path(path)
    if not path.is_file():
        return 0
    dropped = 0

    def write(out) -> None:
        nonlocal dropped
        with open(path, "rb") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:  # a torn line: not JSON, or not UTF-8
                    record = None
                if not isinstance(record, dict) or record.get("iteration", 0) > iteration:
                    dropped += 1
                    continue
                out.write(line if line.endswith(b"\n") else line + b"\n")

    write_atomic(path, write)
    return dropped


def read_metrics(path: Path) -> list[dict]:
    """All records of a metrics.jsonl, skipping a torn last line."""
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def _fmt_count(n: float) -> str:
    for unit, div in (("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


def _fmt_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """One live line on a terminal (rewritten in place); a line every few seconds otherwise."""

    def __init__(self, label: str, total_steps: int, mode: str = "auto", every_s: float = 10.0,
                 stream=None):
        self.stream = stream or sys.stdout
        self.label = label
        self.total = total_steps
        self.live = mode == "auto" and self.stream.isatty()
        self.off = mode == "off"
        self.every_s = every_s
        self._last = 0.0
        self.since: tuple[float, int] | None = None  # (wall_s, env_steps) of the first record with new steps
        self.milestone: tuple[str, float] | None = None  # the highest score reached, its minutes

    def _rate(self, r: dict) -> float:
        """Env steps/s since the first record that brought any: start-up (Ray, building the
        roles, the first fragments) is left out, so the rate and the ETA are the run's pace.
        NaN until a second such record."""
        if self.since is None:
            if (r.get("env_steps_per_s") or 0) > 0:
                self.since = (r["wall_s"], r["env_steps"])
            return float("nan")
        wall, steps = r["wall_s"] - self.since[0], r["env_steps"] - self.since[1]
        return steps / wall if wall > 0 else float("nan")

    def update(self, r: dict, force: bool = False) -> None:
        if self.off:
            return
        rate = self._rate(r)
        eta = (self.total - r["env_steps"]) / rate if rate > 0 else float("nan")
        for key in r:
            if key.startswith("milestones/") and key.endswith("/minutes"):
                score = key.split("/")[1]
                if self.milestone is None or float(score) > float(self.milestone[0]):
                    self.milestone = (score, r[key])
        ret = r.get("return")
        ret_text = "—" if ret is None or not math.isfinite(ret) else f"{ret:.1f}"
        if "updates_per_s" in r:  # asynchronous: learner rate and policy lag
            detail = f"{r['updates_per_s']:.1f} updates/s | lag {r['policy_lag_mean']:.1f}"
        else:  # synchronous: WALL-E's collection vs learning split
            detail = f"collect {r['collect_share']:.0%} learn {r['learn_share']:.0%}"
        rate_text = _fmt_count(rate) if math.isfinite(rate) else "—"
        line = (f"[{self.label}] it {r['iteration']} | steps {_fmt_count(r['env_steps'])}/"
                f"{_fmt_count(self.total)} | return {ret_text} | {rate_text} steps/s | "
                f"{detail} | ETA {_fmt_eta(eta)}")
        if self.milestone is not None:
            line += f" | reached {self.milestone[0]} at {self.milestone[1]:.1f} min"
        if self.live:
            self.stream.write("\r\033[K" + line)
            self.stream.flush()
        elif force or time.monotonic() - self._last >= self.every_s:
            self._last = time.monotonic()
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.live:
            self.stream.write("\n")
            self.stream.flush()

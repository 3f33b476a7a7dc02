"""The bottleneck report's accumulator: ``RunTimes`` adds up where each role's time goes
during a run (fed by ``runtime/loop.py``) and, when it ends, writes ``report.json`` with the
figures and the advice that ``walle_ray/bottleneck.py`` makes of them, and the summary
that ``walle_ray/report.py`` words."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from walle_ray.runtime.files import write_text_atomic
from walle_ray.bottleneck import (build_report, learner_totals, memory_totals, merge, new_totals,
                                  sampler_totals)
from walle_ray.report import REPORT_FILE

# Memory stats that count rows served / written since the memory was made, by memory type.
_SERVED_KEYS = ("rows_out", "sampled")


def memory_fill(stats: dict) -> tuple[float, float]:
    """(fill 0 to 1, rows or fragments held) of a memory's ``stats()``, whatever its type:
    a replay shard's ``fill``, a mix's ``<type>_size`` over ``<type>_capacity``, a FIFO's
    ``depth`` over ``capacity``."""
    sizes = [v for k, v in stats.items() if k.endswith("_size")]
    if sizes:
        capacity = sum(v for k, v in stats.items() if k.endswith("_capacity"))
        return (sum(sizes) / capacity if capacity else 0.0), float(sum(sizes))
    size = stats.get("size", stats.get("depth", 0))
    fill = stats.get("fill", size / stats["capacity"] if stats.get("capacity") else 0.0)
    return float(fill), float(size)


def run_meta(cfg, algo, topo, fleet=None) -> tuple[dict, object]:
    """A run's names for its report, and the memories sampler i writes to; with its
    ``fleet``, the envs it steps in all, and a sampler that steps with the others of its
    process (``fleet.lanes``) writes to every memory (``topology.lane_routes``)."""
    lanes = fleet.lanes if fleet is not None else frozenset()
    rows = cfg.env.envs_per_sampler if algo.deals_rows else None
    every = list(range(topo.memories))

    def memories_of(i: int) -> list[int]:
        return every if i in lanes else topo.memories_of_sampler(i, rows)

    routes = [memories_of(i) for i in range(topo.samplers)]
    feeders = [sum(k in r for r in routes) for k in range(topo.memories)]
    if algo.reads_dataset:  # no samplers, whatever the topology says (topology=local)
        feeders = [0] * topo.memories
    meta = {"algo": cfg.algo.name, "env": cfg.env.name, "topology": str(topo),
            "loop": algo.loop, "local": bool(topo.local), "offline": algo.reads_dataset,
            "learners": topo.learners, "feeders": feeders,
            "samplers": 0 if algo.reads_dataset else topo.samplers,
            "gpu": not topo.local and cfg.learner.num_gpus > 0,
            # a synchronous iteration's pieces of work dealt among the samplers (ES's pairs)
            "split_work": algo.work_pieces(cfg),
            "envs": fleet.envs if fleet is not None else None}
    return meta, memories_of


class RunTimes:
    """Adds up where each role's time goes over a run, from what the driver loop already
    receives: sampler reports, learner metrics, synchronous timings, memory stats.

    ``meta``: the run's names (``algo``, ``env``, ``topology``, ``loop``, ``local``) and
    ``feeders``, how many samplers write to each memory; ``memories_of_sampler(i)`` lists
    the memories sampler i writes to. ``previous``: an earlier report's totals (a resumed
    run), which the report adds to this run's.
    """

    def __init__(self, meta: dict | None = None, memories_of_sampler=None,
                 previous: dict | None = None):
        self.meta = dict(meta or {})
        self.memories_of_sampler = memories_of_sampler or (lambda i: [0])
        self.previous = previous
        self.totals = new_totals()
        self.served_last: dict[int, float] = {}  # memory k's served counter at its last record
        self.rank_last: dict[int, float] = {}  # memory k's seconds ranking at its last record
        self.started = self.ended = time.perf_counter()  # the first report, the last record
        self.last_seen: dict[int, float] = {}  # when each sampler's last report came
        # The steady rate: agent steps and seconds of the records after the one with the
        # first update (``report.json``'s ``steady``; topology=auto's measured rate).
        self.steady = {"env_steps": 0, "wall_s": 0.0}
        self.pending_steps = 0
        self.learning = False

    @classmethod
    def for_run(cls, cfg, algo, topo, run_dir: Path, resumed: bool, fleet=None) -> "RunTimes":
        """The accumulator of a run with this config, algorithm, topology and fleet
        (``run_meta``); a resumed run picks up the totals of ``<run dir>/report.json`` (or of
        the run it resumes from)."""
        meta, memories_of_sampler = run_meta(cfg, algo, topo, fleet)
        previous = None
        if resumed:
            source = Path(cfg.run.resume)
            for where in (Path(run_dir), source if source.is_dir() else source.parent.parent):
                if (where / REPORT_FILE).is_file():
                    previous = json.loads((where / REPORT_FILE).read_text()).get("totals")
                    break
        return cls(meta, memories_of_sampler, previous)

    def replanned(self, cfg, algo, topo, fleet=None) -> None:
        """The run goes on with rebuilt roles (another topology where ``topology=auto``
        re-planned, other processes on the cluster of now): its names and routes are the
        new fleet's from now on."""
        meta, self.memories_of_sampler = run_meta(cfg, algo, topo, fleet)
        self.meta.update(meta)

    def add_sampler(self, report: dict) -> None:
        """One sampler call's report (one fragment, or a call's sum over its fragments)."""
        i = int(report.get("sampler", 0))
        self.last_seen[i] = time.perf_counter()
        self.pending_steps += report.get("env_steps", 0) or 0
        s = self.totals["samplers"].setdefault(str(i), sampler_totals())
        for key in ("env_s", "act_s", "put_wait_s", "weights_wait_s", "collect_s", "env_steps",
                    "cpu_s"):
            s[key] += report.get(key, 0) or 0
        s["fragments"] += report.get("fragments", 1) - report.get("dropped", 0)
        s["calls"] += 1
        # A fragment dealt across memories counts in each; samplers stepping together share
        # their process's fragments (``split_lanes``), counted once.
        for k in ([] if report.get("lane") else self.memories_of_sampler(i)):
            m = self.totals["memories"].setdefault(str(k), memory_totals())
            m["fragments_in"] += report.get("fragments", 1) - report.get("dropped", 0)

    def add_learner(self, metrics: dict) -> None:
        """One learner call's metrics (before the loop's ``Interval`` pops its counters).
        ``sync_wait_s`` is a mean per update there; a call without an update spent what
        was not batch waiting in the all-reduce that found another learner without one."""
        lr = self.totals["learners"]
        updates = int(metrics.get("updates", 0))
        train_s, wait_s = metrics.get("train_s", 0.0), metrics.get("batch_wait_s", 0.0)
        sync_s = (metrics.get("sync_wait_s", 0.0) * updates if updates
                  else max(0.0, train_s - wait_s))
        per = lr.setdefault("per", {}).setdefault(str(metrics.get("learner", "0")),
                                                  learner_totals())
        for sums in (lr, per):  # all learners, and this learner process
            sums["train_s"] += train_s
            sums["batch_wait_s"] += wait_s
            sums["sync_wait_s"] += sync_s
            sums["updates"] += updates
            # a train call's metrics are means over its updates
            sums["cpu_s"] = sums.get("cpu_s", 0.0) + metrics.get("learn_cpu_s", 0.0) * updates
        lr["calls"] += 1
        lr["empty_calls"] += not updates

    def add_record(self, dt: float, timing: dict | None, memories: list[dict]) -> None:
        """One metrics record's interval: its wall time, a synchronous iteration's split, and
        the memories' stats at its end."""
        self.totals["wall_s"] += dt
        if self.learning:
            self.steady["env_steps"] += self.pending_steps
            self.steady["wall_s"] += dt
        self.learning = self.totals["learners"]["updates"] > 0
        self.pending_steps = 0
        self.ended = time.perf_counter()
        self.totals["records"] += 1
        if timing is not None:
            split = self.totals["split"]
            split["collect_s"] += timing["collect_s"]
            split["learn_s"] += timing["learn_s"]
            split["iterations"] += 1
        for k, stats in enumerate(memories):
            m = self.totals["memories"].setdefault(str(k), memory_totals())
            fill, size = memory_fill(stats)
            m["records"] += 1
            m["fill_sum"] += fill
            m["size_sum"] += size
            served = next((stats[key] for key in _SERVED_KEYS if key in stats), None)
            if served is not None:
                m["served_counted"] += 1
                last = self.served_last.get(k, 0)
                # A counter that went back belongs to a memory rebuilt after a failure.
                m["served_rows"] += served - last if served >= last else served
                self.served_last[k] = served
            ranking = [v for key, v in stats.items() if key.endswith("_rank_s")]
            if ranking:  # elite or attentive replay: seconds this memory spent ranking
                rank_s, last = sum(ranking), self.rank_last.get(k, 0.0)
                m["rank_s"] += rank_s - last if rank_s >= last else rank_s
                self.rank_last[k] = rank_s

    def run_totals(self) -> dict:
        """This run's totals added to those of the run it resumed."""
        if self.previous is None:
            return self.totals
        both = merge(self.previous, self.totals)
        both["segments"] = self.previous.get("segments", 1) + 1
        return both

    def silent(self) -> dict[int, float]:
        """Seconds between each sampler's last report (the start for one that sent none)
        and the last record: a long silence is a call that never returned, e.g. blocked on
        a full memory. Only an asynchronous Ray run's samplers can be silent."""
        if self.meta.get("loop") != "async" or self.meta.get("local"):
            return {}
        indices = set(self.last_seen) | set(range(self.meta.get("samplers", 0)))
        return {i: max(0.0, self.ended - self.last_seen.get(i, self.started))
                for i in sorted(indices)}

    def finish(self, run_dir: Path, counters: dict) -> dict | None:
        """Write ``report.json`` and print its summary; a report that cannot be made is
        said in one line, and the run it describes stands."""
        try:
            report = build_report(self.run_totals(), self.meta, counters, self.silent(),
                                  self.steady)
            path = Path(run_dir) / REPORT_FILE
            write_text_atomic(path, json.dumps(report, indent=1) + "\n")
        except Exception as exc:  # the report describes the run; it must not fail it
            print(f"walle_ray: no bottleneck report ({type(exc).__name__}: {exc})",
                  file=sys.stderr, flush=True)
            return None
        print(report["summary"], flush=True)
        return report


# ----------------------------------------------------------------------------- the report

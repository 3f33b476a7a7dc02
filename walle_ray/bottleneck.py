"""The bottleneck report: where each role's time went over a run, and one line of advice.

During a run, ``RunTimes`` (``runtime/times.py``, fed by the driver loop) adds up, per role:

- samplers: the env step (``env_s``), the policy's act (``act_s``), waiting on a full memory
  (``put_wait_s``) and on weights (``weights_wait_s``), per sampler index;
- learners: their calls' time (``train_s``), waiting for a batch (``batch_wait_s``), waiting
  for the other learners in the all-reduces (``sync_wait_s``), the rest being compute; for a
  synchronous algorithm, each iteration's collect/learn split;
- memories: their fill and size at each record, the fragments their samplers wrote, and
  the rows they served.

At the end of the run ``RunTimes.finish`` writes ``<run dir>/report.json`` (``build_report``)
and prints its one-paragraph summary (``walle_ray/report.py``, whose command line,
``python -m walle_ray.report <run dir>``, prints it again). A resumed run adds its figures
to the ``totals`` of the report.json it finds, so the report covers the whole run.
``classify`` picks the advice from the figures alone, with the thresholds below.

This module imports neither torch nor Ray.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from walle_ray.report import pct, run_cost, summary

FORMAT_VERSION = 1

# A memory that got or served nothing while the learners were idle at least this share of
# their time starves the run (the learners wait on it, or on each other because of it).
STARVED_IDLE = 0.5
# Synchronous (or one-process) runs: the phase that takes at least this share of the time.
SPLIT_BOUND = 0.6
# Asynchronous runs: learners computing at least this share of their time...
LEARNER_BUSY_BOUND = 0.85
# ...or samplers blocked on full memories at least this share of theirs: learner-bound.
SAMPLER_BLOCKED_BOUND = 0.3
# Learners waiting for batches at least this share of their time: sampler-bound.
BATCH_WAIT_BOUND = 0.4
# Learners waiting for each other in the all-reduces at least this share: sync-bound.
SYNC_WAIT_BOUND = 0.3

# A sampler silent for at least this share of the run at its end (and this many seconds) is
# said to be stuck in a call: its figures count only the calls that returned.
SILENT_SHARE = 0.25
SILENT_MIN_S = 5.0


@dataclass(frozen=True)
class Figures:
    """What ``classify`` reads: shares of each role's own time, 0 to 1.

    ``alternating``: the roles take turns (a synchronous algorithm, or ``topology=local``,
    where every role runs in the driver process), so ``collect_share`` and ``learn_share``
    split the run's time; otherwise samplers and learners run at once and the learner
    shares (of their calls' time) apply.
    """

    alternating: bool = False
    synchronous: bool = False  # collect, then learn: the learners never overlap the samplers
    local: bool = False
    gpu: bool = False  # the learners are on GPUs already
    collect_share: float = 0.0
    learn_share: float = 0.0
    env_share: float = 0.0  # samplers: in env steps
    act_share: float = 0.0  # samplers: in the policy's act (inference)
    put_wait_share: float = 0.0  # samplers: waiting on a full memory
    weights_wait_share: float = 0.0  # samplers: waiting on weights
    busy_share: float = 0.0  # learners: computing
    batch_wait_share: float = 0.0  # learners: waiting for a batch
    sync_wait_share: float = 0.0  # learners: waiting for each other
    starved: tuple[int, ...] = ()  # memories that got or served nothing while others did
    starved_unfed: tuple[int, ...] = ()  # those of them no sampler writes to
    offline: bool = False  # no samplers: memories serve a recorded dataset (algo=bc)


def _sampler_clause(f: Figures) -> str:
    """What the samplers mostly do, and the advice that goes with it."""
    more = ("use a Ray topology with several samplers (e.g. 4a1m1l)" if f.local
            else "add samplers")
    if f.act_share > f.env_share:
        return (f"samplers spend {pct(f.act_share)} in the policy's act; raise "
                f"env.envs_per_sampler to batch inference, or {more}")
    return f"samplers spend {pct(f.env_share)} in env steps; {more} or env.envs_per_sampler"


def _learner_advice(f: Figures) -> str:
    """What relieves a learner-bound run of this kind."""
    if f.synchronous and f.local:
        return ("use a Ray topology with several learners (e.g. 2a1m2l) or learner.num_gpus=1, "
                "or fewer epochs per batch")
    if f.synchronous and f.gpu:
        return "add learners, each on a GPU of its own (they split each batch), or fewer epochs"
    if f.synchronous:
        return "add learners (they split each batch), set learner.num_gpus=1, or fewer epochs"
    if f.local:
        return "use a Ray topology with a learner of its own (e.g. 2a1m1l) and learner.num_gpus=1"
    if f.gpu:
        return "add learners, each on a GPU of its own, or use fewer samplers"
    return "add learners, set learner.num_gpus=1, or use fewer samplers"


def classify(f: Figures) -> tuple[str, str]:
    """The verdict (``starved``, ``learner-bound``, ``sync-bound``, ``sampler-bound``,
    ``memory-bound`` (offline runs) or ``balanced``) and the one line of advice, chosen from the figures alone."""
    idle = f.batch_wait_share + f.sync_wait_share
    if f.offline:
        return _classify_offline(f)
    if f.starved and (idle >= STARVED_IDLE or f.alternating):
        k = f.starved[0]
        why = "no sampler writes to it" if k in f.starved_unfed else "it gets no fragments"
        return "starved", (f"starved by one memory: memory-{k} serves 0 batches ({why}) while "
                           f"the learners wait {pct(idle)}; give it samplers (A >= M, samplers "
                           "a multiple of memories) or use fewer memories")
    if f.alternating:
        if f.learn_share >= SPLIT_BOUND:
            return "learner-bound", (f"learner-bound: learning takes {pct(f.learn_share)} of "
                                     f"the time, collecting {pct(f.collect_share)}; "
                                     + _learner_advice(f))
        if f.collect_share >= SPLIT_BOUND:
            return "sampler-bound", (f"sampler-bound: collecting takes {pct(f.collect_share)} "
                                     f"of the time; " + _sampler_clause(f))
        return "balanced", (f"balanced: collecting {pct(f.collect_share)}, learning "
                            f"{pct(f.learn_share)}; scale samplers and learners together")
    if f.sync_wait_share >= SYNC_WAIT_BOUND:
        return "sync-bound", (f"sync-bound: learners wait {pct(f.sync_wait_share)} for each "
                              "other in the all-reduce; one is slower or its memories serve "
                              "late: balance the memories or use fewer learners")
    if f.busy_share >= LEARNER_BUSY_BOUND or f.put_wait_share >= SAMPLER_BLOCKED_BOUND:
        return "learner-bound", (f"learner-bound: learners busy {pct(f.busy_share)}, samplers "
                                 f"blocked {pct(f.put_wait_share)} on full memories; "
                                 + _learner_advice(f))
    if f.batch_wait_share >= BATCH_WAIT_BOUND:
        return "sampler-bound", (f"sampler-bound: learners wait {pct(f.batch_wait_share)} for "
                                 "batches, " + _sampler_clause(f))
    return "balanced", (f"balanced: learners busy {pct(f.busy_share)}, samplers blocked "
                        f"{pct(f.put_wait_share)} on full memories; no role holds the others "
                        "back: scale samplers and learners together")


def _classify_offline(f: Figures) -> tuple[str, str]:
    """A run with no samplers: only the memories serving the dataset can hold learners back."""
    if f.sync_wait_share >= SYNC_WAIT_BOUND:
        return "sync-bound", (f"sync-bound: learners wait {pct(f.sync_wait_share)} for each "
                              "other in the all-reduce; use fewer learners")
    if f.batch_wait_share >= BATCH_WAIT_BOUND:
        return "memory-bound", (f"memory-bound: learners wait {pct(f.batch_wait_share)} for "
                                "batches of recorded steps; add memories (each serves its own "
                                "shard of the episodes, e.g. 0a2m1l)")
    more = ("use a Ray topology (e.g. 0a1m1l) so the memory serves while the learner computes, "
            "and learner.num_gpus=1" if f.local else
            "add learners (0aMmLl with M >= L), or set learner.num_gpus=1")
    return "learner-bound", (f"learner-bound: the learners compute {pct(f.busy_share)} of "
                             f"their time; {more}")


# ----------------------------------------------------------------------------- accumulating

def sampler_totals() -> dict:
    return {"env_s": 0.0, "act_s": 0.0, "put_wait_s": 0.0, "weights_wait_s": 0.0,
            "collect_s": 0.0, "env_steps": 0, "fragments": 0, "calls": 0, "cpu_s": 0.0}


def memory_totals() -> dict:
    return {"records": 0, "fill_sum": 0.0, "size_sum": 0.0, "served_rows": 0,
            "served_counted": 0, "fragments_in": 0, "rank_s": 0.0}


def learner_totals() -> dict:
    """One learner process's sums (``totals["learners"]["per"]``, keyed by its shards)."""
    return {"train_s": 0.0, "batch_wait_s": 0.0, "sync_wait_s": 0.0, "updates": 0, "cpu_s": 0.0}


def new_totals() -> dict:
    """The additive totals of a run (``report.json``'s ``totals``): sums and counts only,
    so a resumed run's add to the earlier ones (``merge``)."""
    return {"segments": 1, "wall_s": 0.0, "records": 0, "samplers": {},
            "learners": {**learner_totals(), "calls": 0, "empty_calls": 0, "per": {}},
            "split": {"collect_s": 0.0, "learn_s": 0.0, "iterations": 0},
            "memories": {}}


def merge(a: dict, b: dict) -> dict:
    """``a + b``, key by key, through nested dicts (keys of either)."""
    out = dict(a)
    for key, value in b.items():
        if isinstance(value, dict):
            out[key] = merge(a.get(key, {}), value)
        else:
            out[key] = a.get(key, 0) + value
    return out


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def sampler_figures(totals: dict) -> dict:
    """The samplers' shares of their own time (collecting plus waiting), pooled over the
    samplers, and per sampler."""
    keys = ("env_s", "act_s", "put_wait_s", "weights_wait_s", "collect_s")
    pooled = {key: sum(s[key] for s in totals["samplers"].values()) for key in keys}

    def shares(s: dict) -> dict:
        own = s["collect_s"] + s["put_wait_s"] + s["weights_wait_s"]
        out = {f"{key[:-2]}_share": _share(s[key], own)
               for key in ("env_s", "act_s", "put_wait_s", "weights_wait_s")}
        out["other_share"] = max(0.0, 1 - sum(out.values()))
        return {"time_s": own, **out}

    per = [{"index": int(i), **s, **shares(s)}
           for i, s in sorted(totals["samplers"].items(), key=lambda kv: int(kv[0]))]
    return {"count": len(per), **shares(pooled), "per_sampler": per}


def _learner_shares(lr: dict, time_s: float) -> dict:
    batch, sync = lr["batch_wait_s"], min(lr["sync_wait_s"], time_s)
    return {"time_s": time_s, "busy_share": _share(max(0.0, time_s - batch - sync), time_s),
            "batch_wait_share": _share(batch, time_s), "sync_wait_share": _share(sync, time_s),
            "updates": lr["updates"]}


def learner_figures(totals: dict, alternating_s: float | None) -> dict:
    """The learners' shares of their calls' time, pooled and per learner process (named by
    the learner shards it runs, ``"0"`` or ``"0,1"`` when packed). ``alternating_s``: where
    the roles take turns in one process and the learner calls are not timed
    (``topology=local``'s asynchronous loop), the time the samplers did not take."""
    lr = totals["learners"]
    time_s = lr["train_s"] if lr["train_s"] > 0 or alternating_s is None else alternating_s
    per = [{"shards": shards, **_learner_shares({**learner_totals(), **t}, t.get("train_s", 0.0))}
           for shards, t in sorted((lr.get("per") or {}).items(),
                                   key=lambda kv: [int(x) for x in kv[0].split(",")])]
    if len(per) < 2 or alternating_s is not None:  # one learner process: the pooled figures
        per = []
    return {**_learner_shares(lr, time_s), "calls": lr["calls"],
            "calls_without_update": lr["empty_calls"], "per_learner": per}


def memory_figures(totals: dict, feeders: list[int]) -> list[dict]:
    """Per memory: the samplers writing to it, its mean fill and size over the records, the
    fragments its samplers wrote, the rows it served (where its type counts them) and the
    share of the run it spent ranking rows (elite and attentive replay)."""
    count = max([len(feeders)] + [int(k) + 1 for k in totals["memories"]])
    out = []
    for k in range(count):
        m = {**memory_totals(), **totals["memories"].get(str(k), {})}
        records = m["records"]
        out.append({"index": k, "samplers": feeders[k] if k < len(feeders) else None,
                    "fill_mean": m["fill_sum"] / records if records else None,
                    "size_mean": m["size_sum"] / records if records else None,
                    "fragments_in": m["fragments_in"], "served_rows": m["served_rows"],
                    "served_counted": m["served_counted"], "records": records,
                    "rank_share": _share(m["rank_s"], totals["wall_s"])})
    return out


def starved_memories(memories: list[dict]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Memories that got no fragment, or (where the run records it) served no row, while
    another memory did: a memory that holds its learner back alone. (All memories idle is
    a run that has not started learning, not one memory starving.)"""
    if len(memories) < 2:
        return (), ()
    got = [m["fragments_in"] > 0 for m in memories]
    served = [m["served_rows"] > 0 or not m["served_counted"] for m in memories]
    starved = tuple(m["index"] for m, g in zip(memories, got) if not g and any(got))
    if not starved and any(m["served_rows"] > 0 for m in memories):
        starved = tuple(m["index"] for m, s in zip(memories, served) if not s)
    unfed = tuple(k for k in starved if memories[k]["samplers"] == 0)
    return starved, unfed


def build_report(totals: dict, meta: dict, counters: dict | None = None,
                 silent: dict[int, float] | None = None, steady: dict | None = None) -> dict:
    """The report (``report.json``) of a run's totals: the figures per role, the verdict,
    the advice line and the summary paragraph. ``silent``: seconds since each sampler's
    last report when the run stopped."""
    counters = counters or {}
    split = totals["split"]
    local = bool(meta.get("local"))
    samplers = sampler_figures(totals)
    sampler_s = sum(s["collect_s"] for s in samplers["per_sampler"])
    wall = totals["wall_s"]
    alternating = meta.get("loop") == "sync" or local
    if split["iterations"]:
        collect_s, learn_s = split["collect_s"], split["learn_s"]
    else:  # one process, asynchronous loop: what the samplers did not take was learning's
        collect_s, learn_s = min(sampler_s, wall), max(0.0, wall - sampler_s)
    learners = learner_figures(totals, learn_s if local and not split["iterations"] else None)
    memories = memory_figures(totals, list(meta.get("feeders") or []))
    starved, unfed = starved_memories(memories)
    phases = collect_s + learn_s
    figures = Figures(
        alternating=alternating, synchronous=meta.get("loop") == "sync", local=local,
        gpu=bool(meta.get("gpu")), collect_share=_share(collect_s, phases), learn_share=_share(learn_s, phases),
        env_share=samplers["env_share"], act_share=samplers["act_share"],
        put_wait_share=samplers["put_wait_share"],
        weights_wait_share=samplers["weights_wait_share"],
        busy_share=learners["busy_share"], batch_wait_share=learners["batch_wait_share"],
        sync_wait_share=learners["sync_wait_share"], starved=starved, starved_unfed=unfed,
        offline=bool(meta.get("offline")))
    verdict, advice = classify(figures)
    report = {
        "format": FORMAT_VERSION,
        "run": {**{k: meta.get(k) for k in ("algo", "env", "topology", "loop", "local",
                                             "learners", "cpus", "split_work", "envs")},
                "segments": totals.get("segments", 1), "wall_s": wall,
                "env_steps": counters.get("env_steps", sum(s["env_steps"] for s in
                                                           samplers["per_sampler"])),
                "updates": counters.get("updates", learners["updates"])},
        "samplers": samplers, "learners": learners,
        "iterations": ({"count": split["iterations"], "collect_s": collect_s, "learn_s": learn_s,
                        "collect_share": figures.collect_share,
                        "learn_share": figures.learn_share} if alternating else None),
        "memories": memories, "figures": asdict(figures),
        "silent_samplers": {str(i): s for i, s in (silent or {}).items()
                            if s >= max(SILENT_MIN_S, SILENT_SHARE * wall)},
        "verdict": verdict, "advice": advice, "totals": totals,
        "milestones": dict(counters.get("milestones", {})), "cost": run_cost(counters),
        "faults": dict(counters.get("faults", {})),
        "steady": _steady(steady),
    }
    if meta.get("auto"):  # topology=auto: its model, inputs and choice, and what came of it
        report["auto"] = {**meta["auto"], "measured_rate": report["steady"]["rate"]}
    report["summary"] = summary(report)
    return report


def _steady(steady: dict | None) -> dict:
    """Agent steps per second after the first update (0 where no record came after it)."""
    steady = dict(steady or {"env_steps": 0, "wall_s": 0.0})
    steady["rate"] = steady["env_steps"] / steady["wall_s"] if steady["wall_s"] > 0 else 0.0
    return steady

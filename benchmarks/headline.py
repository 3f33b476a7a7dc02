"""The headline command on this machine: IMPALA on Pong with ``topology=32a4m4l`` against
``2a1m1l``, alternating, each for a fixed wall time; then the other shipped topologies once.

    python benchmarks/headline.py [--rounds 3] [--seconds 150] [--others 60] [--warmup 45]

Each run is ``python -m walle_ray algo=impala env=pong topology=T`` as a user types it (the
Pong preset, ``model.bf16=auto``), with a wall budget. Per run: time from the command to the
first learner update (``first_update_s``), the role processes it started, the peak resident
memory of all its processes (``resident_gib``: the driver, Ray's own processes and every
role, shared pages counted once), and agent steps/s consumed by the learners in steady state
(the records after ``--warmup`` seconds of the loop). Writes benchmarks/results/headline.json.
Targets: every topology's first update within 30 s (``2a1m1l`` within 15 s), ``32a4m4l``
under 4 GiB and at least 0.95x of ``2a1m1l`` in steady state.
"""

from __future__ import annotations

import argparse
import shutil
import statistics

from common import ROOT, run_cli, steady_consumed_rate, write_result

HEADLINE, BASE = "32a4m4l", "2a1m1l"
OTHERS = ("4a1m1l", "8a1m1l", "8a2m2l", "16a2m2l", "4a8m1l")
FIRST_UPDATE_S, FIRST_UPDATE_BASE_S, MEMORY_GIB, RATIO = 30.0, 15.0, 4.0, 0.95


def measure(topology: str, seconds: float, warmup: float, tag: str) -> dict:
    run_dir = ROOT / "runs" / f"bench_headline_{topology}_{tag}"
    shutil.rmtree(run_dir, ignore_errors=True)
    records, wall = run_cli(["algo=impala", "env=pong", f"topology={topology}",
                             f"run.max_wall_s={seconds}", "run.report_every_s=5"],
                            run_dir, timeout_s=seconds + 300)
    first = next((r["first_update_s"] for r in records if "first_update_s" in r), None)
    return {"topology": topology, "consumed_per_s": steady_consumed_rate(records, warmup),
            "first_update_s": first,
            "resident_gib_peak": max(r.get("resident_gib", 0.0) for r in records),
            "processes": records[-1].get("processes"), "env_steps": records[-1]["env_steps"],
            "updates": records[-1]["updates"], "process_wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=150.0, help="wall budget of each run")
    parser.add_argument("--others", type=float, default=60.0,
                        help="wall budget of each other shipped topology (0: skip them)")
    parser.add_argument("--warmup", type=float, default=45.0,
                        help="loop seconds left out of the steady-state rate")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()

    pairs = []
    for r in range(args.rounds):  # alternating, so drift on the machine hits both alike
        order = (HEADLINE, BASE) if r % 2 == 0 else (BASE, HEADLINE)
        runs = {t: measure(t, args.seconds, args.warmup, f"r{r}") for t in order}
        runs["ratio"] = runs[HEADLINE]["consumed_per_s"] / runs[BASE]["consumed_per_s"]
        pairs.append(runs)
        print(f"round {r}: ratio {runs['ratio']:.3f}", flush=True)
    others = [measure(t, args.others, min(args.warmup, args.others / 2), "once")
              for t in OTHERS] if args.others else []

    ratio = statistics.median(p["ratio"] for p in pairs)
    firsts = {p[t]["topology"]: p[t]["first_update_s"] for p in pairs for t in (HEADLINE, BASE)}
    every_first = [p[t]["first_update_s"] for p in pairs for t in (HEADLINE, BASE)]
    every_first += [o["first_update_s"] for o in others]
    memory = max(p[HEADLINE]["resident_gib_peak"] for p in pairs)
    result = {
        "command": "python -m walle_ray algo=impala env=pong topology=<T> "
                   f"run.max_wall_s={args.seconds:g}",
        "rounds": pairs, "others": others,
        "ratio_median": ratio,
        "first_update_s_max": max(f for f in every_first if f is not None)
        if all(f is not None for f in every_first) else None,
        "first_update_s_2a1m1l_max": max(p[BASE]["first_update_s"] for p in pairs),
        "resident_gib_32a4m4l_max": memory,
        "targets": {"first_update_s": FIRST_UPDATE_S, "first_update_s_2a1m1l": FIRST_UPDATE_BASE_S,
                    "resident_gib_32a4m4l": MEMORY_GIB, "ratio": RATIO},
        "settings": vars(args),
    }
    result["met"] = {
        "ratio": ratio >= RATIO,
        "first_update": result["first_update_s_max"] is not None
        and result["first_update_s_max"] <= FIRST_UPDATE_S,
        "first_update_2a1m1l": result["first_update_s_2a1m1l_max"] <= FIRST_UPDATE_BASE_S,
        "memory": memory < MEMORY_GIB,
    }
    print(f"32a4m4l / 2a1m1l steady-state ratio {ratio:.3f} (median of {len(pairs)}); first "
          f"updates {firsts}; 32a4m4l peak {memory:.2f} GiB", flush=True)
    write_result("headline", result, args.dry_run)


if __name__ == "__main__":
    main()

"""The headline as typed: ``python -m walle_ray algo=impala env=pong topology=T``, to 17.

    python benchmarks/headline_learning.py [--seeds 0 1 2] [--others 2a1m1l 8a1m1l 16a2m2l]
                                           [--other-seed N [N ...]] [--minutes 25] [--reuse]

Runs ``32a4m4l`` with each seed of ``--seeds`` and each of ``--others`` with the first seed
(or each seed of ``--other-seed``; ``--seeds`` with no seed runs only the others),
nothing on the line but the topology and the seed besides ``run.stop_at_return=17`` and a
wall budget, which stop the run and change nothing it learns. The minutes, agent steps and
core-hours to 17 are the run's own (``run.milestones``: minutes since the command started).
``--reuse`` reads the runs already in ``runs/bench_headline_<topology>_s<seed>``.

Writes benchmarks/results/headline_learning.json and .png (return against agent steps and
against wall minutes), with each topology's median minutes where it has three seeds or
more. Targets: ``32a4m4l`` at 17 within 15 minutes (median of the seeds); every other
topology within 1.25x of the fastest; all curves within each other's spread.
"""

from __future__ import annotations

import argparse
import statistics

from common import RESULTS, ROOT, plot_curves, score_run, write_result

TARGET = 17.0
MINUTES = 15.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2],
                   help="seeds of 32a4m4l (none: only --others, with --other-seed)")
    p.add_argument("--other-seed", type=int, nargs="+", default=None,
                   help="the other topologies' seeds (default: the first of --seeds, or 0)")
    p.add_argument("--others", nargs="*", default=["2a1m1l", "8a1m1l", "16a2m2l"])
    p.add_argument("--minutes", type=float, default=25.0, help="wall budget of each run")
    p.add_argument("--reuse", action="store_true", help="read runs already made")
    p.add_argument("--name", default="headline_learning")
    p.add_argument("--note", default=None,
                   help="how and when the runs were made, kept in the JSON's notes")
    args = p.parse_args()
    other_seeds = (args.other_seed if args.other_seed is not None
                   else args.seeds[:1] if args.seeds else [0])
    plan = ([("32a4m4l", seed) for seed in args.seeds]
            + [(t, seed) for t in args.others for seed in other_seeds])
    runs: dict[str, list[dict]] = {}
    for topology, seed in plan:
        run_dir = ROOT / "runs" / f"bench_headline_{topology}_s{seed}"
        overrides = ["algo=impala", "env=pong", f"topology={topology}"]
        if seed:
            overrides.append(f"run.seed={seed}")
        result = score_run(run_dir, overrides, TARGET, args.minutes, reuse=args.reuse)
        result.update(topology=topology, seed=seed)
        runs.setdefault(topology, []).append(result)
        print(topology, seed, result["minutes_to_target"], result["agent_steps_to_target"], flush=True)
    plot_curves(runs, TARGET, "python -m walle_ray algo=impala env=pong topology=T, as typed, "
                              "2 CPU cores", RESULTS / f"{args.name}.png", midpoints=True)
    headline = [r["minutes_to_target"] for r in runs.get("32a4m4l", [])]
    median = (statistics.median(headline) if headline and None not in headline else None)
    fastest = min((r["minutes_to_target"] for rs in runs.values() for r in rs
                   if r["minutes_to_target"] is not None), default=None)
    # With three or more seeds of a topology, its median; a run that missed 17 counts as
    # slower than any that reached it.
    medians = {t: statistics.median(r["minutes_to_target"] if r["minutes_to_target"] is not None
                                    else float("inf") for r in rs)
               for t, rs in runs.items() if len(rs) >= 3}
    fastest_median = min(medians.values(), default=None)
    write_result(args.name, {
        "command": "python benchmarks/headline_learning.py --seeds "
                   + " ".join(map(str, args.seeds)) + " --others " + " ".join(args.others)
                   + ("" if args.other_seed is None
                      else " --other-seed " + " ".join(map(str, args.other_seed)))
                   + f" --minutes {args.minutes:g}" + (" --reuse" if args.reuse else "")
                   + (f" --name {args.name}" if args.name != "headline_learning" else "")
                   + (' --note "<notes>"' if args.note else ""),
        "target": {"return": TARGET, "minutes_32a4m4l_median": MINUTES,
                   "others_within_of_fastest": 1.25},
        "median_minutes_32a4m4l": median,
        "met_target": median is not None and median <= MINUTES,
        "ratio_to_fastest": {t: [None if r["minutes_to_target"] is None or fastest is None
                                 else r["minutes_to_target"] / fastest for r in rs]
                             for t, rs in runs.items()},
        "median_minutes": {t: m if m != float("inf") else None for t, m in medians.items()},
        "median_ratio_to_fastest_median": {
            t: m / fastest_median if m != float("inf") else None for t, m in medians.items()},
        "runs": [r for rs in runs.values() for r in rs],
        **({"notes": args.note} if args.note else {}),
    })


if __name__ == "__main__":
    main()

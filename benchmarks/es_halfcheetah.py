"""ES on HalfCheetah-v5: return against wall-clock time, and how collection scales with samplers.

    python benchmarks/es_halfcheetah.py [--minutes 60] [--speedup-seconds 120] [--skip-curve|--skip-speedup]

- Curve: ``python -m walle_ray algo=es env=halfcheetah topology=8a1m1l`` (the preset's
  settings: 32 antithetic pairs per iteration, sigma 0.02, Adam 0.01, weight decay 0.005)
  for ``--minutes`` of wall time. Writes benchmarks/results/es_halfcheetah.json and .png.
- Speedup: the same run with 1, 2, 4 and 8 samplers, each for ``--speedup-seconds``; the env
  steps per second of collection (the iterations' env steps over their collect time) against
  one sampler's. ES is as parallel as an algorithm gets (whole episodes, only returns
  travel); on these 2 cores the speedup is bounded by the cores, and the figure says how
  much of the ideal min(n, cores) is left.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from common import ROOT, learning_run, run_cli, write_result

BASE = ["algo=es", "env=halfcheetah"]


def collection_rate(samplers: int, seconds: float) -> dict:
    run_dir = ROOT / "runs" / f"bench_es_speedup_{samplers}a"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [*BASE, f"topology={samplers}a1m1l", f"run.max_wall_s={seconds}",
                 "run.report_every_s=5"]
    records, _ = run_cli(overrides, run_dir, timeout_s=seconds + 300)
    iterations = [r for r in records if r.get("collect_s")]
    steps = sum(r["env_steps_per_s"] * r["iter_s"] for r in iterations)
    collect_s = sum(r["collect_s"] for r in iterations)
    return {"samplers": samplers, "command": "python -m walle_ray " + " ".join(overrides),
            "iterations": len(iterations), "env_steps": steps, "collect_s": collect_s,
            "collect_env_steps_per_s": steps / collect_s if collect_s else None,
            "collect_share": collect_s / sum(r["iter_s"] for r in iterations) if iterations else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--speedup-seconds", type=float, default=120.0)
    p.add_argument("--skip-curve", action="store_true")
    p.add_argument("--skip-speedup", action="store_true")
    p.add_argument("--from-run", type=Path, help="make the curve's result from this run "
                   "directory (e.g. one stopped by hand) instead of training")
    args = p.parse_args()
    if not args.skip_speedup:
        speedup(args.speedup_seconds)
    if not args.skip_curve:
        learning_run("es_halfcheetah", [*BASE, "topology=8a1m1l"], target=float("inf"),
                     minutes=args.minutes, title="ES HalfCheetah-v5 8a1m1l, 2 CPU cores",
                     from_run=args.from_run)


def speedup(seconds: float) -> None:
    rates = [collection_rate(n, seconds) for n in (1, 2, 4, 8)]
    one = rates[0]["collect_env_steps_per_s"]
    cores = len(os.sched_getaffinity(0))
    for r in rates:
        r["speedup"] = r["collect_env_steps_per_s"] / one
        r["of_ideal"] = r["speedup"] / min(r["samplers"], cores)
    write_result("es_halfcheetah_speedup", {"cores": cores, "rates": rates})
    for r in rates:
        print(f"{r['samplers']} samplers: {r['collect_env_steps_per_s']:.0f} env steps/s collecting, "
              f"speedup {r['speedup']:.2f} ({r['of_ideal']:.0%} of min(n, {cores} cores))", flush=True)


if __name__ == "__main__":
    main()

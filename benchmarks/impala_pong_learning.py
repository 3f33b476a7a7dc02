"""IMPALA on Pong: minutes and agent steps to a mean score of 17, on this machine.

    python benchmarks/impala_pong_learning.py [--minutes 60] [--topology 1a1m1l] [--obs-size 42]

One run of ``python -m walle_ray algo=impala env=pong`` with the preset's settings (20-step
unrolls, batches of 32, RMSProp), stopped when the mean of the last 20 episodes reaches 17
or after ``--minutes``. Writes benchmarks/results/impala_pong_learning.json (the curve, the
time and agent steps to 17, or the best score reached) and .png (return over wall-clock
minutes). Target: 17 within 60 minutes on 2 CPU cores, no GPU.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

from common import RESULTS, ROOT, run_cli, write_result

TARGET, TARGET_MINUTES = 17.0, 60


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--minutes", type=float, default=TARGET_MINUTES)
    p.add_argument("--topology", default="1a1m1l")  # the fastest on 2 cores (impala_pong_throughput)
    p.add_argument("--obs-size", type=int, default=42)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    run_dir = ROOT / "runs" / "bench_impala_pong_learning"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = ["algo=impala", "env=pong", f"env.obs_size={args.obs_size}",
                 f"topology={args.topology}", f"run.max_wall_s={args.minutes * 60}",
                 f"run.stop_at_return={TARGET}", f"run.seed={args.seed}", "run.report_every_s=15"]
    records, wall = run_cli(overrides, run_dir, timeout_s=args.minutes * 60 + 600)
    reached = next((r for r in records if r["return"] is not None and r["return"] >= TARGET), None)
    best = max((r["return"] for r in records if r["return"] is not None), default=None)
    RESULTS.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "walle_ray.plot", str(run_dir), "--x", "wall_s",
                    "--title", f"IMPALA Pong {args.obs_size}x{args.obs_size} {args.topology}, 2 CPU cores",
                    "-o", str(RESULTS / "impala_pong_learning.png")], cwd=ROOT, check=True)
    last = records[-1]
    write_result("impala_pong_learning", {
        "command": "python -m walle_ray " + " ".join(overrides),
        "target": {"return": TARGET, "minutes": TARGET_MINUTES},
        "reached_target": reached is not None,
        "minutes_to_target": reached["wall_s"] / 60 if reached else None,
        "agent_steps_to_target": reached["env_steps"] if reached else None,
        "best_return": best, "final_return": last["return"],
        "agent_steps": last["env_steps"], "wall_s_training": last["wall_s"],
        "wall_s_total_process": wall, "updates": last["updates"],
        "agent_steps_per_s": last["env_steps"] / last["wall_s"],
        "curve": [{"wall_s": r["wall_s"], "env_steps": r["env_steps"], "return": r["return"]}
                  for r in records],
        "met_target": reached is not None and reached["wall_s"] <= TARGET_MINUTES * 60,
    })


if __name__ == "__main__":
    main()

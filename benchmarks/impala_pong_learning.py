"""IMPALA on Pong: minutes and agent steps to a mean score of 17, on this machine.

    python benchmarks/impala_pong_learning.py [--minutes 60] [--topology 2a1m1l] [--obs-size 42]
    python benchmarks/impala_pong_learning.py --topology 32a4m4l --name headline_learning [key=value ...]

One run of ``python -m walle_ray algo=impala env=pong`` with the preset's settings (20-step
unrolls, batches of 8, RMSProp), stopped when the mean of the last 20 episodes reaches 17
or after ``--minutes``. Writes benchmarks/results/<name>.json (the curve, the time and
agent steps to 17, or the best score reached, and the run's bottleneck report) and
<name>.png (return over wall-clock minutes); ``--name headline_learning`` is the headline
command's learning benchmark. Target: 17 within 60 minutes on 2 CPU cores, no GPU.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import learning_run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--minutes", type=float, default=60)
    p.add_argument("--topology", default="2a1m1l")  # the fastest with batches of 8 on 2 cores
    p.add_argument("--obs-size", type=int, default=42)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="impala_pong_learning", help="result file name")
    p.add_argument("overrides", nargs="*", help="more key=value settings for the run")
    p.add_argument("--from-run", type=Path, help="make the result from this run directory "
                   "(e.g. one stopped by hand) instead of training")
    args = p.parse_args()
    learning_run(args.name,
                 ["algo=impala", "env=pong", f"env.obs_size={args.obs_size}",
                  f"topology={args.topology}", f"run.seed={args.seed}", *args.overrides],
                 target=17.0, minutes=args.minutes, from_run=args.from_run,
                 title=f"IMPALA Pong {args.obs_size}x{args.obs_size} {args.topology}"
                       + "".join(f" {o}" for o in args.overrides) + ", 2 CPU cores")


if __name__ == "__main__":
    main()

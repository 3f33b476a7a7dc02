"""IMPALA with its default settings on envs that have no preset, as a user's own env would run.

    python benchmarks/impala_defaults.py [--env acrobot|hopper] [--minutes M] [--seed 0]

One run of ``python -m walle_ray algo=impala <env> ~preset`` on the default ``2a1m1l``,
stopped when the mean of the last 20 episodes reaches the target or after ``--minutes``.
``~preset`` keeps any preset out, so the run sees ``IMPALAConfig``'s defaults alone.
Targets: Acrobot-v1 -100 (gymnasium's solved threshold) within 5 minutes; Hopper-v5 1000
within 15 minutes. Writes benchmarks/results/impala_defaults_<env>.json and .png.
"""

from __future__ import annotations

import argparse

from common import learning_run

ENVS = {  # overrides, target return, minutes, env steps
    "acrobot": (["env.id=Acrobot-v1", "env.name=acrobot"], -100.0, 5.0, 2_000_000),
    "hopper": (["env=hopper"], 1000.0, 15.0, 5_000_000),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env", choices=sorted(ENVS), default="acrobot")
    p.add_argument("--minutes", type=float, default=None, help="default: the env's target")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    overrides, target, minutes, steps = ENVS[args.env]
    learning_run(f"impala_defaults_{args.env}",
                 ["algo=impala", *overrides, "~preset", f"run.total_env_steps={steps}",
                  f"run.seed={args.seed}"],
                 target=target, minutes=args.minutes or minutes,
                 title=f"IMPALA defaults, {args.env}, 2a1m1l, 2 CPU cores")


if __name__ == "__main__":
    main()

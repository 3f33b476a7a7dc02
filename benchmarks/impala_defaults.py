"""IMPALA with its default settings on envs that have no preset, as a user's own env would run.

    python benchmarks/impala_defaults.py [--env acrobot|hopper] [--minutes M] [--seeds 0 1 2]

One run per seed of ``python -m walle_ray algo=impala <env> ~preset`` on the default
``2a1m1l``, stopped when the mean of the last 20 episodes reaches the target or after
``--minutes``. ``~preset`` keeps any preset out, so the run sees ``IMPALAConfig``'s defaults
alone. Targets: Acrobot-v1 -100 (gymnasium's solved threshold) within 5 minutes; Hopper-v5
1000 within 15 minutes. Writes benchmarks/results/impala_defaults_<env>_seed<S>.json and
.png per seed, and impala_defaults_<env>.json: which seeds reached the target, and when.
"""

from __future__ import annotations

import argparse

from common import learning_run, write_result

ENVS = {  # overrides, target return, minutes, env steps
    "acrobot": (["env.id=Acrobot-v1", "env.name=acrobot"], -100.0, 5.0, 2_000_000),
    "hopper": (["env=hopper"], 1000.0, 15.0, 5_000_000),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env", choices=sorted(ENVS), default="acrobot")
    p.add_argument("--minutes", type=float, default=None, help="default: the env's target")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = p.parse_args()
    overrides, target, minutes, steps = ENVS[args.env]
    minutes = args.minutes or minutes
    runs = []
    for seed in args.seeds:
        result = learning_run(f"impala_defaults_{args.env}_seed{seed}",
                              ["algo=impala", *overrides, "~preset", f"run.total_env_steps={steps}",
                               f"run.seed={seed}"],
                              target=target, minutes=minutes,
                              title=f"IMPALA defaults, {args.env} seed {seed}, 2a1m1l, 2 CPU cores")
        runs.append({"seed": seed, **{k: result[k] for k in (
            "met_target", "minutes_to_target", "agent_steps_to_target", "best_return", "agent_steps")}})
    write_result(f"impala_defaults_{args.env}", {
        "command": "python benchmarks/impala_defaults.py --env {} --seeds {}".format(
            args.env, " ".join(map(str, args.seeds))),
        "target": {"return": target, "minutes": minutes},
        "seeds_met": sum(r["met_target"] for r in runs), "runs": runs})


if __name__ == "__main__":
    main()

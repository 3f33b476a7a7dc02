"""IMPALA Pong: agent steps and wall minutes to a mean score of 17, for the settings tried.

    python benchmarks/pong_sample_efficiency.py [--arms preset,queue_only,...] [--seeds 0 1 2]
                                                [--minutes 25] [--reuse]

Each arm is ``python -m walle_ray algo=impala env=pong topology=2a1m1l`` with its own
settings over the shipped preset's; ``preset`` is the preset as it ships, run with every
seed of ``--seeds``, the other arms with the first seed only. A run stops at 17 (the mean of
the last 20 games) or after ``--minutes``. ``--reuse`` reads the runs already in
``runs/bench_pong_se_<arm>_s<seed>`` instead of training them again.

Writes benchmarks/results/pong_sample_efficiency.json (per run: the agent steps, wall minutes
since the command started and core-hours to 17, its curve and the run's closing report) and
.png (return against agent steps and against wall minutes). Goal: at most 2M agent steps to 17.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from common import RESULTS, ROOT, plot_curves, score_run, write_result

BASE = ["algo=impala", "env=pong", "topology=2a1m1l"]
QUEUE_ONLY = "algo.replay=[{type: queue, ratio: 1.0}]"
ARMS = {
    # What the preset ships (conf/preset/impala_pong.yaml).
    "preset": [],
    # The preset before: 8 rows of 20 steps per update, all fresh.
    "queue_only": [QUEUE_ONLY, "algo.batch_size=8", "algo.clear_policy_coef=0",
                   "algo.clear_value_coef=0"],
    # Half of each batch of 16 replayed from 2000 rows, with CLEAR's cloning losses.
    "replay_half_b16": ["algo.batch_size=16",
                        "algo.replay=[{type: queue, ratio: 0.5}, {type: uniform, ratio: 0.5, capacity: 2000}]"],
    # A quarter of each batch of 8 fresh, three quarters replayed from 2000 rows, or from
    # 1000 (as old as the preset's 2000 at half fresh): fewer env steps per update.
    "replay_three_quarters": ["algo.replay=[{type: queue, ratio: 0.25}, "
                              "{type: uniform, ratio: 0.75, capacity: 2000}]"],
    "replay_three_quarters_1000": ["algo.replay=[{type: queue, ratio: 0.25}, "
                                   "{type: uniform, ratio: 0.75, capacity: 1000}]"],
    # The same with elite replay (the seed's ln_norm, 5 steps per row ranked).
    "elite_half": ["algo.replay=[{type: queue, ratio: 0.5}, {type: elite, ratio: 0.5, "
                   "capacity: 2000, lambda_batch_multiplier: 6, alpha_annealing_factor: 2.0, steps: 5}]"],
    # LASER's trust region on the preset's replay.
    "laser": ["algo.laser_kl_threshold=0.3"],
    # Twice the preset's learning rate.
    "lr_double": ["algo.lr=1.4e-3"],
    # The preset with a recurrent core, as a user adds one (frames still stacked by 4).
    "lstm": ["model.core=lstm"],
}
TARGET = 17.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--arms", default="preset,queue_only,replay_half_b16")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--minutes", type=float, default=25.0)
    p.add_argument("--reuse", action="store_true", help="read runs already made")
    p.add_argument("--name", default="pong_sample_efficiency")
    p.add_argument("--result", action="append", default=[], metavar="LABEL=JSON",
                   help="also show an earlier learning benchmark's curve (e.g. impala_pong_learning)")
    p.add_argument("--run", action="append", default=[], metavar="LABEL=RUN_DIR",
                   help="also read a run made elsewhere (e.g. headline_learning's), under LABEL")
    args = p.parse_args()
    runs: dict[str, list[dict]] = {}
    for entry in args.result:
        label, path = entry.split("=", 1)
        earlier = json.loads(Path(path).read_text())
        runs.setdefault(label, []).append({
            "arm": label, "from_result": path, "command": earlier["command"],
            "machine": earlier["machine"], "reached": earlier["reached_target"],
            "minutes_to_target": earlier["minutes_to_target"],
            "agent_steps_to_target": earlier["agent_steps_to_target"],
            "agent_steps_per_s": earlier["agent_steps_per_s"], "curve": earlier["curve"]})
    for entry in args.run:
        label, run_dir = entry.split("=", 1)
        result = score_run(Path(run_dir), [], TARGET, args.minutes, reuse=True)
        result.update(arm=label, run_dir=run_dir)
        runs.setdefault(label, []).append(result)
    for arm in (a for a in args.arms.split(",") if a):
        seeds = args.seeds if arm == "preset" else args.seeds[:1]
        for seed in seeds:
            run_dir = ROOT / "runs" / f"bench_pong_se_{arm}_s{seed}"
            result = score_run(run_dir, [*BASE, *ARMS[arm], f"run.seed={seed}"], TARGET,
                               args.minutes, reuse=args.reuse)
            result.update(arm=arm, seed=seed)
            runs.setdefault(arm, []).append(result)
            print(arm, seed, result["agent_steps_to_target"], result["minutes_to_target"], flush=True)
    plot_curves(runs, TARGET, "IMPALA Pong on 2 CPU cores: the settings tried (2a1m1l unless named)",
                RESULTS / f"{args.name}.png")
    write_result(args.name, {
        "command": "python benchmarks/pong_sample_efficiency.py " + shlex.join(sys.argv[1:]),
        "target": {"return": TARGET, "agent_steps": 2_000_000},
        "arms": {arm: ARMS.get(arm, "read from --run") for arm in runs},
        "runs": [r for results in runs.values() for r in results],
    })


if __name__ == "__main__":
    main()

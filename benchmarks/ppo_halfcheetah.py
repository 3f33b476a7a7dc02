"""PPO on HalfCheetah-v5 with 8 samplers (the WALL-E experiment): return at 1M env steps.

    python benchmarks/ppo_halfcheetah.py [--steps 1000000] [--topology 8a1m1l] [--preset P]

Writes benchmarks/results/ppo_halfcheetah.json (with ``--preset ppo_halfcheetah_fast``:
ppo_halfcheetah_fast.json) with the curve, the training return at the
end (mean of the last 20 episodes), a greedy evaluation of the final policy, wall-clock
time and the collection/learning split. Target: at least 3000 at 1M steps.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from common import ROOT, run_cli, write_result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--topology", default="8a1m1l")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preset", default="ppo_halfcheetah", help="the preset it runs with")
    p.add_argument("--run-dir", type=Path, help="default: runs/bench_<preset>")
    args = p.parse_args()
    args.run_dir = args.run_dir or ROOT / "runs" / f"bench_{args.preset}"
    preset = [] if args.preset == "ppo_halfcheetah" else [f"preset={args.preset}"]
    metrics, wall = run_cli(["algo=ppo", "env=halfcheetah", *preset, f"topology={args.topology}",
                             f"run.total_env_steps={args.steps}", f"run.seed={args.seed}"],
                            args.run_dir, timeout_s=4 * 3600)
    ev = subprocess.run([sys.executable, "-m", "walle_ray", "mode=eval",
                         f"run.checkpoint={args.run_dir}", "eval.episodes=10",
                         f"hydra.run.dir={args.run_dir}/eval"],
                        cwd=ROOT, check=True, capture_output=True, text=True)
    print(ev.stdout)
    last = metrics[-1]
    collect = sum(m["collect_s"] for m in metrics)
    learn = sum(m["learn_s"] for m in metrics)
    write_result(args.preset, {
        "command": " ".join(["python -m walle_ray algo=ppo env=halfcheetah", *preset,
                             f"topology={args.topology}", f"run.total_env_steps={args.steps}"]),
        "target": {"return_at_1M_steps": 3000},
        "env_steps": last["env_steps"],
        "train_return_last20": last["return"],
        "eval_greedy_10_episodes": ev.stdout.strip().splitlines()[-1],
        "wall_s_total_process": wall,
        "wall_s_training": last["wall_s"],
        "collect_s": collect, "learn_s": learn,
        "collect_share": collect / (collect + learn),
        "env_steps_per_s": last["env_steps"] / last["wall_s"],
        "curve": [{"env_steps": m["env_steps"], "return": m["return"], "wall_s": m["wall_s"]}
                  for m in metrics[:: max(1, len(metrics) // 200)]],
        "met_target": (last["return"] or 0) >= 3000,
    })


if __name__ == "__main__":
    main()

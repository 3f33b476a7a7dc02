"""PPO on CartPole: wall-clock seconds and env steps until a mean return of 475.

    python benchmarks/ppo_cartpole.py [--seeds 3] [--topologies local 2a1m1l]

Runs ``python -m walle_ray algo=ppo env=cartpole topology=<t> run.seed=<s>`` per topology and
seed; the CartPole preset stops a run once the mean return of the last 20 episodes reaches
475. From the metrics it takes the first iteration that got there, and reports its training
wall time (the driver loop's clock, without Ray start-up), its env steps and the whole
process's wall time (start-up included), per seed and as medians per topology. Writes
benchmarks/results/ppo_cartpole.json.

Target: median training time under 10 s per topology. For reference, on this machine
Stable-Baselines3 PPO needs about 12 s and RLlib PPO about 18 s.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from common import ROOT, run_cli, write_result

NAME = "ppo_cartpole"
SOLVED = 475.0
WINDOW = 20  # episodes in the preset's mean return (run.return_window)
TARGET_S = 10.0
REFERENCE_S = {"stable_baselines3_ppo": 12.0, "rllib_ppo": 18.0}


def cli_args(topology: str, seed: int) -> list[str]:
    return ["algo=ppo", "env=cartpole", f"topology={topology}", f"run.seed={seed}"]


def first_solved(metrics: list[dict]) -> dict | None:
    """The first record whose windowed return reached ``SOLVED`` over a full window."""
    return next((m for m in metrics
                 if m["episodes"] >= WINDOW and (m["return"] or 0) >= SOLVED), None)


def run_one(topology: str, seed: int, run_dir: Path, timeout_s: float) -> dict:
    """One training run from a clean directory (metrics.jsonl is appended to, not replaced)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    row = {"topology": topology, "seed": seed,
           "command": shlex.join(["python", "-m", "walle_ray", *cli_args(topology, seed)])}
    try:
        metrics, process_s = run_cli(cli_args(topology, seed), run_dir, timeout_s=timeout_s)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        return {**row, "solved": False, "error": str(exc)}
    hit = first_solved(metrics)
    row.update(solved=hit is not None, process_wall_s=process_s,
               final_env_steps=metrics[-1]["env_steps"] if metrics else 0)
    if hit is not None:
        row.update(train_wall_s=hit["wall_s"], env_steps=hit["env_steps"],
                   iteration=hit["iteration"], solved_return=hit["return"])
    return row


def summarize(rows: list[dict]) -> dict:
    """Medians over seeds; a seed that never solved counts as infinitely slow."""
    def median(key: str) -> float | None:
        value = statistics.median(r.get(key, float("inf")) for r in rows)
        return None if value == float("inf") else value

    train_s = median("train_wall_s")
    return {"seeds": len(rows), "solved": sum(r["solved"] for r in rows),
            "median_train_wall_s": train_s, "median_env_steps": median("env_steps"),
            "median_process_wall_s": median("process_wall_s"),
            "met_target": train_s is not None and train_s < TARGET_S}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..n-1 per topology")
    p.add_argument("--topologies", nargs="+", default=["local", "2a1m1l"])
    p.add_argument("--timeout-s", type=float, default=600, help="limit per training run")
    p.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "bench_ppo_cartpole")
    p.add_argument("--dry-run", action="store_true", help="print the result instead of writing it")
    args = p.parse_args()

    per_run, per_topology = [], {}
    for topology in args.topologies:
        rows = [run_one(topology, seed, args.run_dir / f"{topology}_seed{seed}", args.timeout_s)
                for seed in range(args.seeds)]
        per_topology[topology] = summarize(rows)
        per_run += rows
        print(f"{topology}: {per_topology[topology]}", flush=True)

    result = {
        "command": shlex.join(["python", *sys.argv]),
        "target": {"median_train_wall_s_below": TARGET_S, "return": SOLVED,
                   "return_window_episodes": WINDOW},
        "reference_s": REFERENCE_S,
        "per_topology": per_topology,
        "runs": per_run,
        "met_target": all(s["met_target"] for s in per_topology.values()),
    }
    write_result(NAME, result, args.dry_run)


if __name__ == "__main__":
    main()

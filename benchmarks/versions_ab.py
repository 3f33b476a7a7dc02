"""Two versions of the code, measured alternately in one sitting: does a change move the figures?

    python benchmarks/versions_ab.py --baseline <commit> [--rounds 3] [--seconds 45]

Checks the baseline commit out into a temporary git worktree and, round after round, runs
each version's own ``python -m walle_ray`` (its tree first on PYTHONPATH, for the driver and
the Ray workers it starts) on three workloads:

- ``ppo_cartpole``: training seconds to a mean return of 475 (the preset's stop), in
  ``topology=local`` and ``2a1m1l``, seed = round;
- ``impala_pong``: agent steps/s consumed by the learner, Pong 42x42, ``2a1m1l``, batches of
  32 rows, over the records after the first (start-up left out), as
  ``impala_pong_throughput.py`` measures it;
- ``apex_cartpole``: env steps/s and updates/s of Ape-X DQN on CartPole, ``2a2m1l``, the same way;
- ``ppo_halfcheetah``: env steps/s of PPO on HalfCheetah with its preset, ``8a1m1l``, over the
  last three quarters of the run (the first iterations compile the step).

``--samplers-only`` measures instead one sampler in a plain process (``sampler_rate.py``),
the hot path alone, for Ape-X CartPole (n-step transitions), PPO CartPole and IMPALA Pong
42x42 (fragments).

Writes benchmarks/results/versions_ab.json (or ``--name``) with every run and the medians per
version. The machine drifts over minutes, so only alternated figures compare.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, write_result
from ppo_cartpole import first_solved


def run(tree: Path, args: list[str], run_dir: Path, timeout_s: float) -> list[dict]:
    """``python -m walle_ray`` of the code in ``tree``; returns its metrics records."""
    from walle_ray.logging.metrics import read_metrics

    shutil.rmtree(run_dir, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "walle_ray", *args, f"hydra.run.dir={run_dir}",
           "logger.progress=off"]
    print(f"$ ({tree.name}) {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, cwd=tree, env=env, check=True, timeout=timeout_s,
                   stdout=subprocess.DEVNULL)
    return read_metrics(run_dir / "metrics.jsonl")


def steady_rates(records: list[dict], *keys: str) -> dict:
    """Per-second rates of counters ``keys`` from the first record to the last."""
    first, last = records[0], records[-1]
    span = last["wall_s"] - first["wall_s"]
    return {f"{key}_per_s": (last[key] - first[key]) / span for key in keys}


def workloads(seed: int, seconds: float) -> dict:
    timed = [f"run.max_wall_s={seconds}", "run.report_every_s=5"]
    return {
        "ppo_cartpole_local": ["algo=ppo", "env=cartpole", "topology=local", f"run.seed={seed}"],
        "ppo_cartpole_2a1m1l": ["algo=ppo", "env=cartpole", "topology=2a1m1l", f"run.seed={seed}"],
        "impala_pong": ["algo=impala", "env=pong", "env.obs_size=42", "topology=2a1m1l",
                        "algo.batch_size=32", *timed],
        "apex_cartpole": ["algo=apex", "env=cartpole", "topology=2a2m1l", *timed],
        "ppo_halfcheetah": ["algo=ppo", "env=halfcheetah", "topology=8a1m1l", *timed],
    }


SAMPLERS = {"sampler_apex_cartpole": ["algo=apex", "env=cartpole"],
            "sampler_ppo_cartpole": ["algo=ppo", "env=cartpole"],
            "sampler_impala_pong": ["algo=impala", "env=pong", "env.obs_size=42"]}


def sampler_rate(tree: Path, overrides: list[str]) -> dict:
    """``sampler_rate.py`` (this version's script) run on the code in ``tree``."""
    import json

    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "sampler_rate.py"), *overrides]
    print(f"$ ({tree.name}) {' '.join(cmd[1:])}", flush=True)
    out = subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def figures(name: str, records: list[dict]) -> dict:
    if name == "ppo_halfcheetah":  # after the first iterations (the compiled step's first)
        return steady_rates(records[len(records) // 4:], "env_steps")
    if name.startswith("ppo_cartpole"):
        hit = first_solved(records)
        return {"train_wall_s": hit["wall_s"] if hit else None,
                "env_steps": hit["env_steps"] if hit else None}
    if name == "impala_pong":
        return steady_rates(records, "env_steps_consumed", "env_steps")
    return {**steady_rates(records, "env_steps", "updates"), "return": records[-1]["return"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--baseline", required=True, help="the commit to compare the working tree with")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=45.0)
    p.add_argument("--name", default="versions_ab")
    p.add_argument("--samplers-only", action="store_true")
    p.add_argument("--workloads", nargs="*", help="only these of the workloads (default: all)")
    args = p.parse_args()
    chosen = lambda loads: {k: v for k, v in loads.items()  # noqa: E731
                            if not args.workloads or k in args.workloads}
    base = Path(tempfile.mkdtemp(prefix="walle_ab_")) / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=ROOT,
                   check=True)
    baseline = subprocess.run(["git", "rev-parse", "--short", args.baseline], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    trees = {"baseline": base, "current": ROOT}
    runs = []
    try:
        for r in range(args.rounds):
            loads = chosen(SAMPLERS if args.samplers_only else workloads(r, args.seconds))
            for name, cli in loads.items():
                for version, tree in trees.items():
                    t0 = time.perf_counter()
                    if args.samplers_only:
                        got = sampler_rate(tree, cli)
                    else:
                        run_dir = Path(tempfile.gettempdir()) / f"walle_ab_{version}_{name}"
                        got = figures(name, run(tree, cli, run_dir, timeout_s=args.seconds + 600))
                    runs.append({"round": r, "workload": name, "version": version,
                                 "process_wall_s": time.perf_counter() - t0, **got})
                    print(runs[-1], flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT)
    medians = {}
    for name in chosen(SAMPLERS if args.samplers_only else workloads(0, args.seconds)):
        for version in trees:
            mine = [x for x in runs if x["workload"] == name and x["version"] == version]
            keys = [k for k in mine[0] if k not in ("round", "workload", "version")]
            medians.setdefault(name, {})[version] = {
                k: statistics.median(v) if (v := [x[k] for x in mine if x[k] is not None]) else None
                for k in keys}
    # Per round, current over baseline: the machine's drift cancels within a round.
    ratios = {}
    for name in medians:
        for key in ("env_steps_per_s", "env_steps_consumed_per_s", "train_wall_s"):
            pairs = [(b[key], c[key]) for r in range(args.rounds)
                     for b in runs if b["round"] == r and b["workload"] == name
                     and b["version"] == "baseline" and b.get(key)
                     for c in runs if c["round"] == r and c["workload"] == name
                     and c["version"] == "current" and c.get(key)]
            if pairs:
                ratios.setdefault(name, {})[key] = statistics.median(c / b for b, c in pairs)
    write_result(args.name, {
        "command": f"python benchmarks/versions_ab.py --baseline {args.baseline} "
                   f"--rounds {args.rounds} --seconds {args.seconds:g}"
                   + (f" --samplers-only --name {args.name}" if args.samplers_only else "")
                   + (f" --workloads {' '.join(args.workloads)}" if args.workloads else "")
                   + (f" --name {args.name}" if args.name != "versions_ab" and not args.samplers_only
                      else ""),
        "baseline_commit": baseline, "medians": medians,
        "median_ratio_current_to_baseline": ratios, "runs": runs})


if __name__ == "__main__":
    main()

"""IMPALA on Pong: agent steps/s consumed by the learner, end to end, by sampler count.

    python benchmarks/impala_pong_throughput.py [--samplers 1 2 4 8] [--sizes 42 84] [--seconds 60]
                                                [--batch-size 32]

Each point is a real run of ``python -m walle_ray algo=impala env=pong env.obs_size=S
topology=<N>a1m1l`` for a fixed wall-clock budget, with the preset's settings except the
learner batch (``--batch-size``: 32 rows, the IMPALA paper's, by default; the Pong preset
learns with 8, which trades throughput for updates); the rate is the learner's consumed agent
steps over the records after the first (start-up excluded). Writes
benchmarks/results/impala_pong_throughput.json and .png (EasyRL's throughput-vs-actors
plot). Target: 42x42 at least 2500 agent steps/s end to end on 2 cores.
"""

from __future__ import annotations

import argparse
import shutil

from common import RESULTS, ROOT, run_cli, write_result

TARGET_42 = 2500


def measure(size: int, samplers: int, seconds: float, batch_size: int) -> dict:
    run_dir = ROOT / "runs" / f"bench_impala_pong_{size}_{samplers}a"
    shutil.rmtree(run_dir, ignore_errors=True)
    records, wall = run_cli(["algo=impala", "env=pong", f"env.obs_size={size}",
                             f"topology={samplers}a1m1l", f"run.max_wall_s={seconds}",
                             f"algo.batch_size={batch_size}",
                             "run.report_every_s=5"], run_dir, timeout_s=seconds + 300)
    # Rates from the first record on, so actor start-up is left out.
    first, last = (records[0], records[-1]) if len(records) > 1 else (None, records[-1])
    base = first or {"wall_s": 0.0, "env_steps_consumed": 0, "env_steps": 0}
    span = last["wall_s"] - base["wall_s"]
    consumed = last["env_steps_consumed"] - base["env_steps_consumed"]
    sampled = last["env_steps"] - base["env_steps"]
    steady = records[1:] or records
    return {"obs_size": size, "samplers": samplers, "consumed_per_s": consumed / span,
            "sampled_per_s": sampled / span, "updates_per_s": sum(r["updates_per_s"] for r in steady) / len(steady),
            "policy_lag_mean": sum(r["policy_lag_mean"] or 0 for r in steady) / len(steady),
            "learner_busy": sum(r["learner_busy"] for r in steady) / len(steady),
            "dropped_fragments": records[-1]["dropped_fragments"], "process_wall_s": wall}


def plot(points: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for size in sorted({p["obs_size"] for p in points}):
        pts = [p for p in points if p["obs_size"] == size]
        ax.plot([p["samplers"] for p in pts], [p["consumed_per_s"] for p in pts], "o-",
                label=f"{size}x{size}")
    ax.axhline(TARGET_42, ls="--", c="gray", label="target (42x42)")
    ax.set_xlabel("samplers")
    ax.set_ylabel("agent steps/s consumed by the learner")
    ax.set_title("IMPALA Pong throughput, 2 CPU cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "impala_pong_throughput.png", dpi=100)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--samplers", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--sizes", type=int, nargs="+", default=[42, 84])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--batch-size", type=int, default=32, help="rows of 20 steps per learner batch")
    args = p.parse_args()
    points = [measure(size, n, args.seconds, args.batch_size)
              for size in args.sizes for n in args.samplers]
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(points)
    best_42 = max((p["consumed_per_s"] for p in points if p["obs_size"] == 42), default=0.0)
    write_result("impala_pong_throughput", {
        "command": "python benchmarks/impala_pong_throughput.py " + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()),
        "target": {"obs_42_consumed_per_s": TARGET_42},
        "references": {"ale_alone_2_threads": 6700, "conv42_training_samples_per_s": 10000,
                       "rllib_impala_pong_84_2_runners": 85},
        "points": points, "best_42_consumed_per_s": best_42, "met_target": best_42 >= TARGET_42,
    })


if __name__ == "__main__":
    main()

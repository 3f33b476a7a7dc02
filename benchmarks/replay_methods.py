"""Uniform, elite and attentive replay under IMPALA on Atari, at equal frames, on this machine.

    python benchmarks/replay_methods.py [--game breakout] [--seeds 2] [--agent-steps 500000]

The elite V-trace platform's setting: each learner batch half on-policy (``queue``) and half
replayed from a buffer of 1000 rows, the replay ``uniform``, ``elite`` (ln_norm, lambda 6,
alpha 2, the platform's example), ``elite_steps5`` (the same, its distances read 5 of each
row's 20 steps), ``elite_least_served`` (``elite_steps5`` with the platform's default
selection, strategy3, and its candidates drawn with repeats) or ``attentive`` (the same
settings as elite). IMPALA's Pong preset
(20-step unrolls, batches of 8, RMSProp) on 42x42 frames, ``topology=2a1m1l``, every arm for
the same agent-step budget (4 frames each), seeds alternating across the arms so that drift
on the machine hits all of them alike.

Records, per run, the return curve against agent steps and wall-clock time, the agent steps
sampled per second (the cost of ranking shows there: the learner and the samplers wait
while a memory ranks on these 2 cores), and the ranking's own statistics. Writes
benchmarks/results/replay_methods_<game>.json and .png (mean return of the seeds against
frames and against wall-clock minutes). Targets: elite at least matches uniform at equal
frames, and costs under 15% of its wall-clock throughput.
"""

from __future__ import annotations

import argparse
import shutil

import numpy as np

from common import RESULTS, ROOT, run_cli, write_result

GAMES = {"breakout": "ALE/Breakout-v5", "pong": "ALE/Pong-v5"}
RANKING = "capacity: 1000, dist_function: ln_norm, lambda_batch_multiplier: 6, alpha_annealing_factor: 2.0"
ARMS = {
    "uniform": "[{type: queue, ratio: 0.5}, {type: uniform, ratio: 0.5, capacity: 1000}]",
    "elite": f"[{{type: queue, ratio: 0.5}}, {{type: elite, ratio: 0.5, {RANKING}}}]",
    "attentive": f"[{{type: queue, ratio: 0.5}}, {{type: attentive, ratio: 0.5, {RANKING}}}]",
    # elite reading 5 of each row's 20 steps: a quarter of the encoding
    "elite_steps5": f"[{{type: queue, ratio: 0.5}}, {{type: elite, ratio: 0.5, {RANKING}, steps: 5}}]",
    # the platform's default selection (strategy3): rows served fewest first, candidates
    # drawn with repeats, reading 5 steps as elite_steps5 does
    "elite_least_served": f"[{{type: queue, ratio: 0.5}}, {{type: elite, ratio: 0.5, {RANKING}, "
                          "steps: 5, strategy: least_served, replacement: true}]",
}
WARMUP_S = 60.0  # loop seconds left out of the steady rate


def one_run(game: str, arm: str, seed: int, agent_steps: int, minutes_cap: float) -> dict:
    run_dir = ROOT / "runs" / f"bench_replay_{game}_{arm}_s{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = ["algo=impala", "env=pong", f"env.id={GAMES[game]}", f"env.name={game}",
                 "env.obs_size=42", "topology=2a1m1l", f"run.seed={seed}",
                 f"run.total_env_steps={agent_steps}", f"run.max_wall_s={minutes_cap * 60}",
                 "run.report_every_s=10", f"algo.replay={ARMS[arm]}",
                 # the arms compare replay alone: no CLEAR, as the Pong preset had none then
                 "algo.clear_policy_coef=0", "algo.clear_value_coef=0"]
    records, wall = run_cli(overrides, run_dir, timeout_s=minutes_cap * 60 + 300)
    last = records[-1]
    kind = arm.split("_")[0]
    ranked = {k.split("/", 2)[2]: v for k, v in last.items() if k.startswith("memory/0/")
              and k.split("/", 2)[2].startswith(kind)}
    shares = [r.get(f"memory/0/{kind}_rank_share") for r in records[:-1]]  # the last is partial
    base = next(r for r in records if r["wall_s"] >= WARMUP_S)
    shares = [s for s in shares if s is not None]
    return {"arm": arm, "seed": seed, "command": "python -m walle_ray " + " ".join(overrides),
            "agent_steps": last["env_steps"], "wall_s": last["wall_s"],
            "agent_steps_per_s": last["env_steps"] / last["wall_s"],
            "steady_agent_steps_per_s": (last["env_steps"] - base["env_steps"])
            / (last["wall_s"] - base["wall_s"]),
            "consumed_per_s": last["env_steps_consumed"] / last["wall_s"],
            "updates": last["updates"], "final_return": last["return"],
            "best_return": max((r["return"] for r in records if r["return"] is not None), default=None),
            "memory_rank_share_mean": float(np.mean(shares)) if shares else None,
            "ranking_last": ranked,
            "curve": [{"wall_s": r["wall_s"], "env_steps": r["env_steps"], "return": r["return"]}
                      for r in records if r["return"] is not None]}


def mean_curve(runs: list[dict], key: str, grid: np.ndarray) -> np.ndarray:
    """The seeds' returns interpolated on ``grid`` (of ``key``) and averaged."""
    ys = [np.interp(grid, [p[key] for p in r["curve"]], [p["return"] for p in r["curve"]],
                    left=np.nan, right=np.nan) for r in runs]
    return np.nanmean(ys, axis=0)


def plot(game: str, by_arm: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arm, runs in by_arm.items():
        steps = np.linspace(0, min(r["agent_steps"] for r in runs), 200)
        axes[0].plot(steps * 4 / 1e6, mean_curve(runs, "env_steps", steps), label=arm)
        wall = np.linspace(0, min(r["wall_s"] for r in runs), 200)
        axes[1].plot(wall / 60, mean_curve(runs, "wall_s", wall), label=arm)
    axes[0].set_xlabel("frames (millions)")
    axes[1].set_xlabel("wall-clock minutes")
    for ax in axes:
        ax.set_ylabel(f"mean return, {len(next(iter(by_arm.values())))} seeds")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"IMPALA {game} 42x42, 0.5 queue + 0.5 replay, 2a1m1l, 2 CPU cores")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def area(run: dict, upto: int) -> float:
    """The mean return over the run's agent steps up to ``upto``: the area under its curve,
    which compares learning speed at equal frames better than a last noisy point."""
    xs = np.array([p["env_steps"] for p in run["curve"]])
    ys = np.array([p["return"] for p in run["curve"]])
    grid = np.linspace(xs[0], upto, 100)
    return float(np.interp(grid, xs, ys).mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--game", choices=sorted(GAMES), default="breakout")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--agent-steps", type=int, default=500_000)
    p.add_argument("--minutes-cap", type=float, default=20.0, help="wall budget of each run")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--name", help="result file name (default replay_methods_<game>)")
    args = p.parse_args()
    runs = []
    for seed in range(args.seeds):
        order = args.arms if seed % 2 == 0 else args.arms[::-1]
        for arm in order:
            runs.append(one_run(args.game, arm, seed, args.agent_steps, args.minutes_cap))
            r = runs[-1]
            print(f"{arm} seed {seed}: {r['agent_steps_per_s']:.0f} agent steps/s, final return "
                  f"{r['final_return']}, best {r['best_return']}", flush=True)
    by_arm = {arm: [r for r in runs if r["arm"] == arm] for arm in args.arms}
    upto = min(r["agent_steps"] for r in runs)
    summary = {}
    for arm, arm_runs in by_arm.items():
        summary[arm] = {"agent_steps_per_s": float(np.mean([r["agent_steps_per_s"] for r in arm_runs])),
                        "steady_agent_steps_per_s": float(np.mean([r["steady_agent_steps_per_s"]
                                                                   for r in arm_runs])),
                        "mean_return_over_run": float(np.mean([area(r, upto) for r in arm_runs])),
                        "final_return": float(np.mean([r["final_return"] for r in arm_runs]))}
    if "uniform" in summary:
        base = summary["uniform"]
        for arm in summary:
            summary[arm]["throughput_vs_uniform"] = (summary[arm]["steady_agent_steps_per_s"]
                                                     / base["steady_agent_steps_per_s"])
            summary[arm]["wall_clock_cost"] = 1 - summary[arm]["throughput_vs_uniform"]
    name = args.name or f"replay_methods_{args.game}"
    plot(args.game, by_arm, RESULTS / f"{name}.png")
    met = {}
    for arm in ("elite", "elite_steps5", "elite_least_served"):
        if {"uniform", arm} <= set(summary):
            met[arm] = {"matches_uniform_at_equal_frames": summary[arm]["mean_return_over_run"]
                        >= summary["uniform"]["mean_return_over_run"],
                        "wall_clock_cost_under_15pct": summary[arm]["wall_clock_cost"] < 0.15}
    write_result(name, {"game": args.game, "agent_steps_budget": args.agent_steps,
                        "seeds": args.seeds, "summary": summary, "targets": met, "runs": runs})
    for arm, s in summary.items():
        print(f"{arm}: {s}", flush=True)


if __name__ == "__main__":
    main()

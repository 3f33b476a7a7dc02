"""What action masks buy: return against env steps with and without the mask, and walle_ray's
masked PPO against sb3-contrib's MaskablePPO.

    python benchmarks/action_masking.py [--envs othello taxi] [--algos ppo impala dqn] [--reuse]
    pip install -e '.[peers]'      # sb3-contrib, for the comparison
    python benchmarks/action_masking.py --vs-maskable [--rounds 2]

Curves: each algorithm on each env, as a user types it (``algo=A env=E``, the shipped
presets), once with the env's mask (``env.action_mask=auto``: Othello's in the
observation, Taxi's in ``info``) and once without (``env.action_mask=none``), for a fixed
budget of env steps and minutes. Without the mask an illegal Othello move loses the game (the
policy still sees the mask's columns in its observation), and a Taxi pick-up or drop-off
where none is possible costs -10.

``--vs-maskable``: walle_ray's PPO on Othello (``algo=ppo env=othello``, the preset)
against sb3-contrib's MaskablePPO with the same settings (envs, steps per batch, minibatch,
epochs, learning rate, discount, GAE, 64x64 tanh), alternating which runs first, each in a
process of its own, both to the same mean return (the last 20 episodes). Time counts from
each library's training loop start; the whole process is recorded too.

Writes benchmarks/results/action_masking.json and .png (curves), and
action_masking_vs_maskable_ppo.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS, ROOT, first_reaching, write_result

ENVS = {  # env option -> how long each curve runs and the return to reach
    "othello": {"env_id": "walle/Othello-v0", "steps": {"ppo": 1_000_000, "impala": 3_000_000,
                                                        "dqn": 1_000_000},
                "target": 0.5},
    "taxi": {"env_id": "Taxi-v4", "steps": {"ppo": 1_000_000, "impala": 3_000_000,
                                            "dqn": 1_000_000},
             "target": 7.0},
}
MINUTES = 2.5  # wall budget of each curve (the steps above are rarely reached first)


def run_walle(env: str, algo: str, mask: str, steps: int, tag: str,
              extra: tuple[str, ...] = (), reuse: bool = False) -> dict:
    """One run (with ``reuse``, the one already in its directory, when there is one)."""
    from walle_ray.logging.metrics import read_metrics

    run_dir = ROOT / "runs" / f"bench_mask_{env}_{algo}_{mask}{tag}"
    args = [f"algo={algo}", f"env={env}", f"env.action_mask={mask}",
            f"run.total_env_steps={steps}", f"run.max_wall_s={MINUTES * 60}",
            "run.report_every_s=2", *extra]
    process_s = None
    if not (reuse and (run_dir / "metrics.jsonl").is_file()):
        shutil.rmtree(run_dir, ignore_errors=True)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "walle_ray", *args, f"hydra.run.dir={run_dir}",
                        "logger.progress=line", "logger.print_every_s=30"], cwd=ROOT, check=True)
        process_s = time.perf_counter() - t0
    curve = [{"wall_s": r["wall_s"], "env_steps": r["env_steps"], "return": r["return"]}
             for r in read_metrics(run_dir / "metrics.jsonl")]
    return {"command": "python -m walle_ray " + " ".join(args), "process_s": process_s,
            "curve": curve}


def summary(run: dict, target: float) -> dict:
    curve = run["curve"]
    reached = first_reaching(curve, target)
    returns = [p["return"] for p in curve if p["return"] is not None]
    last = curve[-1]
    run.update(seconds_to_target=reached["wall_s"] if reached else None,
               env_steps_to_target=reached["env_steps"] if reached else None,
               final_return=returns[-1] if returns else None,
               best_return=max(returns) if returns else None,
               env_steps=last["env_steps"], wall_s=last["wall_s"],
               env_steps_per_s=last["env_steps"] / last["wall_s"] if last["wall_s"] else None)
    return run


def curves(envs: list[str], algos: list[str], reuse: bool) -> None:
    results = {}
    for env in envs:
        spec = ENVS[env]
        for algo in algos:
            for mask in ("auto", "none"):
                run = summary(run_walle(env, algo, mask, spec["steps"][algo], "", reuse=reuse),
                              spec["target"])
                results[f"{env}/{algo}/{'mask' if mask == 'auto' else 'no mask'}"] = run
                print(f"{env} {algo} mask={mask}: final {run['final_return']}, best "
                      f"{run['best_return']}, {run['env_steps_to_target']} steps to "
                      f"{spec['target']:g}", flush=True)
    write_result("action_masking", {
        "command": "python benchmarks/action_masking.py --envs " + " ".join(envs)
                   + " --algos " + " ".join(algos),
        "targets": {env: ENVS[env]["target"] for env in envs}, "runs": results})
    plot(results, envs, algos, RESULTS / "action_masking.png")


def plot(results: dict, envs: list[str], algos: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(envs), len(algos), figsize=(4 * len(algos), 3.2 * len(envs)),
                             squeeze=False)
    for i, env in enumerate(envs):
        for j, algo in enumerate(algos):
            ax = axes[i][j]
            for label, color in (("mask", "tab:blue"), ("no mask", "tab:red")):
                run = results.get(f"{env}/{algo}/{label}")
                pts = [(p["env_steps"], p["return"]) for p in run["curve"] if p["return"] is not None] if run else []
                if pts:
                    ax.plot(*zip(*pts), color=color, label=label)
            ax.axhline(ENVS[env]["target"], color="grey", linestyle="--", linewidth=1)
            ax.set_title(f"{algo} {ENVS[env]['env_id']}")
            ax.set_xlabel("env steps")
            ax.set_ylabel("mean return, last 20 episodes")
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


SB3 = r'''
import json, sys
sys.path.insert(0, sys.argv[4])
import numpy as np
import torch
from gymnasium.wrappers import FlattenObservation
from sb3_contrib import MaskablePPO
from sb3_contrib.common.wrappers import ActionMasker
from stable_baselines3.common.env_util import make_vec_env
from sb3_curve import Curve
from walle_ray.envs.games import OthelloEnv

spec, out, seed = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
torch.set_num_threads(1)

def legal(env):
    mask = np.zeros(env.action_space.n, bool)
    mask[list(env.moves) or [env.action_space.n - 1]] = True
    return mask

def make():
    env = OthelloEnv()
    return ActionMasker(FlattenObservation(env), lambda e: legal(env))

env = make_vec_env(make, n_envs=spec["envs"], seed=seed)

model = MaskablePPO("MlpPolicy", env, seed=seed, stats_window_size=20, device="cpu", verbose=0,
                    n_steps=spec["batch"] // spec["envs"], batch_size=spec["minibatch"],
                    n_epochs=spec["epochs"], learning_rate=spec["lr"], gamma=spec["gamma"],
                    gae_lambda=spec["gae_lambda"], ent_coef=spec["ent_coef"],
                    clip_range=spec["clip"], vf_coef=spec["vf_coef"],
                    max_grad_norm=spec["max_grad_norm"])
model.learn(total_timesteps=spec["steps"], callback=Curve(out, spec["target"]))
'''


def maskable_spec() -> dict:
    """The PPO settings walle_ray's preset uses on Othello, as MaskablePPO spells them."""
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import make_cfg

    cfg = make_cfg("algo=ppo", "env=othello")
    a = cfg.algo
    samplers = int(str(cfg.topology.spec).split("a")[0])
    return {"envs": samplers * cfg.env.envs_per_sampler, "batch": a.batch_size,
            "minibatch": a.minibatch_size, "epochs": a.epochs, "lr": a.lr, "gamma": a.gamma,
            "gae_lambda": a.gae_lambda, "ent_coef": a.ent_coef, "clip": a.clip,
            "vf_coef": a.vf_coef * 2,  # walle_ray's value loss carries a factor 0.5, SB3's not
            "max_grad_norm": a.max_grad_norm, "steps": ENVS["othello"]["steps"]["ppo"],
            "target": ENVS["othello"]["target"], "lr_schedule": a.lr_schedule,
            "hidden": list(cfg.model.hidden), "activation": cfg.model.activation}


def run_sb3(spec: dict, seed: int, tag: str) -> dict:
    out = ROOT / "runs" / f"bench_mask_sb3_{tag}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", SB3, json.dumps(spec), str(out), str(seed),
                    str(Path(__file__).resolve().parent)], cwd=ROOT, check=True)
    run = {"process_s": time.perf_counter() - t0,
           "curve": [json.loads(line) for line in out.read_text().splitlines()]}
    return summary(run, spec["target"])


def vs_maskable(rounds: int) -> None:
    try:
        import sb3_contrib  # noqa: F401
    except ImportError:
        sys.exit("action_masking: sb3-contrib is not installed; pip install -e '.[peers]'")
    spec = maskable_spec()
    if spec["lr_schedule"] != "constant" or spec["hidden"] != [64, 64] or spec["activation"] != "tanh":
        sys.exit("action_masking: the preset's lr schedule or network is not MaskablePPO's "
                 "default; match them in SB3 below first")
    out = []
    for r in range(rounds):
        order = ["sb3", "walle"] if r % 2 == 0 else ["walle", "sb3"]
        runs = {}
        for who in order:
            if who == "sb3":
                runs[who] = run_sb3(spec, r, f"r{r}")
            else:
                runs[who] = summary(run_walle("othello", "ppo", "auto", spec["steps"], f"_vs_r{r}",
                                              (f"run.seed={r}", f"run.stop_at_return={spec['target']}")),
                                    spec["target"])
            print(f"round {r} {who}: {runs[who]['seconds_to_target']} s, "
                  f"{runs[who]['env_steps_to_target']} env steps to {spec['target']:g}", flush=True)
        out.append(runs)
    pairs = [(rnd["walle"]["seconds_to_target"], rnd["sb3"]["seconds_to_target"]) for rnd in out]
    ratios = [w / s for w, s in pairs if w is not None and s is not None]
    write_result("action_masking_vs_maskable_ppo", {
        "command": f"python benchmarks/action_masking.py --vs-maskable --rounds {rounds}",
        "settings": spec, "rounds": out, "time_ratio_walle_over_maskable_ppo": ratios})
    print(f"walle_ray / MaskablePPO time to {spec['target']:g}: {ratios}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    p.add_argument("--algos", nargs="+", default=["ppo", "impala", "dqn"])
    p.add_argument("--vs-maskable", action="store_true")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--reuse", action="store_true", help="read the curves' runs already made")
    args = p.parse_args()
    if args.vs_maskable:
        vs_maskable(args.rounds)
    else:
        curves(args.envs, args.algos, args.reuse)


if __name__ == "__main__":
    main()

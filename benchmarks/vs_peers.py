"""PPO against Stable-Baselines3 on this machine: wall-clock seconds to a score, alternating.

    pip install -e '.[peers]'     # stable-baselines3; the package itself never needs it
    python benchmarks/vs_peers.py --task cartpole [--rounds 3]
    python benchmarks/vs_peers.py --task halfcheetah [--rounds 1] [--fast]

Each round runs Stable-Baselines3's PPO with the RL Baselines3 Zoo's hyperparameters for the
task, then walle_ray's PPO with the same ones (``python -m walle_ray algo=ppo env=T ...``, as
a user types it), alternating the order from round to round; each in a process of its own.
Both stop at the target (CartPole-v1: 475, HalfCheetah-v5: 3000, the mean of the last 20
episodes) or at the zoo's step budget. Time counts from each library's training loop start
(``seconds_to_target``); the whole process, imports and Ray's start included, is recorded
too (``process_s``). With ``--fast`` each round adds a third run, walle_ray with its own
hyperparameters (``preset=ppo_halfcheetah_fast``), timed against the same SB3 run. Writes benchmarks/results/vs_peers_<task>.json and a PNG of return
against wall-clock seconds with both libraries on one plot.

The zoo's settings and how walle_ray spells them:

- CartPole-v1: 8 envs x 32 steps, one minibatch of 256, 20 epochs, lr 1e-3 and clip 0.2 both
  decayed linearly (walle_ray decays the lr; its clip stays 0.2), gamma 0.98, GAE 0.8, no
  entropy bonus, 64x64 tanh, 1e5 steps. walle_ray: ``topology=2a1m1l`` (2 samplers x 4 envs).
- HalfCheetah-v5: 1 env x 512 steps, minibatches of 64, 20 epochs, lr 2.0633e-5, clip 0.1,
  gamma 0.98, GAE 0.92, ent 4.0e-4, vf 0.58, grad clip 0.8, 256x256 ReLU, log-std -2,
  observations and rewards normalised, 1e6 steps: walle_ray's ``ppo_halfcheetah`` preset
  (its vf_coef 1.16 is the zoo's 0.58: walle_ray's value loss carries a factor 0.5).
  walle_ray: ``topology=8a1m1l`` by default (``--topology``).
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

TASKS = {
    "cartpole": {
        "env_id": "CartPole-v1", "target": 475.0, "steps": 100_000, "topology": "2a1m1l",
        "walle": ["algo=ppo", "env=cartpole", "algo.batch_size=256", "algo.minibatch_size=256",
                  "algo.epochs=20", "algo.lr=1e-3", "algo.lr_schedule=linear", "algo.gamma=0.98",
                  "algo.gae_lambda=0.8", "algo.ent_coef=0.0", "algo.vf_coef=1.0",
                  "algo.clip=0.2", "algo.max_grad_norm=0.5"],
    },
    "halfcheetah": {
        "env_id": "HalfCheetah-v5", "target": 3000.0, "steps": 1_000_000, "topology": "8a1m1l",
        "walle": ["algo=ppo", "env=halfcheetah"],  # the ppo_halfcheetah preset is the zoo's
        "fast": ["algo=ppo", "env=halfcheetah", "preset=ppo_halfcheetah_fast"],
    },
}

SB3 = r'''
import sys
sys.path.insert(0, sys.argv[6])
import torch
from sb3_curve import Curve
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

task, target, steps, out, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
torch.set_num_threads(1)

def linear(start):
    return lambda progress: progress * start  # progress runs from 1 to 0

if task == "cartpole":
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    kwargs = dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                  ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2))
else:
    env = VecNormalize(make_vec_env("HalfCheetah-v5", n_envs=1, seed=seed), gamma=0.98)
    kwargs = dict(n_steps=512, batch_size=64, gamma=0.98, learning_rate=2.0633e-05,
                  ent_coef=0.000401762, clip_range=0.1, n_epochs=20, gae_lambda=0.92,
                  max_grad_norm=0.8, vf_coef=0.58096,
                  policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=torch.nn.ReLU,
                                     net_arch=dict(pi=[256, 256], vf=[256, 256])))

model = PPO("MlpPolicy", env, seed=seed, stats_window_size=20, device="cpu", verbose=0, **kwargs)
model.learn(total_timesteps=steps, callback=Curve(out, target))
'''


def run_sb3(task: str, spec: dict, seed: int, tag: str) -> dict:
    out = ROOT / "runs" / f"vs_peers_sb3_{task}_{tag}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", SB3, task, str(spec["target"]), str(spec["steps"]),
                    str(out), str(seed), str(Path(__file__).resolve().parent)], check=True)
    process_s = time.perf_counter() - t0
    curve = [json.loads(line) for line in out.read_text().splitlines()]
    return summary("stable-baselines3", curve, spec, process_s)


def run_walle(task: str, spec: dict, seed: int, tag: str, topology: str,
              arm: str = "walle") -> dict:
    """walle_ray with the zoo's settings (``arm="walle"``) or its own (``"fast"``)."""
    from walle_ray.logging.metrics import read_metrics

    run_dir = ROOT / "runs" / f"vs_peers_{arm}_{task}_{tag}"
    shutil.rmtree(run_dir, ignore_errors=True)
    args = [*spec[arm], f"topology={topology}", f"run.seed={seed}",
            f"run.total_env_steps={spec['steps']}", f"run.stop_at_return={spec['target']}",
            "run.report_every_s=2", f"hydra.run.dir={run_dir}", "logger.progress=line",
            "logger.print_every_s=30"]
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "walle_ray", *args], cwd=ROOT, check=True)
    process_s = time.perf_counter() - t0
    curve = [{"wall_s": r["wall_s"], "env_steps": r["env_steps"], "return": r["return"]}
             for r in read_metrics(run_dir / "metrics.jsonl")]
    out = summary("walle_ray" if arm == "walle" else "walle_ray (own settings)", curve, spec,
                  process_s)
    out["command"] = "python -m walle_ray " + " ".join(a for a in args if not a.startswith(("hydra.", "logger.")))
    return out


def summary(library: str, curve: list[dict], spec: dict, process_s: float) -> dict:
    reached = first_reaching(curve, spec["target"])
    last = curve[-1]
    return {"library": library, "seconds_to_target": reached["wall_s"] if reached else None,
            "env_steps_to_target": reached["env_steps"] if reached else None,
            "env_steps": last["env_steps"], "wall_s": last["wall_s"],
            "env_steps_per_s": last["env_steps"] / last["wall_s"], "process_s": process_s,
            "final_return": last["return"], "curve": curve}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = {"walle_ray": "tab:blue", "stable-baselines3": "tab:orange",
              "walle_ray (own settings)": "tab:green"}
    for r, rnd in enumerate(result["rounds"]):
        for run in rnd.values():
            pts = [(p["wall_s"], p["return"]) for p in run["curve"] if p["return"] is not None]
            if pts:
                ax.plot(*zip(*pts), color=colors[run["library"]], alpha=0.8,
                        label=run["library"] if r == 0 else None)
    ax.axhline(result["target"], color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("seconds of training")
    ax.set_ylabel("mean return, last 20 episodes")
    ax.set_title(f"PPO {result['env_id']}: walle_ray vs Stable-Baselines3 (zoo settings), 2 cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=sorted(TASKS), default="cartpole")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--topology", help="walle_ray's topology (default: the task's)")
    p.add_argument("--fast", action="store_true",
                   help="also walle_ray with its own settings (halfcheetah: ppo_halfcheetah_fast)")
    p.add_argument("--dry-run", action="store_true", help="print the result, write nothing")
    args = p.parse_args()
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        sys.exit("vs_peers: stable-baselines3 is not installed; pip install -e '.[peers]'")
    spec = TASKS[args.task]
    if args.fast and "fast" not in spec:
        sys.exit(f"vs_peers: --fast: walle_ray has no settings of its own for {args.task}")
    topology = args.topology or spec["topology"]
    rounds = []
    for r in range(args.rounds):  # alternating, so drift on the machine hits both alike
        order = ["sb3", "walle", *(["fast"] if args.fast else [])]
        order = order if r % 2 == 0 else order[::-1]
        runs = {}
        for who in order:
            runs[who] = (run_sb3(args.task, spec, r, f"r{r}") if who == "sb3"
                         else run_walle(args.task, spec, r, f"r{r}", topology, who))
            print(f"round {r} {who}: {runs[who]['seconds_to_target']} s to target, "
                  f"{runs[who]['env_steps_per_s']:.0f} env steps/s", flush=True)
        rounds.append(runs)
    result = summarise(spec, topology, rounds)
    ratios = result["time_ratio_walle_over_sb3"]
    name = f"vs_peers_{args.task}"
    write_result(name, result, args.dry_run)
    if not args.dry_run:
        plot(result, RESULTS / f"{name}.png")
    print(f"walle_ray / SB3 time to {spec['target']:g}: {ratios}", flush=True)
    if args.fast:
        print(f"walle_ray (own settings) / SB3 time to {spec['target']:g}: "
              f"{result['time_ratio_fast_over_sb3']}", flush=True)


def time_ratios(rounds: list[dict], arm: str) -> tuple[list[float], float | None]:
    """``arm``'s time to the target over SB3's in each round where both reached it, and
    pooled over those rounds (the sum of its times over the sum of SB3's): seeds differ a
    lot in how soon they learn, and the pooled ratio weighs each second alike."""
    pairs = [(rnd[arm]["seconds_to_target"], rnd["sb3"]["seconds_to_target"]) for rnd in rounds]
    pairs = [(w, s) for w, s in pairs if w is not None and s is not None]
    return [w / s for w, s in pairs], (sum(w for w, _ in pairs) / sum(s for _, s in pairs)
                                        if pairs else None)


def summarise(spec: dict, topology: str, rounds: list[dict]) -> dict:
    ratios, pooled = time_ratios(rounds, "walle")
    result = {"env_id": spec["env_id"], "target": spec["target"], "step_budget": spec["steps"],
              "topology": topology, "rounds": rounds,
              "time_ratio_walle_over_sb3": ratios,
              "time_ratio_median": sorted(ratios)[len(ratios) // 2] if ratios else None,
              "time_ratio_pooled": pooled,
              "steps_per_s_ratio": [rnd["walle"]["env_steps_per_s"] / rnd["sb3"]["env_steps_per_s"]
                                    for rnd in rounds]}
    if "fast" in rounds[0]:
        fast, fast_pooled = time_ratios(rounds, "fast")
        result.update(fast_settings=" ".join(spec["fast"]), time_ratio_fast_over_sb3=fast,
                      time_ratio_fast_pooled=fast_pooled,
                      fast_steps_per_s_ratio=[rnd["fast"]["env_steps_per_s"] / rnd["sb3"]["env_steps_per_s"]
                                              for rnd in rounds])
    return result


if __name__ == "__main__":
    main()

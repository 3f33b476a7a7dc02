"""Imitation on HalfCheetah-v5: BC from an expert's recorded episodes, and MARWIL against BC
on a dataset that is half expert, half random.

    python benchmarks/imitation_halfcheetah.py [--expert PATH] [--steps 1000000] [--budget 10000000] [--reuse]

1. The expert is the committed PPO policy ``benchmarks/policies/ppo_halfcheetah_fast.pt``
   (``preset=ppo_halfcheetah_fast``, 1M env steps); its greedy return over 10 episodes is
   the reference.
2. ``mode=collect`` records ``--steps`` env steps of it (its sampled actions) as two
   datasets of half each, and ``collect.random=true`` half as many of uniform random actions.
   A third half records the expert with each action replaced by a random one with
   probability 0.5 (``collect.random_prob=0.5``): the same states carry both kinds of action.
3. ``algo=bc topology=0a1m1l`` learns from both expert halves (``--steps`` in all); then BC
   and ``algo=marwil`` learn from one expert half plus the random one (``dataset.path`` a
   list; "mixed", half the episodes each), and from the noisy expert ("noisy", half the
   steps each), each for ``--budget`` recorded steps, evaluated (5 greedy episodes) 20 times.

The score of a run is the mean of its last three evaluations. Targets: BC on the expert's
data reaches at least 90% of the expert's greedy return; MARWIL beats BC on the mixed data
(and on the noisy data).
Writes benchmarks/results/imitation_halfcheetah.json and .png.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from common import RESULTS, ROOT, run_cli, write_result

EXPERT = ROOT / "benchmarks" / "policies" / "ppo_halfcheetah_fast.pt"
DATA = ROOT / "runs" / "bench_imitation_data"


def collect(args: list[str], out: Path, timeout_s: float = 3600) -> None:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "walle_ray", "mode=collect", *args, f"collect.out={out}",
           f"hydra.run.dir={out}_log"]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=timeout_s)


def dataset_returns(path: Path) -> dict:
    """The mean and count of a dataset's episode returns, read back from the Minari files."""
    import numpy as np
    from minari.dataset.minari_storage import MinariStorage

    storage = MinariStorage.read(path / "data")
    returns = [float(np.sum(e["rewards"])) for e in storage.get_episodes(range(storage.total_episodes))]
    return {"path": str(path), "episodes": len(returns), "steps": storage.total_steps,
            "return_mean": float(np.mean(returns)), "return_std": float(np.std(returns))}


# RLlib's MARWIL advantage normaliser: c^2 from 100, moving at 1e-8, weights not clipped
RLLIB_NORM = ["algo.adv_norm_init=100", "algo.adv_norm_rate=1e-8", "algo.max_weight=null"]


def offline_run(name: str, algo: str, paths: list[Path], budget: int, reuse: bool,
                extra: list[str] | None = None) -> dict:
    """One offline run, or with ``reuse`` the finished run of the same name, if there is one."""
    from walle_ray.logging.metrics import read_metrics

    run_dir = ROOT / "runs" / f"bench_imitation_{name}"
    listed = "[" + ",".join(str(p) for p in paths) + "]"
    overrides = [f"algo={algo}", "env=halfcheetah", "topology=0a1m1l", f"dataset.path={listed}",
                 f"run.total_env_steps={budget}", "eval.episodes=5", "run.report_every_s=10",
                 *(extra or [])]
    wall = None  # the process's wall time, when this invocation ran it
    if reuse and (run_dir / "checkpoints" / "last.pt").is_file():
        records = read_metrics(run_dir / "metrics.jsonl")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        records, wall = run_cli(overrides, run_dir, timeout_s=7200)
    evals = [(r["env_steps"], r["eval/return"]) for r in records if "eval/return" in r]
    last = [ret for _, ret in evals[-3:]]
    return {"name": name, "algo": algo, "datasets": [str(p) for p in paths],
            "command": "python -m walle_ray " + " ".join(overrides),
            "wall_s_training": records[-1]["wall_s"], "wall_s_process": wall,
            "updates": records[-1]["updates"], "evaluations": [{"env_steps": s, "return": r}
                                                               for s, r in evals],
            "score": sum(last) / len(last), "best": max(r for _, r in evals)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--expert", type=Path, default=EXPERT)
    p.add_argument("--steps", type=int, default=1_000_000, help="expert env steps recorded")
    p.add_argument("--budget", type=int, default=10_000_000, help="recorded steps each run learns from")
    p.add_argument("--reuse", action="store_true",
                   help="reuse the datasets and the finished runs of a previous invocation")
    p.add_argument("--marwil-norms", action="store_true",
                   help="only MARWIL on the mixed and noisy data, with walle_ray's advantage "
                        "normaliser and with RLlib's (imitation_halfcheetah_marwil_norms.json)")
    args = p.parse_args()

    from walle_ray.runtime.evaluate import evaluate_checkpoint

    expert = evaluate_checkpoint(args.expert, 10, seed=12345)
    half = args.steps // 2
    parts = {"expert_a": DATA / "expert_a", "expert_b": DATA / "expert_b", "random": DATA / "random",
             "noisy": DATA / "noisy"}
    makes = {"expert_a": [f"run.checkpoint={args.expert}", "run.seed=1"],
             "expert_b": [f"run.checkpoint={args.expert}", "run.seed=2"],
             "random": ["env=halfcheetah", "collect.random=true"],
             "noisy": [f"run.checkpoint={args.expert}", "run.seed=3", "collect.random_prob=0.5"]}
    for key, path in parts.items():
        if not (args.reuse and (path / "data" / "metadata.json").is_file()):
            collect([*makes[key], f"collect.steps={half}", "collect.episodes=null"], path)
    data = {key: dataset_returns(path) for key, path in parts.items()}
    if args.marwil_norms:
        norms(parts, data, args)
        return
    runs = [offline_run("bc_expert", "bc", [parts["expert_a"], parts["expert_b"]], args.budget,
                        args.reuse),
            offline_run("bc_mixed", "bc", [parts["expert_a"], parts["random"]], args.budget, args.reuse),
            offline_run("marwil_mixed", "marwil", [parts["expert_a"], parts["random"]], args.budget,
                        args.reuse),
            offline_run("bc_noisy", "bc", [parts["noisy"]], args.budget, args.reuse),
            offline_run("marwil_noisy", "marwil", [parts["noisy"]], args.budget, args.reuse)]
    by = {r["name"]: r for r in runs}
    result = {
        "expert": {"checkpoint": str(args.expert.relative_to(ROOT)) if args.expert.is_relative_to(ROOT)
                   else str(args.expert), "greedy_return_mean": expert["return_mean"],
                   "greedy_return_std": expert["return_std"], "episodes": expert["episodes"]},
        "datasets": data, "runs": runs,
        "bc_of_expert": by["bc_expert"]["score"] / expert["return_mean"],
        "targets": {"bc_at_least_0.9_of_expert": by["bc_expert"]["score"] >= 0.9 * expert["return_mean"],
                    "marwil_beats_bc_on_mixed": by["marwil_mixed"]["score"] > by["bc_mixed"]["score"],
                    "marwil_beats_bc_on_noisy": by["marwil_noisy"]["score"] > by["bc_noisy"]["score"]},
    }
    write_result("imitation_halfcheetah", result)
    plot(result)
    for r in runs:
        print(f"{r['name']}: score {r['score']:.0f} (best {r['best']:.0f}) in "
              f"{r['wall_s_training']:.0f} s of training")
    print(f"expert greedy {expert['return_mean']:.0f}; BC of expert {result['bc_of_expert']:.2f}; "
          f"targets {result['targets']}")


def norms(parts: dict, data: dict, args) -> None:
    """MARWIL (beta 1) with walle_ray's advantage normaliser and with RLlib's, on the mixed
    and the noisy data: the same beta weights by a different c."""
    runs = []
    for data_name, paths in (("mixed", [parts["expert_a"], parts["random"]]),
                             ("noisy", [parts["noisy"]])):
        for norm, extra in (("walle_ray", []), ("rllib", RLLIB_NORM)):
            run = offline_run(f"marwil_{data_name}_{norm}", "marwil", paths, args.budget,
                              args.reuse, extra)
            run.update(data=data_name, normaliser=norm)
            runs.append(run)
            print(f"{run['name']}: score {run['score']:.0f} (best {run['best']:.0f})", flush=True)
    write_result("imitation_halfcheetah_marwil_norms", {
        "command": "python benchmarks/imitation_halfcheetah.py --marwil-norms"
                   + (" --reuse" if args.reuse else ""),
        "rllib_settings": RLLIB_NORM, "datasets": data, "runs": runs})


def plot(result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in result["runs"]:
        xs = [e["env_steps"] / 1e6 for e in r["evaluations"]]
        ax.plot(xs, [e["return"] for e in r["evaluations"]], marker="o", ms=3, label=r["name"])
    ax.axhline(result["expert"]["greedy_return_mean"], color="k", ls="--", lw=1, label="expert (greedy)")
    ax.axhline(0.9 * result["expert"]["greedy_return_mean"], color="k", ls=":", lw=1, label="90% of expert")
    ax.set_xlabel("recorded steps learned from (millions)")
    ax.set_ylabel("greedy evaluation return")
    ax.set_title("Imitation on HalfCheetah-v5, 0a1m1l, 2 CPU cores")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "imitation_halfcheetah.png", dpi=110)


if __name__ == "__main__":
    main()

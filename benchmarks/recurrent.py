"""What a recurrent core (``model.core=lstm``) costs and what it buys, on this machine.

    python benchmarks/recurrent.py [--rounds 2] [--seconds 90] [--minutes 8] [--mlp-minutes 3]

- Throughput: IMPALA on Pong at 42x42 (``algo=impala env=pong env.obs_size=42
  topology=2a1m1l``) with and without ``model.core=lstm`` (256 units), alternating, each for
  ``--seconds`` of wall time; agent steps/s consumed by the learner after a warm-up.
- A POMDP: PPO on CartPole with the velocities hidden (``walle/CartPoleNoVelocity-v0``),
  with an LSTM and with the same MLP without it, each until a mean return of 475 or
  ``--minutes`` (the MLP: ``--mlp-minutes``); settings in the spirit of the RL Baselines3 Zoo's recurrent PPO on
  CartPoleNoVel (8 envs x 32 steps, 20 epochs, lr 1e-3 decayed, gamma 0.98, GAE 0.8, 64 ReLU
  units, an LSTM of 64).

Writes benchmarks/results/recurrent.json and recurrent.png (return against wall-clock time).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

from common import RESULTS, ROOT, first_reaching, run_cli, steady_consumed_rate, write_result

PONG = ["algo=impala", "env=pong", "env.obs_size=42", "topology=2a1m1l", "run.report_every_s=5"]
POMDP = ["algo=ppo", "topology=2a1m1l", "env.id=walle/CartPoleNoVelocity-v0",
         "env.name=cartpole_novel", "env.envs_per_sampler=4", "algo.batch_size=256",
         "algo.minibatch_size=256", "algo.epochs=20", "algo.lr=1e-3", "algo.lr_schedule=linear",
         "algo.gamma=0.98", "algo.gae_lambda=0.8", "algo.ent_coef=0.0", "model.hidden=[64]",
         "model.activation=relu", "model.ortho_init=false", "run.total_env_steps=1000000",
         "run.stop_at_return=475", "run.report_every_s=5"]
LSTM = {"pong": ["model.core=lstm", "model.core_size=256"],
        "pomdp": ["model.core=lstm", "model.core_size=64"]}


def throughput(core: bool, seconds: float, warmup: float, tag: str) -> dict:
    run_dir = ROOT / "runs" / f"bench_recurrent_pong_{tag}"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [*PONG, *(LSTM["pong"] if core else []), f"run.max_wall_s={seconds}"]
    records, _ = run_cli(overrides, run_dir, timeout_s=seconds + 300)
    return {"core": "lstm" if core else None, "command": "python -m walle_ray " + " ".join(overrides),
            "consumed_per_s": steady_consumed_rate(records, warmup),
            "updates": records[-1]["updates"]}


def pomdp(core: bool, minutes: float) -> dict:
    run_dir = ROOT / "runs" / f"bench_recurrent_pomdp_{'lstm' if core else 'mlp'}"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [*POMDP, *(LSTM["pomdp"] if core else []), f"run.max_wall_s={minutes * 60}"]
    records, _ = run_cli(overrides, run_dir, timeout_s=minutes * 60 + 300)
    reached = first_reaching(records, 475.0)
    return {"core": "lstm" if core else None, "run_dir": str(run_dir.relative_to(ROOT)),
            "command": "python -m walle_ray " + " ".join(overrides),
            "seconds_to_475": reached["wall_s"] if reached else None,
            "env_steps_to_475": reached["env_steps"] if reached else None,
            "best_return": max((r["return"] for r in records if r["return"] is not None), default=None),
            "final_return": records[-1]["return"], "env_steps": records[-1]["env_steps"],
            "wall_s": records[-1]["wall_s"], "learn_share": sum(r["learn_s"] for r in records)
            / sum(r["learn_s"] + r["collect_s"] for r in records),
            "curve": [{"wall_s": r["wall_s"], "env_steps": r["env_steps"], "return": r["return"]}
                      for r in records]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=90.0, help="wall budget of each Pong run")
    p.add_argument("--warmup", type=float, default=30.0, help="loop seconds left out of the rate")
    p.add_argument("--minutes", type=float, default=8.0, help="wall budget of the POMDP's LSTM run")
    p.add_argument("--mlp-minutes", type=float, default=3.0, help="wall budget of its MLP run")
    args = p.parse_args()
    rounds = []
    for r in range(args.rounds):  # alternating, so drift on the machine hits both alike
        order = (False, True) if r % 2 == 0 else (True, False)
        runs = {("lstm" if core else "mlp"): throughput(core, args.seconds, args.warmup, f"{core}_r{r}")
                for core in order}
        runs["ratio"] = runs["lstm"]["consumed_per_s"] / runs["mlp"]["consumed_per_s"]
        print(f"round {r}: lstm/mlp agent steps/s {runs['ratio']:.3f}", flush=True)
        rounds.append(runs)
    curves = {"lstm": pomdp(True, args.minutes), "mlp": pomdp(False, args.mlp_minutes)}
    subprocess.run([sys.executable, "-m", "walle_ray.plot", str(ROOT / curves["lstm"]["run_dir"]),
                    "--label", "PPO + LSTM", "--baseline", str(ROOT / curves["mlp"]["run_dir"]),
                    "--baseline-label", "PPO, MLP", "--x", "wall_s", "--title",
                    "CartPole without velocities, 2 cores", "-o", str(RESULTS / "recurrent.png")],
                   cwd=ROOT, check=True)
    ratios = [r["ratio"] for r in rounds]
    write_result("recurrent", {"throughput_rounds": rounds, "throughput_ratio_lstm_over_mlp": ratios,
                               "pomdp": curves})
    print(f"throughput lstm/mlp {ratios}; POMDP to 475: lstm {curves['lstm']['seconds_to_475']} s, "
          f"mlp {curves['mlp']['seconds_to_475']} s (best {curves['mlp']['best_return']})", flush=True)


if __name__ == "__main__":
    main()

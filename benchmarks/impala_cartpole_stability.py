"""Whether IMPALA's CartPole preset keeps its score once it has reached it.

    python benchmarks/impala_cartpole_stability.py [--seeds 0 1] [--steps 3000000]
                                                   [--settings NAME ...] [--name NAME]

Runs ``python -m walle_ray algo=impala env=cartpole`` past the score, with no stop at 475,
for each seed and each of ``--settings``, alternately, on ``4a2m2l topology.pack=off`` (one
process per role: the policy lag is several updates) and on the default ``2a1m1l``. The
default settings use Adam with an entropy weight of 0.001 and with IMPALA's own 0.01; the
``*_adam`` and ``*_amsgrad`` settings use an entropy weight of 0.001 and the optimizer
they name. Each run
records when it first reached 475 (the run's own milestone), the lowest mean return after
that, its last return and the lowest policy entropy after 475. A run "ended collapsed"
when it had reached 475 and its last mean return is under 100. Writes
benchmarks/results/<--name>.json (default impala_cartpole_stability).
"""

from __future__ import annotations

import argparse
import json
import shutil

from common import ROOT, first_reaching, run_cli, write_result

OFF = ["topology=4a2m2l", "topology.pack=off"]
SETTINGS = {  # name -> overrides after the command's own
    # the first benchmark's, made while the preset used Adam ("as typed": the default 2a1m1l)
    "4a2m2l_off_ent0.01": [*OFF, "algo.ent_coef=0.01", "algo.optimizer=adam"],
    "4a2m2l_off_ent0.001": [*OFF, "algo.ent_coef=0.001", "algo.optimizer=adam"],
    "as_typed_ent0.01": ["algo.ent_coef=0.01", "algo.optimizer=adam"],
    "as_typed_ent0.001": ["algo.ent_coef=0.001", "algo.optimizer=adam"],
    "4a2m2l_off_amsgrad": [*OFF, "algo.ent_coef=0.001", "algo.optimizer=amsgrad"],
    "2a1m1l_amsgrad": ["algo.ent_coef=0.001", "algo.optimizer=amsgrad"],
}
# Adam at 0.001, under the names the AMSGrad comparison gives them (its run directories)
SETTINGS["4a2m2l_off_adam"] = SETTINGS["4a2m2l_off_ent0.001"]
SETTINGS["2a1m1l_adam"] = SETTINGS["as_typed_ent0.001"]
DEFAULT_SETTINGS = ["4a2m2l_off_ent0.01", "4a2m2l_off_ent0.001", "as_typed_ent0.01",
                    "as_typed_ent0.001"]
TARGET = 475.0


def one_run(name: str, overrides: list[str], seed: int, steps: int, reuse: bool) -> dict:
    """One run, or with ``reuse`` the finished run already in its directory."""
    from walle_ray.logging.metrics import read_metrics

    run_dir = ROOT / "runs" / f"bench_impala_cartpole_stability_{name}_seed{seed}"
    command = ["algo=impala", "env=cartpole", *overrides, "run.stop_at_return=null",
               f"run.total_env_steps={steps}", f"run.seed={seed}", "run.report_every_s=5"]
    if reuse and (run_dir / "report.json").is_file():
        records, wall = read_metrics(run_dir / "metrics.jsonl"), None
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        records, wall = run_cli(command, run_dir, timeout_s=1200)
    records = [r for r in records if "learn/entropy" in r]  # records with an update in them
    report = json.loads((run_dir / "report.json").read_text())
    reached = report.get("milestones", {}).get(f"{TARGET:g}")
    first = first_reaching(records, TARGET)
    after = records[records.index(first):] if first else []
    last = records[-1]
    return {
        "setting": name, "seed": seed,
        "command": "python -m walle_ray " + " ".join(command),
        "minutes_to_475": reached["minutes"] if reached else None,
        "agent_steps_to_475": reached["agent_steps"] if reached else None,
        "lowest_return_after_475": min((r["return"] for r in after), default=None),
        "lowest_entropy_after_475": min((r["learn/entropy"] for r in after), default=None),
        "final_return": last["return"], "final_entropy": last["learn/entropy"],
        "ended_collapsed": first is not None and last["return"] < 100,
        "agent_steps": last["env_steps"], "wall_s_process": wall,
        "curve": [{"env_steps": r["env_steps"], "return": r["return"],
                   "entropy": r["learn/entropy"], "grad_norm": r["learn/grad_norm"],
                   "kl": r["learn/kl"], "value_loss": r["learn/value_loss"]} for r in records],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, default=3_000_000)
    p.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=DEFAULT_SETTINGS)
    p.add_argument("--reuse", action="store_true", help="read the runs already finished")
    p.add_argument("--name", default="impala_cartpole_stability")
    args = p.parse_args()
    runs = [one_run(name, SETTINGS[name], seed, args.steps, args.reuse)
            for seed in args.seeds for name in args.settings]
    summary = {name: {"reached_475": sum(r["minutes_to_475"] is not None for r in rs),
                      "ended_collapsed": sum(r["ended_collapsed"] for r in rs), "runs": len(rs)}
               for name in args.settings for rs in [[r for r in runs if r["setting"] == name]]}
    for r in runs:
        print(f"{r['setting']} seed {r['seed']}: 475 after {r['minutes_to_475']} min, "
              f"{r['agent_steps_to_475']} agent steps; lowest after {r['lowest_return_after_475']}, "
              f"final {r['final_return']:.1f}, ended collapsed {r['ended_collapsed']}")
    command = "python benchmarks/impala_cartpole_stability.py --seeds {} --steps {}".format(
        " ".join(map(str, args.seeds)), args.steps)
    if args.settings != DEFAULT_SETTINGS:
        command += " --settings " + " ".join(args.settings)
    if args.name != "impala_cartpole_stability":
        command += f" --name {args.name}"
    write_result(args.name, {
        "command": command,
        "summary": summary, "runs": runs})


if __name__ == "__main__":
    main()

"""Samplers that step together on few CPUs: ``algo=impala env=pong topology=32a4m4l`` as typed
(its sampler processes step their 16 samplers as lanes of one vector env, ``topology.lanes``)
against the same with ``topology.lanes=false`` (each of the 32 samplers steps its 8 envs in
turn) and against ``2a1m1l``, alternating, each for a fixed wall time.

    python benchmarks/sampler_lanes.py [--rounds 2] [--seconds 150] [--warmup 45]

Per run: agent steps/s consumed by the learners after ``--warmup`` seconds of the loop, the
first learner update, the envs stepped, the episodes finished and when the first one was
(the return, the mean of the last 20 finished episodes, exists from then on), and the mean
wall seconds an env took per episode (its length times the envs over the agent steps/s
sampled). Writes benchmarks/results/sampler_lanes.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics

from common import ROOT, envs_of, run_cli, steady_consumed_rate, write_result

ARMS = {"32a4m4l": ["topology=32a4m4l"],
        "32a4m4l_in_turn": ["topology=32a4m4l", "topology.lanes=false"],
        "2a1m1l": ["topology=2a1m1l"]}


def measure(arm: str, seconds: float, warmup: float, tag: str) -> dict:
    run_dir = ROOT / "runs" / f"bench_lanes_{arm}_{tag}"
    shutil.rmtree(run_dir, ignore_errors=True)
    records, wall = run_cli(["algo=impala", "env=pong", *ARMS[arm], f"run.max_wall_s={seconds}",
                             "run.report_every_s=5"], run_dir, timeout_s=seconds + 300)
    first = next((r["first_update_s"] for r in records if "first_update_s" in r), None)
    episode = next((r for r in records if r.get("episodes", 0) > 0), None)
    last = records[-1]
    sampled = last["env_steps"] / last["wall_s"]
    length = last.get("episode_length")
    envs = envs_of(run_dir)  # what the run stepped, as its report says
    return {"arm": arm, "consumed_per_s": steady_consumed_rate(records, warmup),
            "sampled_per_s": sampled, "first_update_s": first, "envs": envs,
            "episodes": last.get("episodes", 0),
            "first_episode_wall_s": episode["wall_s"] if episode else None,
            "episode_length": length,
            "episode_wall_s": length * envs / sampled if length and envs else None,
            "env_steps": last["env_steps"], "updates": last["updates"], "process_wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=150.0, help="wall budget of each run")
    parser.add_argument("--warmup", type=float, default=45.0,
                        help="loop seconds left out of the steady-state rate")
    parser.add_argument("--name", default="sampler_lanes")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()

    rounds = []
    for r in range(args.rounds):  # alternating, so drift on the machine hits every arm alike
        order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
        rounds.append({arm: measure(arm, args.seconds, args.warmup, f"r{r}") for arm in order})
        print(f"round {r}:", {a: round(v["consumed_per_s"] or 0) for a, v in rounds[-1].items()},
              flush=True)

    def median(arm: str, key: str):
        values = [run[arm][key] for run in rounds if run[arm][key] is not None]
        return statistics.median(values) if values else None

    summary = {arm: {key: median(arm, key) for key in
                     ("consumed_per_s", "first_update_s", "episodes", "first_episode_wall_s",
                      "episode_wall_s")} for arm in ARMS}
    for arm in ("32a4m4l", "32a4m4l_in_turn"):
        summary[arm]["vs_2a1m1l"] = (summary[arm]["consumed_per_s"]
                                     / summary["2a1m1l"]["consumed_per_s"])
    write_result(args.name, {"command": "python benchmarks/sampler_lanes.py "
                             f"--rounds {args.rounds} --seconds {args.seconds:g} "
                             f"--warmup {args.warmup:g}", "rounds": rounds, "summary": summary},
                 args.dry_run)


if __name__ == "__main__":
    main()

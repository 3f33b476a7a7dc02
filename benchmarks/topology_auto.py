"""topology=auto against the shipped topologies, alternated on this machine.

For each workload (IMPALA Pong, PPO HalfCheetah, DQN CartPole, each with its preset as
shipped), every round runs each shipped topology and ``topology=auto`` for the same wall
time, in a rotated order, and reads each run's report.json: the steady rate (agent steps per
second after the first update), the seconds to the first update, and for auto its predicted
rate and choice. auto's first run of a workload calibrates (its cache is emptied first); the
later ones read the cache. The result goes to benchmarks/results/topology_auto.json.

``--cluster`` runs IMPALA Pong on a simulated cluster instead (``ray.cluster_utils.Cluster``:
a head with no CPUs, where the driver runs, and worker nodes of unequal CPUs, 1 and 2 by
default), auto against a small grid of hand placements; the nodes are raylets on this
machine's cores, so the grid and auto share the same cores as they would share real nodes.

    python benchmarks/topology_auto.py [--rounds 2] [--seconds 45] [--workloads ...]
    python benchmarks/topology_auto.py --cluster [--nodes 1 2] [--name topology_auto_cluster]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, run_cli, write_result  # noqa: E402

GRID = ["2a1m1l", "3a1m1l", "4a2m2l", "6a2m2l"]  # hand placements on the simulated cluster
WORKLOADS = {
    "impala_pong": (["algo=impala", "env=pong"], ["2a1m1l", "8a1m1l", "16a2m2l", "32a4m4l"]),
    "ppo_halfcheetah": (["algo=ppo", "env=halfcheetah"], ["2a1m1l", "4a1m1l", "8a1m1l"]),
    "dqn_cartpole": (["algo=dqn", "env=cartpole"], ["2a1m1l", "4a1m1l", "8a1m1l", "4a8m1l"]),
}


def one_run(base: list[str], topology: str, seconds: float, run_dir: Path) -> dict:
    shutil.rmtree(run_dir, ignore_errors=True)
    spec = [f"topology={topology}"] if topology in ("auto", *WORKLOADS["impala_pong"][1],
                                                    *WORKLOADS["ppo_halfcheetah"][1],
                                                    *WORKLOADS["dqn_cartpole"][1]) \
        else [f"topology.spec={topology}"]
    records, wall = run_cli([*base, *spec, f"run.max_wall_s={seconds}",
                             "run.stop_at_return=null", "run.total_env_steps=1e9",
                             "run.report_every_s=2"], run_dir, timeout_s=seconds + 400)
    report = json.loads((run_dir / "report.json").read_text())
    first = next((r["first_update_s"] for r in records if "first_update_s" in r), None)
    out = {"topology": topology, "steady_rate": report["steady"]["rate"],
           "first_update_s": first, "process_s": wall, "agent_steps": records[-1]["env_steps"]}
    if "auto" in report:
        auto = report["auto"]
        out.update(chose=auto["plan"]["spec"], threads=auto["plan"]["threads"],
                   predicted_rate=auto["plan"]["rate"], bound=auto["plan"]["bound"],
                   cached=auto["cached"], calibrate_s=auto["calibrate_s"],
                   model_error=(auto["plan"]["rate"] / report["steady"]["rate"] - 1
                                if report["steady"]["rate"] else None))
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--name", default=None)
    parser.add_argument("--cluster", action="store_true")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    if args.cluster:
        return on_cluster(args)
    cache = ROOT / "runs" / "bench_auto_cache"
    import os

    os.environ["WALLE_CACHE_DIR"] = str(cache)
    results = {}
    for name in args.workloads:
        base, shipped = WORKLOADS[name]
        shutil.rmtree(cache, ignore_errors=True)  # auto's first run calibrates
        order = ["auto", *shipped]
        runs: dict[str, list[dict]] = {t: [] for t in order}
        for r in range(args.rounds):
            rotated = order[r % len(order):] + order[:r % len(order)]
            for topology in rotated:
                runs[topology].append(one_run(base, topology, args.seconds,
                                              ROOT / "runs" / f"bench_auto_{name}"))
        rate = {t: statistics.median(x["steady_rate"] for x in v) for t, v in runs.items()}
        best = max(shipped, key=rate.get)
        autos = runs["auto"]
        results[name] = {
            "command": f"python -m walle_ray {' '.join(base)} topology=<each> "
                       f"run.max_wall_s={args.seconds:g}",
            "runs": runs, "median_steady_rate": rate, "best_shipped": best,
            "auto_vs_best": rate["auto"] / rate[best] if rate[best] else None,
            "auto_first_update_s": [x["first_update_s"] for x in autos],
            "auto_model_error": [x.get("model_error") for x in autos],
        }
        print(f"{name}: auto {rate['auto']:.0f}/s vs best shipped {best} {rate[best]:.0f}/s "
              f"({results[name]['auto_vs_best']:.2f}x)", flush=True)
    write_result(args.name or "topology_auto", {"rounds": args.rounds, "seconds_per_run": args.seconds,
                             "workloads": results,
                             "target": "auto >= 0.95x the best shipped topology's steady rate; "
                                       "first update within 30 s; model error within 20%"})


def on_cluster(args) -> None:
    """auto against ``GRID`` on a simulated cluster of ``args.nodes`` CPUs per worker node."""
    import os

    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for cpus in args.nodes:
            cluster.add_node(num_cpus=cpus)
        cluster.wait_for_nodes()
        os.environ["WALLE_CACHE_DIR"] = str(ROOT / "runs" / "bench_auto_cache_cluster")
        shutil.rmtree(os.environ["WALLE_CACHE_DIR"], ignore_errors=True)
        base = [*WORKLOADS["impala_pong"][0], f"run.ray_address={cluster.address}"]
        order = ["auto", *GRID]
        runs: dict[str, list[dict]] = {t: [] for t in order}
        for r in range(args.rounds):
            for topology in order[r % len(order):] + order[:r % len(order)]:
                runs[topology].append(one_run(base, topology, args.seconds,
                                              ROOT / "runs" / "bench_auto_cluster"))
    finally:
        cluster.shutdown()
    rate = {t: statistics.median(x["steady_rate"] for x in v) for t, v in runs.items()}
    best = max(GRID, key=rate.get)
    print(f"cluster: auto {rate['auto']:.0f}/s vs best hand placement {best} {rate[best]:.0f}/s "
          f"({rate['auto'] / rate[best]:.2f}x)", flush=True)
    write_result(args.name or "topology_auto_cluster", {
        "command": "python benchmarks/topology_auto.py --cluster --nodes "
                   + " ".join(map(str, args.nodes)),
        "nodes_cpus": args.nodes, "rounds": args.rounds, "seconds_per_run": args.seconds,
        "runs": runs, "median_steady_rate": rate, "best_hand_placement": best,
        "auto_vs_best": rate["auto"] / rate[best] if rate[best] else None,
        "auto_model_error": [x.get("model_error") for x in runs["auto"]],
        "target": "auto >= 0.9x the best hand placement"})


if __name__ == "__main__":
    main()

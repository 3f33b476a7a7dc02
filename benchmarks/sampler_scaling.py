"""Sampler scaling (WALL-E's claim): collection throughput of N Ray sampler actors on 2 cores.

    python benchmarks/sampler_scaling.py [--samplers 1 2 4 8 16 32] [--batch 6400] [--rounds 3]
    python benchmarks/sampler_scaling.py --batch 0 --fragment-length 50 --rounds 30

Each sampler steps one ``walle/Sleep-v0`` env, whose step waits ``--step-s`` seconds without
using the CPU: a slow simulator, not the cores, bounds collection. For each N, N
``RemoteSampler`` actors share the cluster's CPUs through fractional ``num_cpus`` and pull
weights from one ``RemoteParameterServer``; after one warm-up fragment each, the script times
``--rounds`` rounds of parallel fragment collection. It reports env steps/s, speedup over
N=1, efficiency (speedup / N) and the fragment time per N.

Two protocols: by default each round collects a fixed batch of ``--batch`` env steps split
evenly over the N samplers, as WALL-E times the collection of 20K samples per iteration
(writes benchmarks/results/sampler_scaling.json); with ``--batch 0`` every sampler collects
``--fragment-length`` steps per round whatever N is, so the batch grows with N and short
rounds expose per-round overheads and stragglers (writes
benchmarks/results/sampler_scaling_fixed_fragment.json).

Target: speedup >= 0.85 * N for every N up to 32.
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
import time

import ray
from omegaconf import DictConfig, OmegaConf

from common import write_result
from walle_ray.config import EnvConfig, ModelConfig
from walle_ray.envs import env_spaces
from walle_ray.models import make_actor_critic
from walle_ray.actors.sampler import Sampler
from walle_ray.algos.spec import fragment_sampler_args
from walle_ray.runtime.remote import RemoteParameterServer, RemoteSampler, SlotSpec

NAME = "sampler_scaling"
EFFICIENCY_TARGET = 0.85
SAMPLER_SHARE = 0.9  # of the cluster's CPUs for samplers; the rest keeps the PS schedulable
GAMMA = 0.99


def sleep_env(step_s: float, length: int) -> DictConfig:
    return OmegaConf.structured(EnvConfig(name="sleep", id="walle/Sleep-v0", envs_per_sampler=1,
                                          kwargs={"step_s": step_s, "length": length}))


def start_param_server(env_cfg: DictConfig, model_cfg: DictConfig):
    """A parameter server holding version 0 of a fresh policy for this env."""
    obs_space, action_space = env_spaces(env_cfg)
    model = make_actor_critic(obs_space, action_space, model_cfg, env_cfg.normalize_obs)
    ps = RemoteParameterServer.options(num_cpus=0.01).remote()
    ray.get(ps.publish.remote(0, [ray.put(model.get_weights())]))
    return ps


def sampler_cpus(n: int, cluster_cpus: float) -> float:
    """Equal shares of ``SAMPLER_SHARE`` of the cluster, floored to Ray's 1e-4 resolution."""
    share = SAMPLER_SHARE * cluster_cpus / max(n, 2)
    return math.floor(share * 1e4) / 1e4


def collect_round(samplers: list) -> list[dict]:
    """One fragment from every sampler in parallel; only the stats are fetched.

    The rollout refs die with this frame, so the fragments do not pile up in the store.
    """
    outs = [s.collect.remote(0) for s in samplers]
    return [stats for [stats] in ray.get([stats for _, stats in outs])]


def measure(n: int, ps, env_cfg: DictConfig, model_cfg: DictConfig, args) -> dict:
    """Start N samplers, warm them up, time ``args.rounds`` rounds, then kill them."""
    cpus = sampler_cpus(n, args.cpus)
    length = math.ceil(args.batch / n) if args.batch else args.fragment_length
    samplers = [RemoteSampler.options(num_cpus=cpus).remote(
        ps, [SlotSpec(Sampler, fragment_sampler_args(env_cfg, model_cfg, length, GAMMA, i,
                                                     args.seed))]) for i in range(n)]
    try:
        collect_round(samplers)  # waits for the actors to start and pull weights
        t0 = time.perf_counter()
        stats = [s for _ in range(args.rounds) for s in collect_round(samplers)]
        elapsed = time.perf_counter() - t0
    finally:
        for s in samplers:
            ray.kill(s)
    steps = sum(s["env_steps"] for s in stats)
    collect_s = [s["collect_s"] for s in stats]
    return {"samplers": n, "num_cpus_per_sampler": cpus, "rounds": args.rounds,
            "fragment_length": length, "ideal_fragment_s": length * args.step_s,
            "env_steps": steps, "elapsed_s": elapsed, "env_steps_per_s": steps / elapsed,
            "round_s_mean": elapsed / args.rounds,
            "fragment_s_median": statistics.median(collect_s),
            "fragment_s_max": max(collect_s)}


def add_speedup(rows: list[dict]) -> None:
    """Speedup over N=1, efficiency and whether each N meets the target, in place."""
    base = next(r["env_steps_per_s"] for r in rows if r["samplers"] == 1)
    for r in rows:
        r["speedup"] = r["env_steps_per_s"] / base
        r["efficiency"] = r["speedup"] / r["samplers"]
        r["met_target"] = r["efficiency"] >= EFFICIENCY_TARGET


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samplers", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32],
                   help="sampler counts to measure; must include 1 (the baseline)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per sampler count")
    p.add_argument("--batch", type=int, default=6400,
                   help="env steps per round split over the samplers (WALL-E); 0: fixed fragments")
    p.add_argument("--fragment-length", type=int, default=50,
                   help="env steps per sampler per round when --batch is 0")
    p.add_argument("--step-s", type=float, default=0.005, help="seconds each env step sleeps")
    p.add_argument("--cpus", type=int, default=2, help="logical CPUs of the local Ray instance")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="print the result instead of writing it")
    args = p.parse_args()
    if 1 not in args.samplers:
        p.error("--samplers must include 1: speedups are relative to one sampler")

    ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level="ERROR")
    env_cfg = sleep_env(args.step_s, length=200)
    model_cfg = OmegaConf.structured(ModelConfig())
    ps = start_param_server(env_cfg, model_cfg)
    rows = []
    for n in sorted(set(args.samplers)):
        rows.append(measure(n, ps, env_cfg, model_cfg, args))
        print(f"N={n:3d}: {rows[-1]['env_steps_per_s']:8.1f} env steps/s, "
              f"round {rows[-1]['round_s_mean']:.3f} s", flush=True)
    add_speedup(rows)
    ray.shutdown()

    result = {
        "command": shlex.join(["python", *sys.argv]),
        "target": {"speedup_at_least": f"{EFFICIENCY_TARGET} * N", "for_samplers": "N <= 32"},
        "setup": {"env_id": env_cfg.id, "env_kwargs": OmegaConf.to_container(env_cfg.kwargs),
                  "envs_per_sampler": env_cfg.envs_per_sampler, "ray_num_cpus": args.cpus,
                  "protocol": (f"fixed batch of {args.batch} env steps per round, split over N"
                               if args.batch else
                               f"fixed fragment of {args.fragment_length} env steps per sampler"),
                  "ideal_env_steps_per_s_per_sampler": 1 / args.step_s},
        "per_samplers": rows,
        "met_target": all(r["met_target"] for r in rows),
    }
    write_result(NAME if args.batch else f"{NAME}_fixed_fragment", result, args.dry_run)


if __name__ == "__main__":
    main()

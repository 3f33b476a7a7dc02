"""Fleet overhead: env steps/s of N sampler actors on the whole machine against N bare loops.

    python benchmarks/fleet_overhead.py [--env cartpole|halfcheetah|pong] [--samplers N]
                                        [--fragment-length L] [--seconds 10] [--repeats 3]

``sampling_overhead`` times one sampler while the other CPU idles, so the work a Ray call
causes on the receiving side (the driver, a memory, the parameter server) runs there for
free. Here every CPU is busy, as in a run with ``topology=<N>a1m1l``. Four ways, each for
``--seconds``, all at once on the machine, ``--repeats`` times in turn:

  bare        N plain processes (no Ray), each the bare loop of ``sampling_overhead``: the
              same envs and policy as a sampler, in as many processes as the fleet has;
  bare_cpus   the same in one process per CPU: the most these envs give on this machine;
  fleet       N ``RemoteSampler`` actors with the CPU shares and pinning walle_ray gives
              ``<N>a1m1l``, asked for a fragment each at once, the fragments' refs passed to
              a memory (a sink that drops them), as ``RayFleet.step`` does for
              synchronous PPO;
  stream      the same actors streaming into the sink, each asking the parameter server
              for newer weights before each fragment, as IMPALA's do.

Overhead = 1 - way / bare, the median over repeats of each repeat's ratio. With no
``--fragment-length``, each path runs at its algorithm's default length for ``<N>a1m1l``:
request/response at PPO's (its preset's ``batch_size`` over N samplers and their envs),
streaming at 20 steps for Pong (``preset=impala_pong``) and 128 otherwise. Writes
benchmarks/results/fleet_overhead_<env>_<N>a.json. Target: under 10%, as for
``sampling_overhead``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shlex
import statistics
import sys
import time

import ray
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from common import write_result
from sampling_overhead import (GAMMA, TARGET_OVERHEAD, Sink, bare_loop, default_length,
                               load_env_cfg, policy)
from walle_ray.config import CONF_DIR
from walle_ray.algos import algorithm_for
from walle_ray.algos import register_configs
from walle_ray.config import ModelConfig, TopologyConfig
from walle_ray.envs import env_spaces
from walle_ray.models import make_actor_critic
from walle_ray.runtime.role_setup import pins_samplers
from walle_ray.runtime.preload import worker_runtime_env
from walle_ray.algos.spec import fragment_sampler_args
from walle_ray.actors.sampler import Sampler
from walle_ray.runtime.remote import MemoryRef, RemoteParameterServer, RemoteSampler, SlotSpec
from walle_ray.topology import parse_topology, plan_resources


def default_lengths(env: str, samplers: int) -> tuple[int, int]:
    """(request/response, streaming) fragment lengths for this env and N: PPO's, from the
    config ``python -m walle_ray algo=ppo env=<env> topology.spec=<N>a1m1l`` runs with, and
    the streaming length of ``sampling_overhead``."""
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=["algo=ppo", f"env={env}", f"topology.spec={samplers}a1m1l"])
    ppo_length = algorithm_for(cfg.algo).fragment_length(cfg, parse_topology(cfg.topology.spec))
    return ppo_length, default_length(env)


def bare_process(env_cfg, model_cfg, weights, length: int, seconds: float, ready, start, out) -> None:
    """One plain process: the bare loop for ``seconds`` once ``start`` is set; its steps/s."""
    torch.set_num_threads(1)
    loop = bare_loop(env_cfg, policy(env_cfg, model_cfg, weights), 0)
    loop.run(length)  # warm-up
    ready.release()
    start.wait()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        loop.run(length)
        steps += length * env_cfg.envs_per_sampler
    out.put(steps / (time.perf_counter() - t0))
    loop.close()


def time_bare(env_cfg, model_cfg, weights, processes: int, length: int, seconds: float) -> float:
    """Env steps/s of ``processes`` bare loops running at once, summed."""
    ctx = multiprocessing.get_context("spawn")
    ready, start, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=bare_process,
                         args=(env_cfg, model_cfg, weights, length, seconds, ready, start, out))
             for _ in range(processes)]
    for p in procs:
        p.start()
    for _ in procs:  # every process built and warm before any is timed
        ready.acquire()
    start.set()
    rates = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return sum(rates)


def start_samplers(env_cfg, model_cfg, ps, n: int, length: int, memory=None) -> list:
    """N sampler actors placed and pinned as walle_ray places them for ``<N>a1m1l``."""
    topo = parse_topology(f"{n}a1m1l")
    plan = plan_resources(topo, ray.cluster_resources().get("CPU", 0))
    defaults = OmegaConf.create({"topology": OmegaConf.structured(TopologyConfig)})
    pin = pins_samplers(defaults, n, plan.cluster_cpus)
    samplers = [RemoteSampler.options(num_cpus=plan.sampler_cpus, runtime_env=worker_runtime_env()).remote(
        ps, [SlotSpec(Sampler, fragment_sampler_args(env_cfg, model_cfg, length, GAMMA, i, i,
                                                     bootstrap_value=memory is None),
                      memory=MemoryRef(memory, 0) if memory is not None else None)],
        pin=i if pin else None) for i in range(n)]
    ray.get([s.ready.remote() for s in samplers])
    return samplers


def time_fleet(env_cfg, model_cfg, ps, box, n: int, length: int, seconds: float) -> float:
    """Env steps/s of N samplers asked for a fragment each at once, round after round."""
    sink = Sink.remote()
    samplers = start_samplers(env_cfg, model_cfg, ps, n, length)

    def round_() -> None:
        calls = [s.collect.remote(0, box) for s in samplers]
        ray.get([stats for _, stats in calls])
        ray.get([sink.put.remote([rollout]) for rollout, _ in calls])  # the ref, not the data

    try:
        round_()  # warm-up
        rounds, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            round_()
            rounds += 1
        return rounds * n * length * env_cfg.envs_per_sampler / (time.perf_counter() - t0)
    finally:
        for handle in (*samplers, sink):
            ray.kill(handle)


def time_stream(env_cfg, model_cfg, ps, n: int, length: int, seconds: float) -> float:
    """Env steps/s of N samplers streaming into a memory at once, for about ``seconds``."""
    sink = Sink.remote()
    samplers = start_samplers(env_cfg, model_cfg, ps, n, length, memory=sink)
    try:
        t0 = time.perf_counter()
        ray.get([s.run.remote(2) for s in samplers])  # warm-up, and the time of 2 fragments
        fragments = max(4, round(seconds / ((time.perf_counter() - t0) / 2)))
        t0 = time.perf_counter()
        ray.get([s.run.remote(fragments) for s in samplers])
        return n * fragments * length * env_cfg.envs_per_sampler / (time.perf_counter() - t0)
    finally:
        for handle in (*samplers, sink):
            ray.kill(handle)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", choices=("cartpole", "halfcheetah", "pong"), default="halfcheetah")
    p.add_argument("--samplers", type=int, default=8, help="N, as in topology=<N>a1m1l")
    p.add_argument("--fragment-length", type=int, default=None,
                   help="steps per env per fragment for both paths (default: each path's own)")
    p.add_argument("--seconds", type=float, default=10.0, help="timed seconds per way and repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dry-run", action="store_true", help="print the result instead of writing it")
    args = p.parse_args()

    env_cfg = load_env_cfg(args.env)
    rr_length, stream_length = default_lengths(args.env, args.samplers)
    if args.fragment_length is not None:
        rr_length = stream_length = args.fragment_length
    model_cfg = OmegaConf.structured(ModelConfig())
    obs_space, action_space = env_spaces(env_cfg)
    torch.manual_seed(0)
    weights = make_actor_critic(obs_space, action_space, model_cfg, env_cfg.normalize_obs).get_weights()
    cpus = multiprocessing.cpu_count()

    ray.init(num_cpus=cpus, include_dashboard=False, logging_level="ERROR")
    ps = RemoteParameterServer.options(num_cpus=0.01).remote()
    box = [ray.put(weights)]
    ray.get(ps.publish.remote(0, box))
    rates: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        measured = {
            "bare": time_bare(env_cfg, model_cfg, weights, args.samplers, rr_length, args.seconds),
            "bare_cpus": time_bare(env_cfg, model_cfg, weights, cpus, rr_length, args.seconds),
            "fleet": time_fleet(env_cfg, model_cfg, ps, box, args.samplers, rr_length, args.seconds),
            "stream": time_stream(env_cfg, model_cfg, ps, args.samplers, stream_length, args.seconds),
        }
        for name, rate in measured.items():
            rates.setdefault(name, []).append(rate)
        print({name: round(rate) for name, rate in measured.items()}, flush=True)
    ray.shutdown()

    def slower(way: str, than: str = "bare") -> float:
        return 1 - statistics.median(a / b for a, b in zip(rates[way], rates[than]))

    overhead, overhead_stream = slower("fleet"), slower("stream")
    print(f"{args.env}, {args.samplers} samplers on {cpus} CPUs: overhead {overhead:.1%} "
          f"(request/response, {rr_length}-step fragments), {overhead_stream:.1%} (streaming, "
          f"{stream_length}); against one bare loop per CPU {slower('fleet', 'bare_cpus'):.1%} "
          f"and {slower('stream', 'bare_cpus'):.1%}")
    result = {
        "command": shlex.join(["python", *sys.argv]),
        "target": {"overhead_below": TARGET_OVERHEAD},
        "setup": {"env_id": env_cfg.id, "envs_per_sampler": env_cfg.envs_per_sampler,
                  "samplers": args.samplers, "cpus": cpus,
                  "fragment_length_request_response": rr_length,
                  "fragment_length_streaming": stream_length, "seconds": args.seconds,
                  "repeats": args.repeats, "model": "ModelConfig defaults", "torch_threads": 1},
        "env_steps_per_s": rates,
        "env_steps_per_s_median": {name: statistics.median(v) for name, v in rates.items()},
        "overhead": overhead,
        "overhead_streaming": overhead_stream,
        # Against the most the machine gives: one bare loop per CPU, no oversubscription.
        "overhead_vs_bare_cpus": slower("fleet", "bare_cpus"),
        "overhead_streaming_vs_bare_cpus": slower("stream", "bare_cpus"),
        "slowdown_bare_oversubscribed": slower("bare", "bare_cpus"),
        "met_target": overhead < TARGET_OVERHEAD,
        "met_target_streaming": overhead_stream < TARGET_OVERHEAD,
    }
    name = f"fleet_overhead_{args.env}_{args.samplers}a"
    if args.fragment_length is not None:
        name += f"_f{args.fragment_length}"
    write_result(name, result, args.dry_run)


if __name__ == "__main__":
    main()

"""IMPALA Pong as typed: agent steps/s on this machine, where its CPU goes, and EnvPool's rate.

    python benchmarks/impala_pong_throughput.py [--topologies 2a1m1l 32a4m4l] [--seconds 120]
                                                [--isa avx2] [--name N]
    python benchmarks/impala_pong_throughput.py --vs OVERRIDE [OVERRIDE ...] [--rounds 3]

1. The command as typed, ``python -m walle_ray algo=impala env=pong topology=T``, for
   ``--seconds`` each: the agent steps/s the samplers delivered and the learner consumed
   after the first 45 s (start-up left out), the rows the learner trained on per second
   (fresh and replayed), the policy lag, and the share of the machine's CPU each kind of
   process took over 20 s of the steady state (read from /proc).
2. Each part alone on one core, in this process, with the preset's settings: the ALE vector
   env (the samplers' env, random actions), EnvPool's Atari env on the same frames (one and
   two threads; an optional extra, ``pip install envpool``), one sampler (env, policy and
   writer), the policy's forward pass per observation, and one learner update.
3. From 2, the rate two cores could reach if nothing but those parts ran (each agent step
   costs a sampler step and the learner's share of an update), beside the rate measured.

``--vs`` measures only step 1, the command as typed against the same with the overrides
given, alternating (the order swapped every round), and records each round's ratio.

``--isa avx2`` caps torch and oneDNN at AVX2 for every process, as on a CPU without AVX-512
(``model.bf16=auto`` then stays float32), and names the result ``..._avx2``. The CPU is
recorded in the JSON. Goal: at least 2500 agent steps/s as typed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

from common import ROOT, write_result

GOAL = 2500
AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
KINDS = {"ray::SamplerWorker": "samplers", "ray::LearnerWorker": "learners",
         "ray::AsyncMemoryWorker": "memories", "ray::ParameterServerWorker": "parameter server",
         "raylet": "ray (raylet, gcs, dashboard)", "gcs_server": "ray (raylet, gcs, dashboard)",
         "dashboard": "ray (raylet, gcs, dashboard)", "-m walle_ray": "driver"}


def cpu_by_kind(seconds: float) -> dict[str, float]:
    """CPUs each kind of process used over ``seconds`` (a share of one CPU each)."""
    import psutil

    def snap():
        out = {}
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                cmd = " ".join(p.info["cmdline"] or [])
                kind = next((k for key, k in KINDS.items() if key in cmd), None)
                if kind:
                    t = p.cpu_times()
                    out[p.pid] = (kind, t.user + t.system)
            except psutil.Error:
                pass
        return out
    before = snap()
    time.sleep(seconds)
    after = snap()
    used: dict[str, float] = {}
    for pid, (kind, cpu) in after.items():
        if pid in before:
            used[kind] = used.get(kind, 0.0) + (cpu - before[pid][1]) / seconds
    return {k: round(v, 3) for k, v in sorted(used.items())}


def as_typed(topology: str, seconds: float, env: dict, overrides: tuple = ()) -> dict:
    """One run of the headline command (with ``overrides`` after it); its steady rates and
    the CPU of each process kind."""
    from walle_ray.logging.metrics import read_metrics

    run_dir = ROOT / "runs" / f"bench_pong_throughput_{topology}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a run directory is never reused
    cmd = [sys.executable, "-m", "walle_ray", "algo=impala", "env=pong", f"topology={topology}",
           *overrides, f"run.max_wall_s={seconds}", "run.report_every_s=5",
           f"hydra.run.dir={run_dir}", "logger.progress=off"]
    print("$", " ".join(cmd[1:]), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    shares: dict = {}
    sampler = threading.Thread(target=lambda: (time.sleep(min(60.0, seconds / 2)),
                                               shares.update(cpu_by_kind(20.0))))
    sampler.start()
    proc.wait(timeout=seconds + 600)
    sampler.join()
    records = read_metrics(run_dir / "metrics.jsonl")
    steady = [r for r in records if r["wall_s"] >= 45]
    base = next(r for r in reversed(records) if r["wall_s"] < 45)
    span = steady[-1]["wall_s"] - base["wall_s"]
    rate = lambda key: (steady[-1][key] - base[key]) / span  # noqa: E731
    return {"topology": topology, "overrides": list(overrides),
            "agent_steps_per_s": rate("env_steps"),
            "learner_steps_per_s": rate("env_steps_consumed"),  # fresh and replayed
            "updates_per_s": rate("updates"),
            "policy_lag_mean": statistics.mean(r["policy_lag_mean"] or 0 for r in steady),
            "learner_busy": statistics.mean(r["learner_busy"] for r in steady),
            "first_update_s": next((r["first_update_s"] for r in records if "first_update_s" in r),
                                   None),
            "cpu_by_process_kind": shares, "cpu_total": round(sum(shares.values()), 3)}


def parts_alone(seconds: float) -> dict:
    """Each part of the hot path alone on one core, with the preset's settings."""
    import torch
    from hydra import compose, initialize_config_dir

    from walle_ray.algos import algorithm_for
    from walle_ray.batch import Rollout
    from walle_ray.algos import register_configs
    from walle_ray.config import CONF_DIR
    from walle_ray.envs import env_spaces
    from walle_ray.envs.atari import ale_game_name
    from walle_ray.learners.collective import Collective
    from walle_ray.runtime.process import keep_freed_memory
    from walle_ray.topology import parse_topology

    torch.set_num_threads(1)
    keep_freed_memory()
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=["algo=impala", "env=pong", "topology=2a1m1l"])
    e, n = cfg.env, cfg.env.envs_per_sampler
    out = {"obs_size": e.obs_size, "envs_per_sampler": n, "batch_size": cfg.algo.batch_size,
           "fragment_length": cfg.algo.fragment_length}

    def timed(step, count: int) -> float:
        step()
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            step()
            done += count
        return done / (time.perf_counter() - t0)

    import ale_py

    ale = ale_py.AtariVectorEnv(ale_game_name(e.id), n, num_threads=1, img_height=e.obs_size,
                                img_width=e.obs_size, grayscale=True, stack_num=e.frame_stack,
                                frameskip=e.frame_skip, repeat_action_probability=0.0)
    ale.reset(seed=0)
    rng = np.random.default_rng(0)
    out["ale_steps_per_s_1_thread"] = timed(lambda: ale.step(rng.integers(0, 6, n)), n)
    ale.close()
    try:
        import envpool

        for threads, envs in ((1, n), (2, 2 * n)):
            pool = envpool.make("Pong-v5", env_type="gymnasium", num_envs=envs, batch_size=envs,
                                num_threads=threads, img_height=e.obs_size, img_width=e.obs_size,
                                stack_num=e.frame_stack, frame_skip=e.frame_skip,
                                repeat_action_probability=0.0, episodic_life=False,
                                reward_clip=True)
            pool.reset()
            out[f"envpool_steps_per_s_{threads}_thread"] = timed(
                lambda: pool.step(rng.integers(0, 6, envs)), envs)
            pool.close()
        out["envpool_version"] = envpool.__version__
    except ImportError:
        out["envpool_version"] = None  # an optional extra: pip install envpool

    topo = parse_topology(cfg.topology.spec)
    algo = algorithm_for(cfg.algo)
    cls, args, kwargs = algo.sampler(cfg, topo, 0)
    sampler = cls(*args, **kwargs)
    obs_space, action_space = env_spaces(cfg.env)
    version, weights = algo.build_learner(cfg, obs_space, action_space).weights()
    sampler.set_weights(weights, version)
    out["sampler_steps_per_s"] = timed(sampler.collect, cfg.algo.fragment_length * n)
    fragments = [sampler.collect()[0] for _ in range(-(-cfg.algo.batch_size // n))]
    sampler.close()

    model = algo.make_model(obs_space, action_space, cfg).eval()
    obs = torch.from_numpy(fragments[0].obs_t[0])
    with torch.inference_mode():
        out["forward_us_per_obs"] = 1e6 / timed(lambda: model(obs), len(obs))

    model = algo.make_model(obs_space, action_space, cfg)
    update = algo.make_update(cfg, model, Collective(), torch.device("cpu"))
    from walle_ray.batch import concat_rollouts

    batch = concat_rollouts(fragments).rows(slice(0, cfg.algo.batch_size))
    batch = Rollout(**{**batch.__dict__, "replayed_b": np.arange(cfg.algo.batch_size) % 2 == 1})
    out["learner_rows_per_s"] = timed(lambda: update.update([batch], 0), batch.num_steps)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--topologies", nargs="*", default=["2a1m1l", "32a4m4l"])
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--part-seconds", type=float, default=5.0)
    p.add_argument("--isa", choices=("native", "avx2"), default="native")
    p.add_argument("--name", default=None)
    p.add_argument("--vs", nargs="+", default=None, metavar="OVERRIDE",
                   help="measure the command as typed against it with these overrides")
    p.add_argument("--rounds", type=int, default=3, help="with --vs: rounds of each")
    args = p.parse_args()
    env = dict(os.environ)
    if args.isa == "avx2":
        env.update(AVX2)
        os.environ.update(AVX2)  # this process's parts too (set before torch is imported)
    name = args.name or ("impala_pong_throughput" + ("_vs" if args.vs else "")
                         + ("_avx2" if args.isa == "avx2" else ""))
    if args.vs:
        return versus(args, env, name)
    parts = parts_alone(args.part_seconds)
    print(json.dumps(parts), flush=True)
    runs = [as_typed(t, args.seconds, env) for t in args.topologies]
    for r in runs:
        print(json.dumps(r), flush=True)
    # Two cores' worth of the parts: a fresh agent step costs a sampler step and, with a
    # replayed share, 1 / fresh-share rows of learning.
    from hydra import compose, initialize_config_dir

    from walle_ray.config import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=["algo=impala", "env=pong"])
    fresh = sum(r.ratio for r in cfg.algo.replay if r.type == "queue") or 1.0
    per_step_s = 1 / parts["sampler_steps_per_s"] + 1 / (fresh * parts["learner_rows_per_s"])
    bound = 2 / per_step_s
    best = max(r["agent_steps_per_s"] for r in runs)
    write_result(name, {
        "command": "python benchmarks/impala_pong_throughput.py " + " ".join(sys.argv[1:]),
        "isa": args.isa, "goal": {"agent_steps_per_s": GOAL},
        "parts_alone_one_core": parts, "as_typed": runs,
        "two_cores_of_the_parts_alone": bound,
        "best_agent_steps_per_s": best, "met_goal": best >= GOAL,
    })


def versus(args, env: dict, name: str) -> None:
    """The command as typed against it with ``args.vs``, alternating, ``args.rounds`` rounds."""
    vs, rounds = tuple(args.vs), []
    for i in range(args.rounds):
        for t in args.topologies:
            runs = {o: as_typed(t, args.seconds, env, o) for o in ([(), vs], [vs, ()])[i % 2]}
            base, other = runs[()], runs[vs]
            rounds.append({"round": i, "topology": t, "as_typed": base, "with": other,
                           "ratio": other["agent_steps_per_s"] / base["agent_steps_per_s"]})
            print(t, i, base["agent_steps_per_s"], other["agent_steps_per_s"], flush=True)
    write_result(name, {
        "command": "python benchmarks/impala_pong_throughput.py " + " ".join(sys.argv[1:]),
        "isa": args.isa, "goal": {"agent_steps_per_s": GOAL}, "vs": args.vs,
        "rounds": rounds,
        "median_ratio": {t: statistics.median(r["ratio"] for r in rounds if r["topology"] == t)
                         for t in args.topologies},
    })


if __name__ == "__main__":
    main()

"""``topology=auto``'s calibration: the costs of ``autoplan.Costs`` measured in this process,
in a few seconds, with the run's own algorithm, env and network, and kept in a cache.

Every role runs here, as ``topology=local`` runs them (``LocalFleet``): a sampler with the
env's ``envs_per_sampler`` collects, and the learner updates on what it collected, as the
run would. CPU time (``time.process_time``, every thread of this process: an env's thread,
torch's intra-op threads) is read around each part:

- the sampler's collect, per agent step, with one torch thread and after its first fragment;
  a synchronous algorithm's sampler also at the run's other width (all its envs in one
  sampler), which splits off an act's fixed part;
- the learner's update, per update, with one torch thread and then two (where a node has
  two CPUs), after the first updates (which build and compile);
- the memories' ``put`` and ``sample``, per agent step (asynchronous algorithms);
- agent steps per update: what was collected over the updates it fed.

The cache (``$WALLE_CACHE_DIR`` or ``~/.cache/walle_ray``, ``auto/<key>.json``) is keyed by
the CPU, torch's version, the run's algo, env and model sections and ``learner.num_gpus``;
only its numbers are read, each checked (``Costs.from_json``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import platform
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from walle_ray.autoplan import Costs
from walle_ray.config import ConfigError
from walle_ray.runtime.files import write_text_atomic
from walle_ray.runtime.process import usable_cpus
from walle_ray.topology import parse_topology

FORMAT = 2  # 2: Costs.split_work
WARMUP_UPDATES = 2  # updates left out of the timing: the first build and compile


def cache_dir() -> Path:
    return Path(os.environ.get("WALLE_CACHE_DIR") or Path.home() / ".cache" / "walle_ray") / "auto"


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name with its family and model numbers (Linux: /proc/cpuinfo, or the
    text given), since a virtual machine's name can be as plain as "AMD EPYC" for CPUs of
    different generations; else what the platform module says."""
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
        fields: dict[str, str] = {}
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if not key.strip():
                break  # the first CPU's block ends
            fields.setdefault(key.strip(), value.strip())
        if "model name" in fields:
            numbers = ", ".join(f"{key} {fields[key]}" for key in ("cpu family", "model")
                                if key in fields)
            return f"{fields['model name']} ({numbers})" if numbers else fields["model name"]
    except OSError:
        pass
    return platform.processor() or "unknown"


def cache_key(cfg: DictConfig, threads: list[int]) -> tuple[str, dict]:
    """The cache file's name and what it was made from."""
    what = {"format": FORMAT, "cpu": cpu_model(), "capability": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__, "threads": threads,
            **{key: OmegaConf.to_container(cfg[key], resolve=True)
               for key in ("algo", "env", "model")},
            "gpus_per_learner": float(cfg.learner.num_gpus)}
    text = json.dumps(what, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20], what


def learner_counts(cfg: DictConfig, algo) -> tuple[int, ...]:
    """The learner counts (up to 8) the algorithm's rule accepts with this config's batch."""
    counts = []
    for n in (1, 2, 4, 8):
        trial = copy.deepcopy(cfg)
        trial.topology.spec = f"{n}a{n}m{n}l"
        try:
            algo.validate(trial)
        except ConfigError:
            continue
        counts.append(n)
    return tuple(counts) or (1,)


def local_cfg(cfg: DictConfig, envs: int) -> DictConfig:
    """The run's config with every role in this process and one sampler of ``envs`` envs
    (a synchronous algorithm's fragment length is then its batch over those envs)."""
    trial = copy.deepcopy(cfg)
    trial.env.envs_per_sampler = envs
    trial.topology.spec = "local"
    return trial


class _Clock:
    """CPU seconds and calls of one wrapped method."""

    def __init__(self, on: bool = True):
        self.cpu, self.wall, self.calls, self.on = 0.0, 0.0, 0, on
        self.last = None  # what the last call returned

    def wrap(self, fn):
        def timed(*args, **kwargs):
            c0, w0 = time.process_time(), time.perf_counter()
            try:
                self.last = fn(*args, **kwargs)
                return self.last
            finally:
                if self.on:
                    self.cpu += time.process_time() - c0
                    self.wall += time.perf_counter() - w0
                    self.calls += 1
        return timed


def _measure(cfg: DictConfig, algo, obs_space, action_space, budget_s: float,
             thread_counts: list[int]) -> dict:
    """Run the roles here for ``budget_s``: sampler CPU per agent step, update CPU per
    update for each of ``thread_counts``, memory CPU per agent step, agent steps per update."""
    from walle_ray.runtime.fleet import LocalFleet

    trial = local_cfg(cfg, cfg.env.envs_per_sampler)
    trial.learner.torch_threads = 1  # each phase sets the threads it times, not the fleet
    fleet = LocalFleet(trial, algo, parse_topology("local"), obs_space, action_space)
    sampler, memory = _Clock(on=False), _Clock()  # the first fragment builds what it needs
    learner = {t: _Clock() for t in thread_counts}
    before = torch.get_num_threads()
    steps = updates = counted_steps = sampler_steps = 0
    try:
        for s in fleet.samplers:
            s.collect = sampler.wrap(s.collect)
        for m in fleet.memories:
            for name in ("put", "sample", "feedback"):
                if hasattr(m, name):
                    setattr(m, name, memory.wrap(getattr(m, name)))
        update = fleet.learner.update
        free_running = any(getattr(m, "free_running", False) for m in fleet.memories)
        fleet.start()
        start = time.perf_counter()
        for phase, t in enumerate(thread_counts):
            torch.set_num_threads(t)
            clock = learner[t]
            fleet.learner.update = clock.wrap(update)
            phase_end = start + budget_s * (phase + 1) / len(thread_counts)
            while True:
                clock.on = updates >= WARMUP_UPDATES  # the first ones build and compile
                # Samplers run one torch thread: their fragments are measured in the first
                # phase only, after the first (which builds what it needs).
                sampler.on = phase == 0 and steps > 0
                step = fleet.step(steps)
                got = sum(r["env_steps"] for r in step.reports)
                steps += got
                sampler_steps += got if sampler.on else 0
                updates += sum(int(m.get("updates", 1)) for m in step.learned)
                counted_steps += got if clock.on else 0
                now = time.perf_counter()
                if (now >= phase_end and clock.calls >= 2) or now > start + 3 * budget_s:
                    break
    finally:
        torch.set_num_threads(before)
        fleet.shutdown()
    counted = sum(c.calls for c in learner.values())
    fragment = sampler.last[0] if sampler.last else None
    return {"sampler_cpu": sampler.cpu, "sampler_steps": sampler_steps, "steps": steps,
            "memory_cpu": memory.cpu, "free_running": free_running,
            "move_s": _move_s(fragment, sampler.last[1]["env_steps"]) if fragment else 0.0,
            "update_s": {t: c.wall / c.calls for t, c in learner.items() if c.calls},
            "update_cpu_s": {t: c.cpu / c.calls for t, c in learner.items() if c.calls},
            "steps_per_update": counted_steps / counted if counted else 0.0}


def _move_s(fragment, steps: int, times: int = 5) -> float:
    """CPU seconds per agent step to move ``fragment`` (of ``steps`` agent steps) between
    processes once: Ray's put in the writer and get in the reader (here both in this
    process, the object store between them); 0 where Ray is not running."""
    import ray

    if not ray.is_initialized():
        return 0.0
    ray.get(ray.put(fragment))  # the first put sets up what later ones reuse
    c0 = time.process_time()
    for _ in range(times):
        ray.get(ray.put(fragment))
    return (time.process_time() - c0) / times / steps


class _Weights:
    """A weights feed (``contracts.WeightsFeed``) of one fixed set of weights."""

    lead = 0

    def __init__(self, version: int, weights):
        self.version, self.weights = version, weights

    def refresh(self, sampler) -> None:
        if sampler.version < self.version:
            sampler.set_weights(self.weights, self.version)

    def ahead(self) -> None:
        pass


def _sampler_cpu(cfg: DictConfig, algo, obs_space, action_space, envs: int,
                 budget_s: float) -> float:
    """CPU seconds per agent step of a sampler of ``envs`` envs alone, with fresh weights."""
    from walle_ray.actors.restart import RestartingSampler

    trial = local_cfg(cfg, envs)
    s = RestartingSampler(*algo.sampler(trial, parse_topology("local"), 0))
    try:
        feed = _Weights(*algo.build_learner(trial, obs_space, action_space).weights())
        s.collect(feed)  # the first fragment builds what it needs
        c0, steps, t_end = time.process_time(), 0, time.perf_counter() + budget_s
        while time.perf_counter() < t_end or not steps:
            _, stats = s.collect(feed)
            steps += stats["env_steps"]
        return (time.process_time() - c0) / steps
    finally:
        s.close()


def cached_costs(path: Path, loop: str, envs_per_sampler: int) -> Costs | None:
    """The costs a cache file holds for a job of this ``loop`` and ``envs_per_sampler``; None
    where there is no file, or one damaged or made for another job (measured again then)."""
    try:
        costs = Costs.from_json(json.loads(path.read_text())["costs"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return costs if (costs.loop, costs.envs_per_sampler) == (loop, envs_per_sampler) else None


def calibrate(cfg: DictConfig, algo, obs_space, action_space, biggest_node_cpus: float,
              budget_s: float) -> tuple[Costs, bool]:
    """The run's costs, from the cache or measured in about ``budget_s`` seconds; and
    whether they came from the cache."""
    threads = [1, 2] if min(biggest_node_cpus, usable_cpus()) >= 2 else [1]
    key, what = cache_key(cfg, threads)
    path = cache_dir() / f"{key}.json"
    costs = cached_costs(path, algo.loop, int(cfg.env.envs_per_sampler))
    if costs is not None:
        return costs, True
    sync = algo.loop == "sync"
    envs = int(cfg.env.envs_per_sampler)
    total_envs = 2 * envs if sync else 0  # a synchronous run holds the default topology's envs
    share = 0.35 if sync else 0.0
    measured = _measure(cfg, algo, obs_space, action_space, budget_s * (1 - share), threads)
    if not measured["update_s"] or not measured["sampler_steps"] or (
            not measured["steps_per_update"] and not measured["free_running"]):
        raise ConfigError(f"topology=auto: no learner update in "
                          f"{3 * budget_s * (1 - share):.0f} s of "
                          "calibration (a long warm-up, e.g. algo.learning_starts); give the "
                          "run a topology such as topology=2a1m1l")
    per_step = measured["sampler_cpu"] / measured["sampler_steps"]
    env_s, act_s = per_step, 0.0
    if sync:  # the other width splits the act's fixed part from the per-env work
        wide = _sampler_cpu(cfg, algo, obs_space, action_space, total_envs, budget_s * share)
        narrow = per_step
        act_s = max(0.0, (narrow - wide) / (1 / envs - 1 / total_envs))
        env_s = max(0.0, narrow - act_s / envs)
    costs = Costs(loop=algo.loop, envs_per_sampler=envs, env_s=env_s, act_s=act_s,
                  update_s=measured["update_s"], update_cpu_s=measured["update_cpu_s"],
                  steps_per_update=measured["steps_per_update"], move_s=measured["move_s"],
                  memory_s=(measured["memory_cpu"] / measured["steps"] if not sync else 0.0),
                  free_running=measured["free_running"],
                  total_envs=total_envs, learner_counts=learner_counts(cfg, algo),
                  split_work=algo.work_pieces(cfg),
                  gpus_per_learner=float(cfg.learner.num_gpus))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"made_from": what, "costs": costs.to_json()}, indent=1,
                                       default=str) + "\n")
    return costs, False

"""What a run checks and builds before its loop: the algorithm, the env's spaces and the plan
(``checked_start``), the roles (``make_fleet``), and what a resumed run restores into them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from omegaconf import DictConfig

from walle_ray.algos import algorithm_for, validate
from walle_ray.algos.spec import Algorithm
from walle_ray.config import ConfigError
from walle_ray.datasets import check_datasets, dataset_paths
from walle_ray.envs import env_spaces
from walle_ray.envs.masks import mask_mode
from walle_ray.logging.metrics import keep_records_until
from walle_ray.models.user import check_user_model
from walle_ray.runtime.auto import Auto, is_auto, plan_auto
from walle_ray.runtime.checkpoint import (CheckpointError, first_line, load_checkpoint,
                                          tensors_to_arrays)
from walle_ray.runtime.role_setup import sampler_envs
from walle_ray.runtime.run_dir import check_run_dir
from walle_ray.topology import Topology, check_samplers, parse_topology


@dataclass
class Start:
    """What ``checked_start`` found: everything a run needs before its roles start."""

    algo: Algorithm  # resolved once, and handed to every part
    obs_space: gym.Space
    action_space: gym.Space
    topo: Topology
    auto: Auto | None  # topology=auto's measurements and plan, or None
    offline: bool  # the algorithm reads a dataset: no samplers
    eval_every: int | None  # env steps between evaluations, or None for none
    ckpt: dict | None  # the checkpoint a resumed run starts from
    counters: dict[str, Any]  # env_steps, iterations, ...: the checkpoint's, or zero


def checked_start(cfg: DictConfig, run_dir: Path) -> Start:
    """Every check a run makes before any role starts, in the order a user should hear of
    their faults: the config's ranges, the env's spaces, topology=auto's plan, the user's
    network, the samplers, the algorithm's own checks, datasets, the run directory and the
    checkpoint. Fills in what is decided once for every role (``env.action_mask``, a
    dataset's absolute paths, auto's topology) and seeds torch."""
    algo = algorithm_for(cfg.algo)
    validate(cfg, algo, own_checks=False)
    obs_space, action_space = env_spaces(cfg.env)
    cfg.env.action_mask = mask_mode(obs_space)  # auto decided once, here, for every role
    algo.check_spaces(obs_space, action_space)  # the wrong kind of env is the first thing to say
    auto = ckpt = None
    if is_auto(cfg):  # measure, choose, and write the choice into cfg (runtime/auto.py)
        check_run_dir(run_dir, cfg.run.resume)
        resumed = None
        if cfg.run.resume:  # the plan keeps the memories and learners the checkpoint holds
            ckpt = load_checkpoint(Path(cfg.run.resume))
            check_resume(cfg, ckpt, cfg.run.resume)  # before any calibration
            resumed = resumed_split(ckpt, cfg.run.resume)
        auto = plan_auto(cfg, algo, obs_space, action_space, f"walle_ray-{run_dir.name}",
                         resumed)
    topo = parse_topology(cfg.topology.spec)
    check_user_model(algo, obs_space, action_space, cfg)  # model._target_: one build, one forward
    check_samplers(topo, cfg.algo.name, algo.reads_dataset)
    algo.validate(cfg)
    offline = algo.reads_dataset
    # Offline runs evaluate 20 times over the budget unless told otherwise: evaluation is
    # their only measure of the policy.
    eval_every = cfg.eval.every_env_steps or (max(1, cfg.run.total_env_steps // 20) if offline
                                              else None)
    if offline:
        datasets = check_datasets(dataset_paths(cfg.dataset.path), obs_space, action_space,
                                  cfg.env.id, topo.memories)
        print(f"walle_ray: dataset: {sum(d.episodes for d in datasets)} episodes, "
              f"{sum(d.steps for d in datasets)} steps from "
              f"{', '.join(str(d.path) for d in datasets)}", flush=True)
        # Memories may run in another directory or on another node: they get the data
        # directories as found here, absolute.
        cfg.dataset.path = [str(d.path) for d in datasets]
    check_run_dir(run_dir, cfg.run.resume)  # never another run's files
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.run.resume and ckpt is None:
        ckpt = load_checkpoint(Path(cfg.run.resume))
        check_resume(cfg, ckpt, cfg.run.resume)
    torch.manual_seed(cfg.run.seed)
    counters = dict(ckpt["counters"]) if ckpt else {
        "env_steps": 0, "iterations": 0, "episodes": 0, "wall_s": 0.0, "recent_returns": []}
    return Start(algo=algo, obs_space=obs_space, action_space=action_space, topo=topo,
                 auto=auto, offline=offline, eval_every=eval_every, ckpt=ckpt, counters=counters)


def resumed_split(ckpt: dict, path: str) -> tuple[str, int]:
    """The topology and envs per sampler a checkpoint's run had (a plan's, when topology=auto
    made it): what a resumed auto run keeps."""
    try:
        was = ckpt["config"]
        return str(was["topology"]["spec"]), int(was["env"]["envs_per_sampler"])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"checkpoint in {path} does not say its topology and envs per "
                              "sampler; resume it with a topology, e.g. topology=2a1m1l") from None


def check_resume(cfg: DictConfig, ckpt: dict, path: str) -> None:
    """A resumed run goes on with the algorithm, optimizer, env and action masks it was
    trained with: another algorithm's update would take this one's optimizer state and
    counters as its own. Said before any role starts."""
    trained = (ckpt["config"].get("algo") or {}).get("name")
    if trained is not None and trained != cfg.algo.name:
        raise CheckpointError(f"checkpoint in {path} was trained with algo={trained}, not "
                              f"{cfg.algo.name}; resume it with algo={trained}, or start a new "
                              "run")
    optimizer = (ckpt["config"].get("algo") or {}).get("optimizer")
    if optimizer is not None and optimizer != cfg.algo.get("optimizer"):
        # torch's load_state_dict keeps the checkpoint's optimizer settings, and another
        # optimizer's state would not fit: the run would train with neither as configured
        raise CheckpointError(f"checkpoint in {path} was trained with algo.optimizer={optimizer}, "
                              f"not {cfg.algo.get('optimizer')}; resume it with "
                              f"algo.optimizer={optimizer}")
    old = ckpt["config"].get("env", {})
    for key in ("id", "entry_point"):
        if old.get(key) != cfg.env[key]:
            raise CheckpointError(f"checkpoint in {path} was trained on env.{key}="
                                  f"{old.get(key)!r}, not {cfg.env[key]!r}")
    masked = old.get("action_mask", "none")  # a checkpoint from before masks masked nothing
    if masked != cfg.env.action_mask:
        raise CheckpointError(f"checkpoint in {path} was trained with env.action_mask={masked}, "
                              f"not {cfg.env.action_mask}; resume it with "
                              f"env.action_mask={masked}")


def resume_into(cfg: DictConfig, fleet, ckpt: dict, counters: dict, run_dir: Path) -> None:
    """Load a resumed run's checkpoint into the roles just built, and drop the metrics lines
    the run wrote after it (the resumed run writes those iterations again)."""
    try:
        fleet.load_learner_state(ckpt["learner"])
    except (RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {cfg.run.resume} does not fit this model "
                              f"({first_line(exc)})") from None
    restore_memories(cfg, fleet, ckpt)
    print(f"walle_ray: resumed at {counters['env_steps']} env steps, "
          f"iteration {counters['iterations']}", flush=True)
    dropped = keep_records_until(run_dir / "metrics.jsonl", counters["iterations"])
    if dropped:
        print(f"walle_ray: metrics.jsonl: {dropped} line(s) after the checkpoint dropped; "
              "the resumed run writes those iterations again", flush=True)


def make_fleet(cfg: DictConfig, algo: Algorithm, topo, obs_space, action_space,
               namespace: str = "walle_ray", first: bool = False,
               stall_dir: Path | None = None):
    """A LocalFleet for ``topology=local``, else Ray actors packed into processes
    (``topology.pack``) and placed by the resource plan (``runtime/plan.py``). ``first``:
    the run's first build, which prints the plan and checks its memory against the machine
    before any role starts (a rebuild after a lost role makes the same plan). The stacks of
    stalled roles go to ``stall_dir``.

    Each run's actors live in their own Ray namespace, so two runs on one cluster can both
    name theirs ``walle/sampler-0``.
    """
    from walle_ray.runtime.fleet import LocalFleet
    from walle_ray.runtime.plan import (check_local_memory, check_plan_memory, plan_cpus,
                                        plan_processes)
    from walle_ray.runtime.ray_fleet import RayFleet
    from walle_ray.runtime.ray_init import (check_gpus, check_role_resources, cluster_resources,
                                            live_nodes, placement_lines, start_ray)

    if topo.local:
        if cfg.learner.num_gpus > 0:
            raise ConfigError("learner.num_gpus: topology=local runs on this process's CPU; "
                              "use a Ray topology such as 1a1m1l to place a learner on a GPU")
        if first:
            check_local_memory(cfg, algo, obs_space, action_space)
        return LocalFleet(cfg, algo, topo, obs_space, action_space)
    start_ray(cfg.run.ray_address, cfg.run.ray_num_cpus, namespace=namespace)
    cpus, gpus = cluster_resources()
    check_gpus(topo.learners, cfg.learner.num_gpus, gpus)
    packing, processes = plan_processes(cfg, algo, topo, cpus)
    nodes = live_nodes()
    resources = [node["Resources"] for node in nodes.values()]
    check_role_resources(cfg.topology.resources, {
        "sampler": processes.samplers, "memory": processes.memories,
        "learner": processes.learners, "ps": processes.param_servers}, resources)
    plan = plan_cpus(cfg, algo, topo, processes, cpus, resources)
    if first:
        print(f"walle_ray: {topo} on {cpus:g} CPUs: "
              f"{packing.describe(topo, memories=algo.loop != 'sync')} "
              f"(topology.pack={cfg.topology.pack})", flush=True)
        note = lanes_note(cfg, algo, topo, packing) or crowded_envs(
            topo.samplers, int(cfg.env.envs_per_sampler), cpus)
        if note:
            print(f"walle_ray: {note}", flush=True)
        check_plan_memory(cfg, algo, topo, packing, processes, cpus, obs_space, action_space,
                          resources)
    fleet = RayFleet(cfg, algo, topo, obs_space, action_space, plan, cfg.run.role_timeout_s,
                     packing, stall_dir)
    if len(nodes) > 1:  # where each role process runs, on a cluster
        try:
            placement = fleet.placement()
        except BaseException:
            fleet.shutdown()
            raise
        print(f"walle_ray: role processes on {len(set(placement.values()))} of the cluster's "
              f"{len(nodes)} nodes:", *placement_lines(placement, nodes), sep="\n", flush=True)
    return fleet


ENVS_PER_CPU = 32  # above this, a run's envs each step slowly enough for a note


def crowded_envs(samplers: int, envs_per_sampler: int, cpus: float) -> str | None:
    """A note for a topology whose envs crowd the cluster's CPUs: each env then plays its
    episodes slowly, so the return (the mean of the last finished episodes) and the
    milestones report late (docs/performance.md, "Many envs on few cores"). None otherwise."""
    envs = samplers * envs_per_sampler
    if cpus <= 0 or envs / cpus <= ENVS_PER_CPU:
        return None
    fewer = max(1, int(ENVS_PER_CPU * cpus) // envs_per_sampler)
    return (f"{envs} envs ({samplers} samplers x {envs_per_sampler}) share {cpus:g} CPUs, so "
            "each finishes its episodes slowly and the return and milestones report late by "
            f"about an episode's length; {fewer} samplers or fewer report sooner")


def lanes_note(cfg: DictConfig, algo: Algorithm, topo: Topology, packing) -> str | None:
    """What a run whose sampler processes step their samplers together (``sampler_envs``)
    says at start: how many envs the biggest process steps, and how many in all. None where
    none does."""
    lanes, total = sampler_envs(cfg, algo, topo, packing)
    if not any(lanes):
        return None
    envs = int(cfg.env.envs_per_sampler)
    most = max(range(len(lanes)), key=lambda p: (lanes[p] or 0, len(packing.samplers[p])))
    return (f"the {len(packing.samplers[most])} samplers of a sampler process step {lanes[most]} "
            f"envs together: {total} envs in all, so their episodes end as often as fewer "
            f"samplers' would (env.envs_per_sampler={envs} holds where a process runs one "
            "sampler; topology.lanes=false keeps it everywhere)")


def restore_memories(cfg: DictConfig, fleet, ckpt: dict) -> None:
    """Refill the replay shards from the checkpoint's snapshot (``memory.checkpoint=true``)."""
    if not cfg.memory.checkpoint or "memories" not in ckpt:
        return
    states = tensors_to_arrays(ckpt["memories"])
    if len(states) != fleet.topo.memories:
        raise CheckpointError(f"the checkpoint holds {len(states)} replay shards; this topology "
                              f"has {fleet.topo.memories} memories")
    fleet.load_memory_states(states)
    # IMPALA's mixed memories count rows (``held``), the replay shards transitions (``ids``).
    rows = any("held" in state for state in states)
    held = sum(int(state["held"]) if rows else len(state["ids"]) for state in states)
    print(f"walle_ray: replay restored: {held} {'rows' if rows else 'transitions'} in "
          f"{len(states)} memor{'ies' if len(states) > 1 else 'y'}", flush=True)

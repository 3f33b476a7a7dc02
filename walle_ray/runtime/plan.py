"""A run's plan, made and checked before any role starts: the processes its logical roles
run in (``topology.plan_packing``), the CPUs each asks Ray for (``plan_resources``,
``fit_to_nodes``), and whether they fit the machine's CPUs (``topology.check_shares``) and
memory (``memory_plan``). Nothing here starts a process; ``start.make_fleet`` asks Ray for
what the plan needs and calls these."""

from __future__ import annotations

from dataclasses import replace

import gymnasium as gym
from omegaconf import DictConfig

from walle_ray.algos.spec import Algorithm
from walle_ray.memory_plan import MemoryEstimate, check_memory, check_memory_nodes
from walle_ray.topology import (Packing, ResourcePlan, Topology, check_shares, fit_to_nodes,
                                offers, plan_packing, plan_resources)


def plan_processes(cfg: DictConfig, algo: Algorithm, topo: Topology, cpus: float,
                   pack: str | None = None) -> tuple[Packing, Topology]:
    """How ``topo``'s logical roles pack into processes on ``cpus`` CPUs
    (``topology.pack``, or ``pack``), and the process counts: a synchronous algorithm's
    learners take the fragments, so it starts no memory process."""
    pack = str(cfg.topology.pack if pack is None else pack)
    packing = plan_packing(topo, cpus, int(pack) if pack.isdigit() else pack,
                           cfg.learner.num_gpus, algo.packed_learner is not None,
                           packs_ps=not (cfg.topology.resources or {}).get("ps"))
    processes = packing.processes(topo)
    if algo.loop == "sync":
        processes = replace(processes, memories=0)
    return packing, processes


def fewer_processes(cfg: DictConfig, algo: Algorithm, topo: Topology, cpus: float,
                    processes: Topology) -> str:
    """How to start fewer role processes than ``processes``, as a refusal ends:
    ``topology.pack=auto`` where it packs them into fewer, else a smaller topology."""
    if str(cfg.topology.pack) != "auto":
        auto = plan_processes(cfg, algo, topo, cpus, "auto")[1].total
        if auto < processes.total:
            return f"use topology.pack=auto ({auto} role processes on {cpus:g} CPUs)"
    return "use a topology with fewer samplers, memories or learners"


def plan_cpus(cfg: DictConfig, algo: Algorithm, topo: Topology, processes: Topology,
              cpus: float, nodes: list[dict]) -> ResourcePlan:
    """The CPUs each process asks Ray for: ``plan_resources`` over the cluster's ``cpus``,
    cut to the nodes that ``topology.resources`` confines roles to (``fit_to_nodes``; the
    nodes' Ray ``Resources``), refused where a working process would get too little
    (``check_shares``)."""
    explicit = {"sampler": cfg.topology.sampler_cpus, "learner": cfg.topology.learner_cpus}
    plan = plan_resources(processes, cpus, cfg.learner.num_gpus, cfg.topology.sampler_cpus,
                          cfg.topology.learner_cpus)
    plan = fit_to_nodes(plan, processes, cfg.topology.resources, nodes, explicit)
    check_shares(plan, topo, processes, fewer_processes(cfg, algo, topo, cpus, processes),
                 explicit)
    return plan


def estimate(cfg: DictConfig, algo: Algorithm, processes: int, obs_space: gym.Space,
             action_space: gym.Space) -> MemoryEstimate:
    """The memory of a plan of ``processes`` role processes: theirs and what the
    algorithm's memories hold once full (``Algorithm.memory_needs``)."""
    return MemoryEstimate(processes, tuple(algo.memory_needs(cfg, obs_space, action_space)))


def local_memory() -> float:
    """Bytes this machine has available now (what the OS could give without swapping)."""
    import psutil

    return float(psutil.virtual_memory().available)


def check_local_memory(cfg: DictConfig, algo: Algorithm, obs_space: gym.Space,
                       action_space: gym.Space) -> None:
    """Refuse a ``topology=local`` run whose memories would not fit in what this machine has
    available now: every role runs in this process, which already exists."""
    check_memory(estimate(cfg, algo, 0, obs_space, action_space), local_memory(),
                 "this machine", "local", "")


def check_plan_memory(cfg: DictConfig, algo: Algorithm, topo: Topology, packing: Packing,
                      processes: Topology, cpus: float, obs_space: gym.Space,
                      action_space: gym.Space, nodes: list[dict] | None = None) -> None:
    """Refuse a plan whose memory does not fit (``memory_plan.check_memory``): on one
    machine (a cluster of one node), what it has available now; on a cluster, the memory
    Ray reports for its ``nodes`` (their ``Resources``), and for each memory process the
    largest node it may run on (``topology.resources``). A cluster whose nodes report no
    memory is not checked."""
    plan = estimate(cfg, algo, processes.total, obs_space, action_space)
    fewer = fewer_processes(cfg, algo, topo, cpus, processes)
    if not nodes or len(nodes) == 1:
        check_memory(plan, local_memory(), "this machine", str(topo), fewer)
        return
    total = sum(node.get("memory", 0.0) for node in nodes)
    if not total:
        return
    check_memory(plan, total, f"the cluster's {len(nodes)} nodes", str(topo), fewer)
    asks = {k: v for k, v in ((cfg.topology.resources or {}).get("memory") or {}).items()
            if k not in ("CPU", "GPU")}
    check_memory_nodes(plan.needs, [node.get("memory", 0.0) for node in nodes
                                    if offers(node, asks)],
                       max((len(group) for group in packing.memories), default=1))

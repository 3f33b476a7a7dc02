"""How ``RayFleet`` (``runtime/ray_fleet.py``) starts its role processes: their actor names,
the Ray resources and torch threads each asks for, whether samplers are pinned or step
together, and the learner processes with their torch.distributed group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import gymnasium as gym
from omegaconf import DictConfig, OmegaConf

from walle_ray.runtime.fleet import RoleTimeout
from walle_ray.runtime.preload import role_runtime_env
from walle_ray.topology import (Packing, ResourcePlan, Topology, lane_envs, lane_routes,
                                piece_rows)

if TYPE_CHECKING:
    from walle_ray.algos.spec import Algorithm


def role_name(role: str, group: tuple[int, ...]) -> str:
    """A process's actor name from the logical roles it runs: ``walle/sampler-3``, or
    ``walle/sampler-0,2,4`` for a packed one."""
    return f"walle/{role}-{','.join(map(str, group))}"


def role_resources(cfg: DictConfig, role: str) -> dict[str, float]:
    """The custom Ray resources each process of ``role`` asks for (``topology.resources``)."""
    asks = (cfg.topology.resources or {}).get(role) or {}
    return {name: float(amount) for name, amount in asks.items()}


def make_learners(cfg: DictConfig, algo: Algorithm, packing: Packing, obs_space: gym.Space,
                  action_space: gym.Space, plan: ResourcePlan, timeout_s: float) -> list:
    """Learner processes, one per group of learner shards, each what the algorithm's
    ``learner_spec`` names; with several, they form their torch.distributed group before
    returning."""
    import ray

    from walle_ray.runtime import remote

    threads = cfg.learner.torch_threads or learner_threads(cfg, algo, packing, plan)
    # Unset, a synchronous learner alone on the CPU measures whether its threads pay
    # (``runtime/threads.py``). Not a compiled step, which compiles again for each count,
    # nor several learners, whose optimizer steps must reduce alike.
    choose = (not cfg.learner.torch_threads and algo.loop == "sync" and plan.learner_gpus == 0
              and not cfg.algo.get("compile", False) and len(packing.learners) == 1)
    device = "cuda" if plan.learner_gpus > 0 else "cpu"
    runtime_env = role_runtime_env(cfg.run.ray_preload)
    nodes = learner_nodes(cfg, threads, len(packing.learners), plan.learner_gpus)
    learners = [
        remote.RemoteLearner.options(name=role_name("learner", group), num_cpus=plan.learner_cpus,
                                     num_gpus=plan.learner_gpus, runtime_env=runtime_env,
                                     resources=role_resources(cfg, "learner"),
                                     scheduling_strategy=node_preference(node)).remote(
            algo.learner(cfg, len(group)), obs_space, action_space, device=device, threads=threads,
            choose_threads=choose)
        for group, node in zip(packing.learners, nodes)]
    if len(learners) > 1:
        try:
            backend = None
            if device == "cuda" and shares_a_gpu(ray.get([lr.gpus.remote() for lr in learners],
                                                         timeout=timeout_s)):
                backend = "gloo"
                print(f"walle_ray: learner.num_gpus={plan.learner_gpus:g} puts learners on a "
                      "shared GPU, which NCCL refuses; they reduce through the CPU with gloo",
                      flush=True)
            address, port = ray.get(learners[0].group_address.remote(), timeout=timeout_s)
            ray.get([lr.join_group.remote(address, port, g, len(learners), backend)
                     for g, lr in enumerate(learners)], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RoleTimeout(f"learners did not form their group within {timeout_s:.0f} s") from None
    return learners


def learner_threads(cfg: DictConfig, algo: Algorithm, packing: Packing, plan: ResourcePlan) -> int:
    """Torch threads per learner process when ``learner.torch_threads`` is unset: the CPUs
    Ray gives it, and in a synchronous loop without ``algo.overlap`` also its part of the
    samplers' CPUs, which sit idle while it learns (docs/performance.md, "Overlap or
    threads"). A process that packs several learner shards learns from the rows one learner
    would (``algo.batch_size`` is the whole update's), so it gets no more threads than that
    (docs/performance.md, "A packed learner's threads"). A learner never runs more threads
    than its process may use CPUs (``runtime/process.py``)."""
    cpus = plan.learner_cpus
    if algo.loop == "sync" and not cfg.algo.get("overlap", False):
        samplers = sum(len(group) for group in packing.samplers)
        cpus += samplers * plan.sampler_cpus / len(packing.learners)
        return max(1, round(cpus))
    return max(1, int(cpus))


def learner_nodes(cfg: DictConfig, threads: int, count: int, gpus: float) -> list[str | None]:
    """The node each learner process prefers (None: where Ray places it). A learner that runs
    several threads goes to the node with the most CPUs, the next learner to the next node
    (learners beyond the nodes go where Ray places them):
    placed anywhere, it could land on a small node and run its threads on fewer CPUs, which
    is what ``topology=auto`` plans them for (``autoplan.candidates``). Not where
    ``topology.resources`` places learners, nor for GPU learners, which go where the GPUs are."""
    from walle_ray.runtime.ray_init import live_nodes

    if threads <= 1 or gpus > 0 or role_resources(cfg, "learner"):
        return [None] * count
    by_cpus = sorted(((float(node["Resources"].get("CPU", 0.0)), node_id)
                      for node_id, node in live_nodes().items()), reverse=True)
    nodes = [node_id for cpus, node_id in by_cpus if cpus > 0]
    if len(nodes) < 2:
        return [None] * count
    return [nodes[g] if g < len(nodes) else None for g in range(count)]


def node_preference(node: str | None):
    """A soft node affinity: Ray places the process there when the node has room now,
    elsewhere when it has not (another role or job holds its CPUs) or is gone (a restart
    after a lost node)."""
    if node is None:
        return "DEFAULT"
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node, soft=True, _spill_on_unavailable=True)


def shares_a_gpu(gpus: list[list[tuple[str, str]]]) -> bool:
    """Whether two learner processes hold the same GPU (each given as its (node, GPU id)
    pairs): fractional ``learner.num_gpus`` packs learners onto one GPU."""
    held = [pair for process in gpus for pair in process]
    return len(set(held)) < len(held)


def make_samplers(cfg: DictConfig, algo: Algorithm, topo: Topology, packing: Packing,
                  plan: ResourcePlan, lane_rows: list[int | None], memory_names: dict[int, str],
                  source: str) -> list:
    """Sampler processes, one per group of ``packing.samplers``: each runs its logical
    samplers in turn, or steps them together as one sampler of ``lane_rows[p]`` envs; each
    pulls weights from ``source`` (the parameter server, or learner 0) and, for an
    asynchronous algorithm, pushes into its samplers' memories, named by the process that
    holds each (``memory_names``). Roles are passed by name: an actor handle among the
    constructor arguments would tie Ray's restart of the sampler to that handle's lifetime
    (ray-project/ray#53727)."""
    from walle_ray.runtime import remote

    pin = pins_samplers(cfg, len(packing.samplers), plan.cluster_cpus)
    runtime_env = role_runtime_env(cfg.run.ray_preload)
    # Watched, a process answers on a thread of its own, and its calls run on one of Ray's
    # pool threads; unwatched (run.stall_s=null), on its main thread.
    cls = remote.RemoteSampler if cfg.run.stall_s else remote.RemoteMainThreadSampler
    samplers = []
    for p, (group, lanes) in enumerate(zip(packing.samplers, lane_rows)):
        samplers.append(cls.options(
            name=role_name("sampler", group), num_cpus=plan.sampler_cpus,
            resources=role_resources(cfg, "sampler"), runtime_env=runtime_env,
            max_restarts=-1, max_task_retries=0).remote(
                source, sampler_slots(cfg, algo, topo, group, lanes, memory_names),
                pin=p if pin else None, lanes=group if lanes is not None else None))
    return samplers


def sampler_slots(cfg: DictConfig, algo: Algorithm, topo: Topology, group: tuple[int, ...],
                  lanes: int | None, memory_names: dict[int, str]) -> list:
    """What the sampler process of the logical samplers ``group`` runs: a slot for each of
    them in turn, or, stepping them together, one sampler of ``lanes`` envs as the group's
    first (its index and seed), whose fragments' rows are dealt across the memories; each
    slot with the memories its rows go to (``SlotSpec``). Only the process is named by
    ``group``: two topologies whose processes get the same slots collect the same data."""
    from walle_ray.runtime import remote

    sync, rows = algo.loop == "sync", (cfg.env.envs_per_sampler if algo.deals_rows else None)

    def routes(parts) -> tuple:
        return () if sync else tuple((remote.MemoryRef(memory_names[k], k), part)
                                     for k, part in parts)

    if lanes is None:
        return [remote.SlotSpec(*algo.sampler(cfg, topo, i), routes(topo.routes(i, rows)))
                for i in group]
    lanes_cfg = OmegaConf.merge(cfg, {"env": {"envs_per_sampler": lanes}})
    piece = piece_rows(cfg.env.envs_per_sampler, topo.memories)
    return [remote.SlotSpec(*algo.sampler(lanes_cfg, topo, group[0]),
                            routes(lane_routes(topo, group[0], lanes, piece)))]


def pins_samplers(cfg: DictConfig, processes: int, cluster_cpus: float) -> bool:
    """Whether sampler process p runs pinned to a CPU (``topology.pin_samplers``): only when
    the cluster has a CPU for each sampler process. With more than CPUs, pinned samplers
    cannot move away from each other or the learner (docs/performance.md, "Pinning
    samplers")."""
    return bool(cfg.topology.pin_samplers) and processes <= cluster_cpus


def process_lanes(cfg: DictConfig, algo: Algorithm, topo: Topology,
                  group: tuple[int, ...]) -> int | None:
    """The envs a sampler process running the logical samplers ``group`` steps together
    (``topology.lanes``, ``topology.lane_envs``), or None where it runs them in turn: only an
    asynchronous algorithm whose fragments' rows are dealt across memories (IMPALA) steps
    them together. Synchronous PPO's batch is its samplers' envs times the fragment, and
    Ape-X's samplers each explore with their own epsilon, so theirs keep their envs."""
    if algo.loop == "sync" or not algo.deals_rows or not cfg.topology.lanes:
        return None
    return lane_envs(len(group), int(cfg.env.envs_per_sampler), topo.memories)


def sampler_envs(cfg: DictConfig, algo: Algorithm, topo: Topology,
                 packing: Packing) -> tuple[list[int | None], int]:
    """For each sampler process, the envs it steps together (``process_lanes``; None: its
    samplers in turn, each with ``env.envs_per_sampler``), and the envs all of them step."""
    lanes = [process_lanes(cfg, algo, topo, group) for group in packing.samplers]
    envs = int(cfg.env.envs_per_sampler)
    return lanes, sum(len(group) * envs if rows is None else rows
                      for group, rows in zip(packing.samplers, lanes))

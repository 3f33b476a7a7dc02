"""``topology=auto`` in a run: calibrate (``runtime/calibrate.py``), choose with the model
(``autoplan.choose``), write the choice into the run's config, and choose again when the
cluster's CPUs change (a node lost, a node joined)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from omegaconf import DictConfig

from walle_ray.autoplan import Costs, Plan, choose, predict
from walle_ray.config import ConfigError
from walle_ray.runtime.fleet import RoleDied

AUTO = "auto"
# A grown cluster is re-planned for only when the new plan is predicted this much faster than
# the plan running on it: a re-plan rebuilds every role (docs/topology_auto.md).
REPLAN_GAIN = 0.10


def is_auto(cfg: DictConfig) -> bool:
    return str(cfg.topology.spec).strip().lower() == AUTO


def held(costs: Costs) -> str:
    """What auto leaves as the config says, in words."""
    if costs.loop == "async":
        envs = "env.envs_per_sampler (each fragment's rows)"
    elif costs.split_work:
        envs = (f"env.envs_per_sampler, with the iteration's work ({costs.split_work} "
                "pieces) dealt among the samplers")
    else:
        envs = f"{costs.total_envs} envs in all (the batch over them is the fragment length)"
    return f"held fixed: the algo settings of an update (batch, learning rate) and {envs}"


@dataclass
class Auto:
    """A run's auto plan: the costs it was made from and the nodes' CPUs it was made for."""

    costs: Costs
    plan: Plan
    cpus: list[float]
    cached: bool
    calibrate_s: float
    replans: int = 0

    def to_json(self) -> dict:
        return {"costs": self.costs.to_json(), "plan": self.plan.to_json(), "cpus": self.cpus,
                "cached": self.cached, "calibrate_s": self.calibrate_s,
                "replans": self.replans, "held": held(self.costs)}


def node_cpus() -> list[float]:
    """The CPUs of each live node of the Ray cluster this process is connected to, as far
    as they exist: nodes started on this machine (several raylets, or a node given more
    CPUs than the machine has) share its CPUs, so theirs are scaled to what this process
    may use here. Nodes elsewhere count as Ray reports them."""
    import ray

    from walle_ray.runtime.process import usable_cpus
    from walle_ray.runtime.ray_init import live_nodes

    here = ray.util.get_node_ip_address()
    nodes = [(node.get("NodeManagerAddress"), float(node["Resources"].get("CPU", 0.0)))
             for node in live_nodes().values()]
    nodes = [(address, cpus) for address, cpus in nodes if cpus > 0]
    local = sum(cpus for address, cpus in nodes if address == here)
    scale = min(1.0, usable_cpus() / local) if local else 1.0
    return [cpus * scale if address == here else cpus for address, cpus in nodes] or [1.0]


def apply(cfg: DictConfig, plan: Plan) -> None:
    """Write ``plan`` into the run's config: the topology, envs per sampler, learner threads,
    one process per role. The CPU shares Ray reserves stay the fitted ones (``plan_resources``):
    a learner's threads share the CPUs with the samplers, as the model counts them."""
    cfg.topology.spec = plan.spec
    cfg.topology.pack = "off"  # the model counts a process per role
    cfg.env.envs_per_sampler = plan.envs_per_sampler
    cfg.learner.torch_threads = plan.threads


def plan_auto(cfg: DictConfig, algo, obs_space, action_space, namespace: str,
              resumed: tuple[str, int] | None = None) -> Auto:
    """Calibrate (or read the cache), choose and apply the plan; print the choice. Ray
    starts here, in the run's ``namespace``, to tell the nodes' CPUs. ``resumed``: the
    topology and envs per sampler of the checkpoint a resumed run starts from, whose
    memories and learners the plan keeps (their state is the checkpoint's)."""
    from walle_ray.runtime.calibrate import calibrate, local_cfg
    from walle_ray.runtime.ray_init import start_ray

    if algo.reads_dataset:
        raise ConfigError(f"topology=auto plans samplers, and algo={cfg.algo.name} reads a "
                          "dataset instead; use topology=0a1m1l")
    if cfg.learner.num_gpus:
        raise ConfigError("topology=auto measures learners on this CPU, not on GPUs; with "
                          "learner.num_gpus give a topology, e.g. topology=8a1m1l")
    for key in ("sampler_cpus", "learner_cpus"):
        if cfg.topology[key] is not None:
            raise ConfigError(f"topology.{key}: topology=auto fits the CPU shares itself; "
                              f"leave topology.{key} unset, or give a topology")
    if any((cfg.topology.resources or {}).values()):
        raise ConfigError("topology.resources: topology=auto plans over every node's CPUs and "
                          "cannot tell which nodes your resources confine roles to; give a "
                          "topology, e.g. topology=8a1m1l, or leave topology.resources unset")
    from walle_ray.algos import validate

    trial = local_cfg(cfg, cfg.env.envs_per_sampler)
    validate(trial, algo)  # bad settings are said before any calibration
    start_ray(cfg.run.ray_address, cfg.run.ray_num_cpus, namespace=namespace)
    cpus = node_cpus()
    t0 = time.perf_counter()
    print(f"walle_ray: topology=auto: calibrating on {sum(cpus):g} CPUs in "
          f"{len(cpus)} node(s)...", flush=True)
    costs, cached = calibrate(cfg, algo, obs_space, action_space, max(cpus),
                              cfg.topology.auto_calibrate_s)
    keep = None
    if resumed is not None:
        costs, keep = resuming(costs, *resumed)
    auto = Auto(costs, choose(costs, cpus, keep=keep), cpus, cached, time.perf_counter() - t0)
    apply(cfg, auto.plan)
    how = "costs from the cache" if cached else f"calibrated in {auto.calibrate_s:.0f} s"
    print(f"walle_ray: {auto.plan.line(costs)} ({how}; {held(costs)})", flush=True)
    return auto


def resuming(costs: Costs, spec: str, envs_per_sampler: int) -> tuple[Costs, Plan]:
    """The costs and the plan to keep for a run resumed from a checkpoint of topology
    ``spec`` with ``envs_per_sampler`` (its config's, which a plan wrote there): its memories
    and learners, whose state the checkpoint holds, and for a synchronous run that holds its
    total envs, the checkpoint's total (not the default topology's), so that its fragment
    length, the batch over them, stays what it learned with."""
    from walle_ray.topology import parse_topology

    kept = parse_topology(spec)
    if costs.loop == "sync" and not costs.split_work:
        costs = replace(costs, total_envs=kept.samplers * envs_per_sampler)
    return costs, Plan(kept.samplers, kept.memories, kept.learners, 1, costs.envs_per_sampler)


class Replan(RoleDied):
    """The cluster's CPUs changed and topology=auto would split the work differently: the
    driver checkpoints and rebuilds the roles as the new plan says (not a restart)."""


def plan_for(auto: Auto, cpus: list[float]) -> Plan:
    """The best plan for nodes of ``cpus`` CPUs with the memories and learners of the
    current plan (the checkpoint's state is theirs)."""
    return choose(auto.costs, cpus, keep=auto.plan)


def replan(cfg: DictConfig, auto: Auto) -> bool:
    """Choose again for the cluster's CPUs now; True where the plan changed, and was
    applied to ``cfg``."""
    cpus = node_cpus()
    plan = plan_for(auto, cpus)
    same = sorted(cpus) == sorted(auto.cpus)
    # On the same CPUs, only a plan predicted faster than the running one: one the watch kept
    # for too little gain, taken now that the roles rebuild anyway.
    if same and plan.rate <= predict(auto.costs, auto.plan, cpus).rate:
        return False
    before, auto.cpus, auto.plan = auto.plan, cpus, plan
    said = (f"rebuilding on {sum(cpus):g} CPUs, the plan kept for too little gain is bettered"
            if same else f"the cluster now has {sum(cpus):g} CPUs in {len(cpus)} node(s)")
    print(f"walle_ray: {said}: {auto.plan.line(auto.costs)}"
          + ("" if auto.plan.spec == before.spec else f" (was {before.spec})"), flush=True)
    if (auto.plan.spec, auto.plan.threads) == (before.spec, before.threads):
        return False
    auto.replans += 1
    apply(cfg, auto.plan)
    return True


class ClusterWatch:
    """A driver hook (``runtime/loop.py``): every ``every_s`` it reads the cluster's nodes,
    and where their CPUs changed so that the plan would, raises ``Replan``. A lost node that
    ran roles is found sooner, by the roles' failure, and the rebuild re-plans too.

    Fewer CPUs, or a smaller biggest node, re-plan at once (the plan may no longer fit).
    More CPUs, or as many spread otherwise, re-plan once the same nodes were seen at two
    looks in a row (a node that joins and leaves again rebuilds nothing), and only for a plan
    ``REPLAN_GAIN`` faster than the running one there."""

    def __init__(self, auto: Auto, stopping, every_s: float = 10.0):
        """``stopping()``: whether the run is stopping (its budget spent, a signal): then
        the cluster is left as it is."""
        self.auto, self.stopping, self.every_s = auto, stopping, every_s
        self.next_at = time.perf_counter() + every_s
        # the nodes' CPUs at the last look, and those the plan was for then (a rebuild after
        # a lost role re-plans without the watch: a look from before it does not count)
        self.seen: tuple | None = None

    def __call__(self, record: dict) -> dict:
        now = time.perf_counter()
        if now < self.next_at or self.stopping():
            return {}
        self.next_at = now + self.every_s
        cpus = sorted(node_cpus())
        seen, self.seen = self.seen, (cpus, sorted(self.auto.cpus))
        if cpus == sorted(self.auto.cpus):
            return {}
        # the running plan may not fit: fewer CPUs, or a smaller biggest node (the learner's)
        fewer = sum(cpus) < sum(self.auto.cpus) or max(cpus) < max(self.auto.cpus)
        if not fewer and seen != self.seen:  # look again before rebuilding for it
            return {}
        plan = plan_for(self.auto, cpus)
        if (plan.spec, plan.threads) != (self.auto.plan.spec, self.auto.plan.threads):
            running = predict(self.auto.costs, self.auto.plan, cpus).rate
            if fewer or plan.rate >= running * (1.0 + REPLAN_GAIN):
                raise Replan(f"the cluster's CPUs went from {sum(self.auto.cpus):g} to "
                             f"{sum(cpus):g}; topology=auto would now run {plan.spec}")
            print(f"walle_ray: the cluster now has {sum(cpus):g} CPUs in {len(cpus)} node(s); "
                  f"topology=auto keeps {self.auto.plan.spec}: {plan.spec} is predicted "
                  f"{plan.rate / max(running, 1e-9) - 1.0:+.0%}, less than the "
                  f"{REPLAN_GAIN:.0%} a rebuild of every role must gain", flush=True)
        self.auto.cpus = cpus
        return {}

"""Topology strings such as ``32a4m4l`` and the resource plan that places them.

Grammar: ``<A>a<M>m<L>l[<P>p]``: A samplers (actors), M memories, L learners and optionally
P parameter servers (0 or 1; with 0 the newest weights live in learner 0's process). The
word ``local`` runs every role in the driver process, without Ray actors.
"""

from __future__ import annotations


import re
from dataclasses import dataclass, replace

from walle_ray.config import ConfigError

GRAMMAR = (
    "a topology is '<A>a<M>m<L>l[<P>p]' with whole numbers A >= 0 (0 only for algorithms "
    "that read a dataset), M, L >= 1 and P in {0, 1}, "
    "e.g. 32a4m4l (32 samplers, 4 memories, 4 learners) or 4a8m1l1p; or 'local' for one process"
)
_PATTERN = re.compile(r"^(\d+)a(\d+)m(\d+)l(?:(\d+)p)?$")


@dataclass(frozen=True)
class Topology:
    """How many of each role a run starts."""

    samplers: int
    memories: int
    learners: int
    param_servers: int = 1
    local: bool = False

    def __str__(self) -> str:
        if self.local:
            return "local"
        return f"{self.samplers}a{self.memories}m{self.learners}l{self.param_servers}p"

    @property
    def total(self) -> int:
        """Samplers, memories, learners and parameter servers together."""
        return self.samplers + self.memories + self.learners + self.param_servers

    def memories_of_learner(self, j: int) -> list[int]:
        """Learner j reads memories j, j+L, j+2L, ... (each memory has exactly one reader)."""
        return list(range(j, self.memories, self.learners))

    def memory_of_sampler(self, i: int) -> int:
        """Sampler i writes to memory i mod M."""
        return i % self.memories

    def routes(self, i: int, rows: int | None = None) -> list[tuple[int, slice | None]]:
        """Where sampler i's fragments go, as (memory, the rows it takes; None: all): whole to
        memory i mod M, or, given the fragments' ``rows`` (env columns, which an algorithm
        may deal: ``Algorithm.deals_rows``), row j to memory (i + j) mod M. Dealt, every
        memory gets a share of every sampler's data as it comes, and no memory waits for a
        whole fragment: a learner of 4 taking 2 rows per update is fed 2 rows at a time by
        each sampler process, as a single learner taking 8 is fed 8 (docs/algorithms.md,
        "One update, however many learners")."""
        m = self.memories
        if rows is None or m == 1:
            return [(i % m, None)]
        return [((i + r) % m, slice(r, None, m)) for r in range(min(rows, m))]

    def learner_of_sampler(self, i: int) -> int:
        """The learner that reads sampler i's memory (i mod M): memory k's reader is learner
        k mod L. A synchronous algorithm's learner takes those fragments directly."""
        return self.memory_of_sampler(i) % self.learners

    def memories_of_sampler(self, i: int, rows: int | None = None) -> list[int]:
        """The memories sampler i writes to (``routes``)."""
        return [k for k, _ in self.routes(i, rows)]


def parse_topology(spec: str) -> Topology:
    """Parse a topology string; raises ConfigError that shows the grammar. Whether a run may
    have no samplers is the algorithm's to say (``check_samplers``)."""
    text = str(spec).strip().lower()
    if text == "local":
        return Topology(samplers=1, memories=1, learners=1, param_servers=0, local=True)
    match = _PATTERN.match(text)
    if not match:
        raise ConfigError(f"topology {spec!r} is malformed: {GRAMMAR}")
    a, m, l_, p = (int(g) if g is not None else None for g in match.groups())
    p = 1 if p is None else p
    if m < 1 or l_ < 1:
        raise ConfigError(f"topology {spec!r} needs at least one memory and one learner: {GRAMMAR}")
    if p > 1:
        raise ConfigError(f"topology {spec!r} asks for {p} parameter servers; use 0 or 1: {GRAMMAR}")
    if m < l_:
        raise ConfigError(
            f"topology {spec!r} has {l_} learners but only {m} memories; every learner reads "
            f"at least one memory, so use M >= L (e.g. {a}a{l_}m{l_}l)")
    return Topology(samplers=a, memories=m, learners=l_, param_servers=p)


@dataclass(frozen=True)
class ResourcePlan:
    """Logical CPUs and GPUs each actor asks Ray for."""

    sampler_cpus: float
    memory_cpus: float
    learner_cpus: float
    learner_gpus: float
    ps_cpus: float
    cluster_cpus: float  # the logical CPUs the plan was fit into

    def total_cpus(self, topo: Topology) -> float:
        return (topo.samplers * self.sampler_cpus + topo.memories * self.memory_cpus
                + topo.learners * self.learner_cpus + topo.param_servers * self.ps_cpus)


# The CPU share of a process that mostly waits on I/O (a memory, the parameter server); a
# sampler or learner process is given at least as much (``check_shares``).
IO_CPUS = 0.01


def plan_resources(topo: Topology, cluster_cpus: float, learner_gpus: float = 0.0,
                   sampler_cpus: float | None = None,
                   learner_cpus: float | None = None) -> ResourcePlan:
    """Fit every role into ``cluster_cpus`` logical CPUs with fractional shares.

    Learners get up to one CPU each but at most half the cluster between them; samplers
    share what is left, up to one CPU each. Memories and the parameter server mostly wait on
    I/O and get a small fixed share. Explicit shares override the fit.
    """
    io_cpus = IO_CPUS * (topo.memories + topo.param_servers)
    if learner_cpus is None:
        learner_cpus = min(1.0, 0.5 * cluster_cpus / topo.learners)
    if sampler_cpus is None:
        left = cluster_cpus - io_cpus - topo.learners * learner_cpus
        sampler_cpus = min(1.0, left / topo.samplers) if topo.samplers else 1.0
    # Ray accepts fractions to 1e-4; round down so the sum never exceeds the cluster.
    plan = ResourcePlan(
        sampler_cpus=_floor4(sampler_cpus), memory_cpus=IO_CPUS,
        learner_cpus=_floor4(learner_cpus), learner_gpus=learner_gpus, ps_cpus=IO_CPUS,
        cluster_cpus=cluster_cpus)
    if plan.sampler_cpus <= 0 or plan.learner_cpus <= 0:
        raise ConfigError(
            f"topology {topo} does not fit in {cluster_cpus:g} CPUs with the shares asked for "
            f"(sampler {sampler_cpus:g}, learner {learner_cpus:g}); lower topology.sampler_cpus "
            "or topology.learner_cpus, or leave them unset to fit automatically")
    return plan


def check_shares(plan: ResourcePlan, topo: Topology, processes: Topology, fewer: str,
                 explicit: dict | None = None) -> None:
    """Refuse a plan that gives each sampler or learner process, fitted to the CPUs, less
    CPU than a process that mostly waits (``IO_CPUS``): that many processes per CPU spend
    their time starting and taking turns, not working. A share the user set
    (``explicit[role]``) is theirs. ``processes`` are the process counts the packing of
    ``topo`` makes; ``fewer`` says how to start fewer."""
    for role, count, share in (("sampler", processes.samplers, plan.sampler_cpus),
                               ("learner", processes.learners, plan.learner_cpus)):
        if count and share < IO_CPUS and (explicit or {}).get(role) is None:
            raise ConfigError(
                f"topology={topo}: {processes.total} role processes on {plan.cluster_cpus:g} CPUs "
                f"leave each {role} process {share:g} CPU, less than the {IO_CPUS:g} of a "
                f"process that mostly waits; {fewer}")


def offers(node: dict, asks: dict) -> bool:
    """Whether a node's resources (Ray's ``Resources``) hold what one process asks for."""
    return all(node.get(k, 0.0) >= v for k, v in asks.items())


def fit_to_nodes(plan: ResourcePlan, processes: Topology, resources,
                 nodes: list[dict], explicit: dict | None = None) -> ResourcePlan:
    """The plan with the CPU shares of samplers and learners that ``topology.resources``
    confines to the nodes offering a custom resource cut so that they fit those nodes' CPUs
    (``plan_resources`` fits the whole cluster's; Ray would leave the processes that do not
    fit waiting for CPUs that never come). A share the user set (``explicit[role]``) is not
    cut: it is refused with a message."""
    counts = {"sampler": processes.samplers, "learner": processes.learners}
    shares = {"sampler": plan.sampler_cpus, "learner": plan.learner_cpus}
    io = plan.memory_cpus * processes.memories + plan.ps_cpus * processes.param_servers

    def where(role: str) -> frozenset | None:
        asks = {k: v for k, v in ((resources or {}).get(role) or {}).items()
                if k not in ("CPU", "GPU")}
        if not asks:
            return None
        return frozenset(i for i, node in enumerate(nodes) if offers(node, asks))

    confined = {role: where(role) for role in counts}
    for role, other in (("sampler", "learner"), ("learner", "sampler")):  # samplers yield first
        on = confined[role]
        if on is None or not counts[role] or (role == "learner" and plan.learner_gpus > 0):
            continue
        cpus = sum(nodes[i].get("CPU", 0.0) for i in on)
        beside = confined[other] is not None and confined[other] <= on
        room = cpus - io - (counts[other] * shares[other] if beside else 0.0)
        if counts[role] * shares[role] <= room + 1e-9:
            continue
        fit = _floor4(room / counts[role])
        if (explicit or {}).get(role) is not None or fit <= 0:
            raise ConfigError(
                f"topology.resources.{role}: the {len(on)} node(s) that offer what it asks for "
                f"have {cpus:g} CPUs, too few for {counts[role]} {role} process(es) of "
                f"{shares[role]:g} CPU each{' beside the ' + other + 's' if beside else ''}; "
                f"add such nodes, lower topology.{role}_cpus, or use fewer {role}s")
        shares[role] = fit
    return replace(plan, sampler_cpus=shares["sampler"], learner_cpus=shares["learner"])


def equal_share(free_cpus: list[float], processes: int, share: float) -> float:
    """The largest CPU share, at most ``share``, of which ``processes`` processes fit in nodes
    with ``free_cpus`` each (processes of one size fill nodes alike in any order); 0 if none."""
    def fits(s: float) -> bool:
        return sum(int(f / s + 1e-9) for f in free_cpus if f > 0) >= processes

    if not processes or fits(share):
        return share
    candidates = {_floor4(f / k) for f in free_cpus if f > 0 for k in range(1, processes + 1)}
    return max((s for s in candidates if 0 < s <= share and fits(s)), default=0.0)


def sampler_share_left(nodes: list[dict], wanted: dict, placed: list[tuple[str, float]],
                       count: int, share: float, by_hand: bool) -> float:
    """The CPU share of ``count`` sampler processes once the other roles are placed, on a
    cluster of several nodes: a total that fits the cluster can still leave the last sampler
    no node with room for it, waiting forever. ``nodes`` are Ray's live nodes (``NodeID``,
    ``Resources``), ``wanted`` what a sampler asks for beyond CPUs (``topology.resources``),
    ``placed`` the (node id, CPUs) of every other role process. ``share`` where the samplers
    fit the CPUs left on the nodes offering ``wanted``, else the largest equal share that
    fits; a share set by hand (``by_hand``) that does not fit, or no room at all, is refused
    with a message."""
    free = [node["Resources"].get("CPU", 0.0)
            - sum(cpus for at, cpus in placed if at == node["NodeID"])
            for node in nodes if offers(node["Resources"], wanted)]
    fit = equal_share(free, count, share)
    if fit != share and (by_hand or fit <= 0):
        raise ConfigError(
            f"topology: {count} sampler process(es) of {share:g} CPU each do not fit on the "
            f"nodes they may run on (CPUs left there: {', '.join(f'{f:g}' for f in free)}); "
            "lower topology.sampler_cpus, use fewer samplers, or add nodes")
    return fit


def _floor4(x: float) -> float:
    return int(x * 10_000) / 10_000


def check_samplers(topo: Topology, algo_name: str, reads_dataset: bool) -> None:
    """A topology with no samplers suits only an algorithm whose memories read a dataset."""
    if topo.samplers == 0 and not reads_dataset:
        raise ConfigError(
            f"topology {topo}: algo={algo_name} learns from what samplers collect, and this "
            f"topology has none; give it at least one (e.g. 1a{topo.memories}m{topo.learners}l)")


@dataclass(frozen=True)
class Packing:
    """Which logical roles share a process: ``samplers[p]`` are the logical samplers process p
    runs (in turn, each with its envs, seed, memories and fault accounting; several of an
    algorithm that deals rows step together: ``lane_envs``), ``memories[q]`` the
    memories of memory process q, ``learners[g]`` the learner shards of learner process g
    (a process with several computes the mean gradient over their batches, as the
    all-reduce of one process per shard would)."""

    samplers: tuple[tuple[int, ...], ...]
    memories: tuple[tuple[int, ...], ...]
    learners: tuple[tuple[int, ...], ...]
    ps_in_learner: bool = False  # the parameter server's weights kept by learner process 0

    @property
    def packed(self) -> bool:
        return any(len(g) > 1 for g in (*self.samplers, *self.memories, *self.learners))

    def processes(self, topo: Topology) -> Topology:
        """The process counts, as a topology (what the resource plan shares CPUs among)."""
        return Topology(samplers=len(self.samplers), memories=len(self.memories),
                        learners=len(self.learners),
                        param_servers=0 if self.ps_in_learner else topo.param_servers)

    def describe(self, topo: Topology, memories: bool = True) -> str:
        """'32 samplers in 2 processes (16 each), 4 memories in 1, 4 learners in 1'; without
        ``memories`` (a synchronous algorithm's learners take the fragments directly) the
        memories are left out."""
        parts = []
        roles = ((("sampler", "samplers"), self.samplers, topo.samplers),
                 (("memory", "memories"), self.memories, topo.memories),
                 (("learner", "learners"), self.learners, topo.learners))
        for (one, many), groups, count in (r for r in roles if memories or r[0][0] != "memory"):
            sizes = sorted({len(g) for g in groups})
            each = f" ({'-'.join(map(str, sizes))} each)" if sizes and sizes != [1] else ""
            procs = f"{len(groups)} process{'es' if len(groups) != 1 else ''}"
            parts.append(f"{count} {one if count == 1 else many} in {procs}{each}")
        if self.ps_in_learner:
            parts.append("the parameter server in learner process 0")
        return ", ".join(parts)


def lane_envs(samplers: int, envs_per_sampler: int, memories: int) -> int | None:
    """The envs a sampler process of ``samplers`` logical samplers steps together, as one
    vector env with one policy call a step for all of them; None for a process of one
    sampler, which steps its own envs.

    Together, the process steps one sampler's envs (``envs_per_sampler``), rounded up to a
    multiple of ``memories`` so that every memory takes the same share of each of its
    fragments (``lane_routes``): a machine with fewer CPUs than samplers then steps as many
    envs as a topology of one sampler per CPU would, and learns from data as fresh. On
    such a machine, the envs of every logical sampler in turn would each advance a few steps
    a second, so their episodes (and the return, the mean of the last finished ones) would
    come minutes late; more envs than one sampler's bring no more steps a second on the
    same CPUs, and each fragment then spans more updates (docs/performance.md, "Many envs on
    few cores")."""
    if samplers < 2:
        return None
    envs, memories = max(1, envs_per_sampler), max(1, memories)
    return -(-envs // memories) * memories


def piece_rows(envs_per_sampler: int, memories: int) -> int:
    """The most rows of one fragment a memory takes at once: a sampler's rows dealt across
    the memories (``Topology.routes``), which the memories' buffers are sized for."""
    return -(-max(1, int(envs_per_sampler)) // max(1, memories))


def lane_routes(topo: Topology, first: int, rows: int,
                piece: int) -> list[tuple[int, list[int]]]:
    """Where the rows of a sampler process that steps its samplers together go (``lane_envs``):
    (memory, rows), dealt as ``Topology.routes`` deals the rows of its first logical sampler,
    ``first``, with all ``rows`` of the process's fragment, so every memory gets an equal
    share of every process's data when ``rows`` is a multiple of the memories; in pieces of
    at most ``piece`` rows (``piece_rows``: what a memory is sized to take at once)."""
    piece, out = max(1, piece), []
    for k, part in topo.routes(first, rows):
        picked = list(range(rows)[part if part is not None else slice(None)])
        out += [(k, picked[s:s + piece]) for s in range(0, len(picked), piece)]
    return out


def _groups(count: int, processes: int) -> tuple[tuple[int, ...], ...]:
    """``count`` logical roles dealt round robin into ``processes`` groups."""
    processes = max(1, min(count, processes)) if count else 0
    return tuple(tuple(range(p, count, processes)) for p in range(processes))


def _divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of ``n`` not above ``limit`` (at least 1)."""
    return max(d for d in range(1, max(1, min(n, limit)) + 1) if n % d == 0)


def plan_packing(topo: Topology, cluster_cpus: float, pack: str | int = "auto",
                 learner_gpus: float = 0.0, packs_learners: bool = True,
                 packs_ps: bool = True) -> Packing:
    """How the logical roles of ``topo`` map onto processes (``topology.pack``).

    ``off``: one process per role. ``auto``: the same when the cluster has a CPU for each
    sampler and learner; else samplers share as many processes as the cluster has whole
    CPUs, memories half as many as the samplers' processes, and CPU learners a quarter of the
    CPUs (GPU learners keep one process each). A number N packs samplers into N processes and
    memories into at most N, learners as ``auto``. Learner shards are packed only in equal
    numbers per process (so the mean of the processes' gradients is the mean over every
    shard), and only for algorithms whose update takes several batches at once
    (``packs_learners``). Planned so (``auto`` on too few CPUs, or N), CPU learners also keep
    the parameter server's weights in learner process 0, as ``0p`` does: one process fewer
    on the same CPUs (docs/performance.md, "The parameter server in the learner's process");
    not where ``packs_ps`` is false (``topology.resources`` places the parameter server).
    """
    cpus = max(1, int(cluster_cpus))
    one_each = pack == "off" or (pack == "auto" and cluster_cpus >= topo.samplers + topo.learners)
    if one_each:
        sampler_procs, memory_procs, learner_procs = topo.samplers, topo.memories, topo.learners
    else:
        sampler_procs = cpus if pack == "auto" else int(pack)
        # A memory process serves two sampler processes: every process a sampler or learner
        # talks to costs it a call per fragment or update (docs/performance.md, "Fewer calls
        # for packed roles").
        memory_procs = min(topo.memories, max(1, min(sampler_procs, topo.samplers) // 2))
        learner_procs = topo.learners
        if learner_gpus <= 0 and packs_learners:
            learner_procs = _divisor_at_most(topo.learners, max(1, cpus // 4))
    return Packing(samplers=_groups(topo.samplers, sampler_procs),
                   memories=_groups(topo.memories, memory_procs),
                   learners=_groups(topo.learners, learner_procs),
                   ps_in_learner=(not one_each and packs_ps and learner_gpus <= 0
                                  and topo.param_servers > 0 and topo.learners > 0))

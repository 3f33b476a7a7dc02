"""The set of role instances of one run, in this process (``local``) or as Ray actors.

Both fleets offer the same calls, so the driver loop is written once.
"""

from __future__ import annotations

import time

import gymnasium as gym
from omegaconf import DictConfig

from walle_ray.actors.param_server import ParameterServer
from walle_ray.actors.restart import RestartingSampler
from walle_ray.algos import algorithm_for
from walle_ray.buffers.fifo import FIFOMemory
from walle_ray.learners import Learner
from walle_ray.runtime.checkpoint import first_line
from walle_ray.runtime.preload import role_runtime_env
from walle_ray.topology import ResourcePlan, Topology


class RoleError(RuntimeError):
    """A role failed the run; the message names it."""


class RoleTimeout(RoleError):
    """A role did not answer in time."""


class RoleFailed(RoleError):
    """A role failed in a way a restart would not mend (an error raised inside it)."""


class RoleDied(RoleFailed):
    """A learner or memory process died; the run can rebuild its roles from the last
    checkpoint (``run.max_restarts``)."""


def role_failed(role: str, exc: BaseException) -> RoleFailed:
    """A RoleFailed naming the role and the error raised inside it (not Ray's wrapper)."""
    import ray

    cause = getattr(exc, "cause", None) or exc
    if isinstance(cause, ray.exceptions.RayActorError):  # a role it was talking to died
        return RoleDied(f"{role} lost a role it was using: {type(cause).__name__}: "
                        f"{first_line(cause)}")
    return RoleFailed(f"{role} failed: {type(cause).__name__}: {first_line(cause)}")


def new_faults() -> dict:
    """The fault counters every fleet reports as ``faults/<key>``."""
    return {"sampler_restarts": 0, "lost_fragments": 0}


def count_faults(faults: dict, stats: dict) -> None:
    """Add a sampler report's fault counts (fragments lost to env failures) to ``faults``."""
    for key in faults:
        faults[key] += stats.pop(key, 0)


def sampler_spec(cfg: DictConfig, topo: Topology, i: int) -> tuple[type, tuple, dict]:
    """The class of sampler i and its constructor's positional and keyword arguments, as
    the algorithm builds it (``Algorithm.sampler_spec``)."""
    return algorithm_for(cfg.algo).sampler_spec(cfg, topo, i)


def make_learners(cfg: DictConfig, topo: Topology, obs_space: gym.Space, action_space: gym.Space,
                  plan: ResourcePlan, timeout_s: float) -> list:
    """Learner actors; with several, they form their torch.distributed group before returning."""
    import ray

    from walle_ray.runtime import remote

    threads = cfg.learner.torch_threads or max(1, int(plan.learner_cpus))
    device = "cuda" if plan.learner_gpus > 0 else "cpu"
    runtime_env = role_runtime_env(cfg.run.ray_preload)
    learners = [
        remote.RemoteLearner.options(name=f"walle/learner-{j}", num_cpus=plan.learner_cpus,
                                     num_gpus=plan.learner_gpus,
                                     runtime_env=runtime_env).remote(
            cfg, obs_space, action_space, device=device, threads=threads)
        for j in range(topo.learners)]
    if topo.learners > 1:
        try:
            address, port = ray.get(learners[0].group_address.remote(), timeout=timeout_s)
            ray.get([lr.join_group.remote(address, port, j, topo.learners)
                     for j, lr in enumerate(learners)], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RoleTimeout(f"learners did not form their group within {timeout_s:.0f} s") from None
    return learners


class LocalRoles:
    """Samplers, one learner and the parameter server in this process (memories: subclass)."""

    def __init__(self, cfg: DictConfig, topo: Topology, obs_space: gym.Space,
                 action_space: gym.Space):
        self.topo = topo
        self.samplers = [RestartingSampler(*sampler_spec(cfg, topo, i)) for i in range(topo.samplers)]
        self.faults = new_faults()
        self.learner = Learner(cfg, obs_space, action_space, threads=cfg.learner.torch_threads or 1)
        self.ps = ParameterServer()

    def publish(self) -> None:
        self.ps.publish(*self.learner.weights())

    def pull(self, sampler) -> None:
        """Give a sampler the newest weights, if it does not have them."""
        latest = self.ps.latest(sampler.version)
        if latest is not None:
            sampler.set_weights(latest[1], latest[0])

    def learner_state(self) -> dict:
        return self.learner.state_dict()

    def load_learner_state(self, state: dict) -> None:
        self.learner.load_state_dict(state)

    def shutdown(self) -> None:
        for s in self.samplers:
            s.close()


class LocalFleet(LocalRoles):
    """Every role in the driver process; the reference the Ray fleet is tested against."""

    def __init__(self, cfg: DictConfig, topo: Topology, obs_space: gym.Space,
                 action_space: gym.Space):
        super().__init__(cfg, topo, obs_space, action_space)
        self.memories = [FIFOMemory(capacity=2 * topo.samplers) for _ in range(topo.memories)]

    def collect(self) -> list[dict]:
        stats = []
        for i, sampler in enumerate(self.samplers):
            rollout, s = sampler.collect(self.pull)
            count_faults(self.faults, s)
            self.memories[self.topo.memory_of_sampler(i)].put(rollout)
            stats.append(s)
        return stats

    def learn(self, env_steps: int) -> dict:
        rollouts = [r for m in self.memories for r in m.take()]
        return self.learner.update(rollouts, env_steps)


def pins_samplers(cfg: DictConfig, topo: Topology, cluster_cpus: float) -> bool:
    """Whether sampler i runs pinned to a CPU (``topology.pin_samplers``): only when the
    cluster has a CPU for each sampler. With more samplers than CPUs, pinned samplers cannot
    move away from each other or the learner (docs/performance.md, "Pinning samplers")."""
    return bool(cfg.topology.pin_samplers) and topo.samplers <= cluster_cpus


class RayRoles:
    """Learners and the parameter server as named Ray actors; subclasses add memories and
    samplers. Every wait has a timeout whose message names the role."""

    def __init__(self, cfg: DictConfig, topo: Topology, obs_space: gym.Space,
                 action_space: gym.Space, plan: ResourcePlan, timeout_s: float):
        import ray

        from walle_ray.runtime import remote

        self.ray = ray
        self.remote = remote
        self.cfg = cfg
        self.topo = topo
        self.plan = plan
        self.timeout_s = timeout_s
        self.learners = make_learners(cfg, topo, obs_space, action_space, plan, timeout_s)
        self.sampler_env = role_runtime_env(cfg.run.ray_preload)  # how sampler processes start
        self.pin_samplers = pins_samplers(cfg, topo, plan.cluster_cpus)
        self.ps = (remote.RemoteParameterServer.options(name="walle/ps", num_cpus=plan.ps_cpus).remote()
                   if topo.param_servers else None)
        self.memories: list = []
        self.samplers: list = []
        self.faults = new_faults()

    def make_sampler(self, i: int, memory: str | None = None, **options):
        """Sampler actor i, pulling weights from the parameter server (or learner 0), and
        pushing into the memory actor named ``memory`` if given. Roles are passed by name:
        an actor handle among the constructor arguments would tie Ray's restart of the
        sampler to that handle's lifetime (ray-project/ray#53727)."""
        cls, args, kwargs = sampler_spec(self.cfg, self.topo, i)
        source = "walle/ps" if self.ps is not None else "walle/learner-0"
        return self.remote.RemoteSampler.options(
            name=f"walle/sampler-{i}", num_cpus=self.plan.sampler_cpus,
            runtime_env=self.sampler_env, **options).remote(
            source, *args, memory=memory, sampler_cls=cls,
            pin=i if self.pin_samplers else None, **kwargs)

    def _get(self, refs, role: str, restartable: bool = False):
        """Results of calls to ``role``; a timeout, an error raised inside the role or its
        death becomes a RoleError that names it. A restartable role's death stays a
        RayActorError, for the caller to handle."""
        try:
            return self.ray.get(refs, timeout=self.timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            raise RoleTimeout(f"{role} did not answer within {self.timeout_s:.0f} s "
                              "(run.role_timeout_s)") from None
        except self.ray.exceptions.RayActorError as exc:
            if restartable:
                raise
            raise RoleDied(f"{role} died ({type(exc).__name__})") from None
        except self.ray.exceptions.RayTaskError as exc:
            raise role_failed(role, exc) from None

    def await_restart(self, i: int) -> None:
        """Wait until Ray has restarted sampler i (calls made meanwhile may fail too)."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            try:
                self.ray.get(self.samplers[i].ready.remote(), timeout=self.timeout_s)
                return
            except self.ray.exceptions.RayActorError:
                time.sleep(0.2)
        raise RoleTimeout(f"sampler-{i} was not restarted within {self.timeout_s:.0f} s "
                          "(run.role_timeout_s)")

    def learner_state(self) -> dict:
        return self._get(self.learners[0].state_dict.remote(), "learner-0 (state for checkpoint)")

    def load_learner_state(self, state: dict) -> None:
        ref = self.ray.put(state)
        self._get([lr.load_state_dict.remote(ref) for lr in self.learners], "learners (loading state)")

    def shutdown(self) -> None:
        for handle in [*self.samplers, *self.memories, *self.learners, self.ps]:
            if handle is not None:
                self.ray.kill(handle, no_restart=True)


class RayFleet(RayRoles):
    """The synchronous fleet: the driver routes each sampler's fragment to its memory."""

    def __init__(self, cfg: DictConfig, topo: Topology, obs_space: gym.Space,
                 action_space: gym.Space, plan: ResourcePlan, timeout_s: float):
        super().__init__(cfg, topo, obs_space, action_space, plan, timeout_s)
        self.memories = [
            self.remote.RemoteMemory.options(name=f"walle/memory-{k}", num_cpus=plan.memory_cpus).remote(
                capacity=2 * topo.samplers)
            for k in range(topo.memories)]
        self.samplers = [self.make_sampler(i, max_restarts=-1, max_task_retries=0)
                         for i in range(topo.samplers)]

    def publish(self) -> None:
        """The new weights' version and box, which each collect call carries to the samplers
        (no round trip to the parameter server)."""
        self.version, self.weights = self._get(self.learners[0].publish.remote(self.ps),
                                               "learner-0 (publishing weights)")

    def collect(self, max_deaths: int = 3) -> list[dict]:
        """Every sampler's fragment, routed to its memory. A sampler process that dies is
        restarted by Ray and asked again (its fragment is lost and collected anew)."""
        outs = {i: s.collect.remote(self.version, self.weights) for i, s in enumerate(self.samplers)}
        stats: list = [None] * len(self.samplers)
        puts, deaths = [], 0
        while outs:
            for i, (rollout, stat) in list(outs.items()):
                try:
                    stats[i] = self._get(stat, f"sampler-{i}", restartable=True)
                except self.ray.exceptions.RayActorError as exc:
                    deaths += 1
                    if deaths > max_deaths * len(self.samplers):
                        raise RoleFailed(f"sampler-{i} keeps dying ({first_line(exc)})") from None
                    self.faults["sampler_restarts"] += 1
                    self.faults["lost_fragments"] += 1
                    self.await_restart(i)
                    outs[i] = self.samplers[i].collect.remote(self.version, self.weights)
                    continue
                del outs[i]
                count_faults(self.faults, stats[i])
                memory = self.memories[self.topo.memory_of_sampler(i)]
                puts.append(memory.put.remote([rollout]))
        if not all(self._get(puts, "memories")):
            raise RuntimeError("a memory was full in a synchronous iteration; this is a bug")
        return stats

    def learn(self, env_steps: int) -> dict:
        calls = [lr.learn.remote([self.memories[k] for k in self.topo.memories_of_learner(j)], env_steps)
                 for j, lr in enumerate(self.learners)]
        return self._get(calls, "learners")[0]

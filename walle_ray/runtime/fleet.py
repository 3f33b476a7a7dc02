"""The set of role instances of one run, in this process (``local``) or as Ray actors.

Both fleets offer the same calls, so the driver loop is written once.
"""

from __future__ import annotations

import gymnasium as gym
from omegaconf import DictConfig, OmegaConf

from walle_ray.actors.param_server import ParameterServer
from walle_ray.algos import algorithm_for
from walle_ray.actors.replay_sampler import ReplaySampler
from walle_ray.actors.sampler import Sampler
from walle_ray.buffers.fifo import FIFOMemory
from walle_ray.learners import Learner
from walle_ray.topology import ResourcePlan, Topology


class RoleError(RuntimeError):
    """A role failed the run; the message names it."""


class RoleTimeout(RoleError):
    """A role did not answer in time."""


class RoleFailed(RoleError):
    """A role that cannot be restarted died."""


def sampler_spec(cfg: DictConfig, topo: Topology, i: int) -> tuple[type, tuple]:
    """The class of sampler i (``Sampler``, or ``ReplaySampler`` for replay-based algorithms)
    and its constructor arguments."""
    algo = algorithm_for(cfg.algo)
    length = algo.fragment_length(cfg, topo)
    # Plain dataclasses, not config nodes: a node pickles the whole config tree with it.
    env, model = OmegaConf.to_object(cfg.env), OmegaConf.to_object(cfg.model)
    if algo.replay:
        return ReplaySampler, (env, model, OmegaConf.to_object(cfg.algo), algo.explorer, length,
                               i, topo.samplers, cfg.run.seed)
    return Sampler, (env, model, length, cfg.algo.gamma, i, cfg.run.seed)


def make_learners(cfg: DictConfig, topo: Topology, obs_space: gym.Space, action_space: gym.Space,
                  plan: ResourcePlan, timeout_s: float) -> list:
    """Learner actors; with several, they form their torch.distributed group before returning."""
    import ray

    from walle_ray.runtime import remote

    threads = cfg.learner.torch_threads or max(1, int(plan.learner_cpus))
    device = "cuda" if plan.learner_gpus > 0 else "cpu"
    learners = [
        remote.RemoteLearner.options(name=f"walle/learner-{j}", num_cpus=plan.learner_cpus,
                                     num_gpus=plan.learner_gpus).remote(
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
        self.samplers = [cls(*args) for cls, args in
                         (sampler_spec(cfg, topo, i) for i in range(topo.samplers))]
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
            self.pull(sampler)
            rollout, s = sampler.collect()
            self.memories[self.topo.memory_of_sampler(i)].put(rollout)
            stats.append(s)
        return stats

    def learn(self, env_steps: int) -> dict:
        rollouts = [r for m in self.memories for r in m.take()]
        return self.learner.update(rollouts, env_steps)


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
        self.ps = (remote.RemoteParameterServer.options(name="walle/ps", num_cpus=plan.ps_cpus).remote()
                   if topo.param_servers else None)
        self.memories: list = []
        self.samplers: list = []

    def make_sampler(self, i: int, **options):
        """Sampler actor i, pulling weights from the parameter server (or learner 0)."""
        memory = options.pop("memory", None)
        cls, args = sampler_spec(self.cfg, self.topo, i)
        return self.remote.RemoteSampler.options(
            name=f"walle/sampler-{i}", num_cpus=self.plan.sampler_cpus, **options).remote(
            self.ps or self.learners[0], *args, memory=memory, sampler_cls=cls)

    def _get(self, refs, role: str):
        try:
            return self.ray.get(refs, timeout=self.timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            raise RoleTimeout(f"{role} did not answer within {self.timeout_s:.0f} s "
                              "(run.role_timeout_s)") from None

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
        self.samplers = [self.make_sampler(i) for i in range(topo.samplers)]

    def publish(self) -> None:
        self.version = self._get(self.learners[0].publish.remote(self.ps),
                                 "learner-0 (publishing weights)")

    def collect(self) -> list[dict]:
        outs = [s.collect.remote(self.version) for s in self.samplers]
        puts = [self.memories[self.topo.memory_of_sampler(i)].put.remote([rollout])
                for i, (rollout, _) in enumerate(outs)]
        stats = self._get([s for _, s in outs], "samplers")
        if not all(self._get(puts, "memories")):
            raise RuntimeError("a memory was full in a synchronous iteration; this is a bug")
        return stats

    def learn(self, env_steps: int) -> dict:
        calls = [lr.learn.remote([self.memories[k] for k in self.topo.memories_of_learner(j)], env_steps)
                 for j, lr in enumerate(self.learners)]
        return self._get(calls, "learners")[0]

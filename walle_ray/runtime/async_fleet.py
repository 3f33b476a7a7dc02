"""Fleets for asynchronous algorithms: samplers fill memories while learners drain them.

``AsyncLocalFleet`` interleaves the roles in this process (the reference); ``AsyncRayFleet``
runs them as Ray actors that overlap in time, with the driver only collecting reports.
"""

from __future__ import annotations

import gymnasium as gym
from omegaconf import DictConfig

from walle_ray.actors.param_server import ParameterServer
from walle_ray.actors.sampler import Sampler
from walle_ray.algos.impala import buffer_specs
from walle_ray.buffers.mixed import MixedMemory
from walle_ray.learners import Learner
from walle_ray.runtime.fleet import RoleTimeout, make_learners, sampler_args
from walle_ray.topology import ResourcePlan, Topology


class AsyncLocalFleet:
    """One fragment per sampler, then every update the memories can serve, per poll."""

    def __init__(self, cfg: DictConfig, topo: Topology, obs_space: gym.Space,
                 action_space: gym.Space):
        self.topo = topo
        self.samplers = [Sampler(*sampler_args(cfg, topo, i)) for i in range(topo.samplers)]
        specs = buffer_specs(cfg.algo)
        self.memories = [MixedMemory(specs, cfg.algo.batch_size, cfg.run.seed + k)
                         for k in range(topo.memories)]
        self.learner = Learner(cfg, obs_space, action_space, threads=cfg.learner.torch_threads or 1)
        self.ps = ParameterServer()
        self.faults = {"sampler_restarts": 0, "lost_fragments": 0}

    def start(self) -> None:
        self.ps.publish(*self.learner.weights())

    def poll(self, env_steps: int, timeout_s: float = 0.0) -> tuple[list[dict], list[dict]]:
        reports = []
        for i, sampler in enumerate(self.samplers):
            latest = self.ps.latest(sampler.version)
            if latest is not None:
                sampler.set_weights(latest[1], latest[0])
            rollout, stats = sampler.collect()
            memory = self.memories[self.topo.memory_of_sampler(i)]
            stats["dropped"] = 0 if memory.has_room(rollout.reward_t.shape[1]) else 1
            if not stats["dropped"]:
                memory.put(rollout)
            reports.append(stats)
        learned = []
        for memory in self.memories:
            while memory.can_sample():
                batch = memory.sample()
                metrics = self.learner.update([batch], env_steps)
                self.ps.publish(*self.learner.weights())
                metrics.update(updates=1, env_steps_consumed=batch.num_steps, batch_wait_s=0.0)
                learned.append(metrics)
        return reports, learned

    def memory_stats(self) -> list[dict]:
        return [m.stats() for m in self.memories]

    def learner_state(self) -> dict:
        return self.learner.state_dict()

    def load_learner_state(self, state: dict) -> None:
        self.learner.load_state_dict(state)

    def shutdown(self) -> None:
        for s in self.samplers:
            s.close()


class AsyncRayFleet:
    """Named Ray actors; samplers restart when they die, learners fail the run clearly."""

    def __init__(self, cfg: DictConfig, topo: Topology, obs_space: gym.Space,
                 action_space: gym.Space, plan: ResourcePlan, timeout_s: float):
        import ray

        from walle_ray.runtime import remote

        self.ray = ray
        self.cfg = cfg
        self.topo = topo
        self.timeout_s = timeout_s
        self.learners = make_learners(cfg, topo, obs_space, action_space, plan, timeout_s)
        self.ps = (remote.RemoteParameterServer.options(name="walle/ps", num_cpus=plan.ps_cpus).remote()
                   if topo.param_servers else None)
        specs = buffer_specs(cfg.algo)
        self.memories = [
            remote.RemoteAsyncMemory.options(name=f"walle/memory-{k}", num_cpus=plan.memory_cpus).remote(
                specs, cfg.algo.batch_size, cfg.run.seed + k)
            for k in range(topo.memories)]
        source = self.ps or self.learners[0]
        self.samplers = [
            remote.RemoteSampler.options(name=f"walle/sampler-{i}", num_cpus=plan.sampler_cpus,
                                         max_restarts=-1, max_task_retries=0).remote(
                source, *sampler_args(cfg, topo, i), memory=self.memories[topo.memory_of_sampler(i)])
            for i in range(topo.samplers)]
        self._get([lr.attach.remote([self.memories[k] for k in topo.memories_of_learner(j)],
                                    self.ps, j == 0, cfg.algo.prefetch)
                   for j, lr in enumerate(self.learners)], "learners (attaching memories)")
        self.pending: dict = {}  # ObjectRef -> ("sampler" | "learner", index)
        self.faults = {"sampler_restarts": 0, "lost_fragments": 0}

    def _get(self, refs, role: str):
        try:
            return self.ray.get(refs, timeout=self.timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            raise RoleTimeout(f"{role} did not answer within {self.timeout_s:.0f} s "
                              "(run.role_timeout_s)") from None

    def _run_sampler(self, i: int) -> None:
        self.pending[self.samplers[i].run.remote(self.cfg.algo.fragments_per_call)] = ("sampler", i)

    def _train_learner(self, j: int, env_steps: int) -> None:
        ref = self.learners[j].train.remote(self.cfg.algo.updates_per_call, env_steps)
        self.pending[ref] = ("learner", j)

    def start(self) -> None:
        first = self.learners[0].publish.remote(self.ps)
        self._get(first, "learner-0 (publishing weights)")
        for i in range(len(self.samplers)):
            self._run_sampler(i)
        for j in range(len(self.learners)):
            self._train_learner(j, 0)

    def poll(self, env_steps: int, timeout_s: float = 1.0) -> tuple[list[dict], list[dict]]:
        """Reports of the sampler and learner calls that finished; each is issued again."""
        ready, _ = self.ray.wait(list(self.pending), num_returns=1, timeout=timeout_s)
        if ready:
            ready, _ = self.ray.wait(list(self.pending), num_returns=len(self.pending), timeout=0)
        reports, learned = [], []
        for ref in ready:
            role, index = self.pending.pop(ref)
            try:
                result = self.ray.get(ref)
            except self.ray.exceptions.RayActorError as exc:
                if role == "learner":
                    raise RuntimeError(f"learner-{index} died ({type(exc).__name__}); the run stops "
                                       "with its last checkpoint intact") from None
                self.faults["sampler_restarts"] += 1
                self.faults["lost_fragments"] += self.cfg.algo.fragments_per_call
                self._run_sampler(index)  # Ray restarts the actor; it pulls the newest weights
                continue
            if role == "sampler":
                reports.append(result)
                self._run_sampler(index)
            else:
                learned.append(result)
                self._train_learner(index, env_steps)
        return reports, learned

    def memory_stats(self) -> list[dict]:
        return self._get([m.stats.remote() for m in self.memories], "memories")

    def learner_state(self) -> dict:
        return self._get(self.learners[0].state_dict.remote(), "learner-0 (state for checkpoint)")

    def load_learner_state(self, state: dict) -> None:
        ref = self.ray.put(state)
        self._get([lr.load_state_dict.remote(ref) for lr in self.learners], "learners (loading state)")

    def shutdown(self) -> None:
        for handle in [*self.samplers, *self.memories, *self.learners, self.ps]:
            if handle is not None:
                self.ray.kill(handle, no_restart=True)

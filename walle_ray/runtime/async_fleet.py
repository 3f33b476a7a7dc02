"""Fleets for asynchronous algorithms: samplers fill memories while learners drain them.

``AsyncLocalFleet`` interleaves the roles in this process (the reference); ``AsyncRayFleet``
runs them as Ray actors that overlap in time, with the driver only collecting reports.
"""

from __future__ import annotations

import time

import gymnasium as gym
from omegaconf import DictConfig

from walle_ray.algos import algorithm_for
from walle_ray.runtime.fleet import LocalRoles, RayRoles, RoleDied, count_faults, role_failed
from walle_ray.topology import ResourcePlan, Topology


def memory_spec(cfg: DictConfig, k: int) -> tuple[type, tuple, dict]:
    """Class and constructor arguments of memory k, as the algorithm builds it
    (``Algorithm.memory_spec``)."""
    return algorithm_for(cfg.algo).memory_spec(cfg, k)


class AsyncLocalFleet(LocalRoles):
    """One fragment per sampler, then every update the memories can serve, per poll."""

    def __init__(self, cfg: DictConfig, topo: Topology, obs_space: gym.Space,
                 action_space: gym.Space):
        super().__init__(cfg, topo, obs_space, action_space)
        self.memories = [cls(*args, **kwargs) for cls, args, kwargs in
                         (memory_spec(cfg, k) for k in range(topo.memories))]
        self.publish_every = cfg.algo.publish_every
        # A free-running memory could always serve another batch: cap the updates per poll.
        self.max_updates = (cfg.algo.updates_per_call
                            if any(m.free_running for m in self.memories) else None)

    def start(self) -> None:
        self.publish()

    def poll(self, env_steps: int, timeout_s: float = 0.0) -> tuple[list[dict], list[dict]]:
        reports = []
        for i, sampler in enumerate(self.samplers):
            rollout, stats = sampler.collect(self.pull)
            count_faults(self.faults, stats)
            memory = self.memories[self.topo.memory_of_sampler(i)]
            stats["dropped"] = 0 if memory.has_room(rollout) else 1
            if not stats["dropped"]:
                memory.put(rollout)
            reports.append(stats)
        learned = []
        for memory in self.memories:
            updates = 0
            while memory.can_sample() and (self.max_updates is None or updates < self.max_updates):
                batch = memory.sample()
                metrics = self.learner.update([batch], env_steps)
                feedback = self.learner.memory_feedback()
                if feedback is not None:
                    memory.feedback(feedback)
                updates += 1
                if self.learner.version % self.publish_every == 0:
                    self.publish()
                metrics.update(updates=1, env_steps_consumed=batch.num_steps, batch_wait_s=0.0)
                learned.append(metrics)
        return reports, learned

    def memory_stats(self) -> list[dict]:
        return [m.stats() for m in self.memories]

    def memory_states(self) -> list[dict]:
        return [m.state_dict() for m in self.memories]

    def load_memory_states(self, states: list[dict]) -> None:
        for memory, state in zip(self.memories, states, strict=True):
            memory.load_state_dict(state)


class AsyncRayFleet(RayRoles):
    """Named Ray actors; samplers restart when they die, learners fail the run clearly."""

    def __init__(self, cfg: DictConfig, topo: Topology, obs_space: gym.Space,
                 action_space: gym.Space, plan: ResourcePlan, timeout_s: float):
        super().__init__(cfg, topo, obs_space, action_space, plan, timeout_s)
        self.memories = []
        for k in range(topo.memories):
            cls, args, kwargs = memory_spec(cfg, k)
            self.memories.append(self.remote.RemoteAsyncMemory.options(
                name=f"walle/memory-{k}", num_cpus=plan.memory_cpus).remote(cls, *args, **kwargs))
        self.samplers = [self.make_sampler(i, max_restarts=-1, max_task_retries=0,
                                           memory=f"walle/memory-{topo.memory_of_sampler(i)}")
                         for i in range(topo.samplers)]
        self._get([lr.attach.remote([self.memories[k] for k in topo.memories_of_learner(j)],
                                    self.ps, j == 0, cfg.algo.prefetch, cfg.algo.publish_every)
                   for j, lr in enumerate(self.learners)], "learners (attaching memories)")
        self.pending: dict = {}  # ObjectRef -> ("sampler" | "learner", index)
        self.restarting: dict[int, float] = {}  # sampler index -> when to call it again

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
        now = time.monotonic()
        for i, when in list(self.restarting.items()):  # ask dead samplers whether they are back
            if now >= when and not any(v[1] == i and v[0] != "learner" for v in self.pending.values()):
                self.pending[self.samplers[i].ready.remote()] = ("restarted", i)
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
                    raise RoleDied(f"learner-{index} died ({type(exc).__name__})") from None
                if role == "sampler":  # its fragments in flight are lost
                    self.faults["sampler_restarts"] += 1
                    self.faults["lost_fragments"] += self.cfg.algo.fragments_per_call
                # Ray restarts the actor, which then pulls the newest weights; ask again soon.
                self.restarting[index] = time.monotonic() + 0.2
                continue
            except self.ray.exceptions.RayTaskError as exc:  # raised inside the role
                raise role_failed(f"{role}-{index}", exc) from None
            if role == "restarted":
                self.restarting.pop(index, None)
                self._run_sampler(index)
            elif role == "sampler":
                count_faults(self.faults, result)
                reports.append(result)
                self._run_sampler(index)
            else:
                learned.append(result)
                self._train_learner(index, env_steps)
        return reports, learned

    def memory_stats(self) -> list[dict]:
        return self._get([m.stats.remote() for m in self.memories], "memories")

    def memory_states(self) -> list[dict]:
        return self._get([m.state_dict.remote() for m in self.memories], "memories (snapshot)")

    def load_memory_states(self, states: list[dict]) -> None:
        self._get([m.load_state_dict.remote(state) for m, state in zip(self.memories, states,
                                                                       strict=True)],
                  "memories (restoring the snapshot)")

"""``RayFleet``: a run's roles as named Ray actors, packed into processes as
``topology.pack`` plans (``topology.plan_packing``), with the learners' torch.distributed
group. It offers the driver loop the same calls as ``LocalFleet`` (``runtime/fleet.py``).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

import gymnasium as gym
from omegaconf import DictConfig

from walle_ray.runtime.fleet import (LearnIf, RoleDied, RoleTimeout, Step, capped,
                                     count_faults, new_faults, offline_updates_left,
                                     timed_update)
from walle_ray.runtime.ray_calls import Calls
from walle_ray.runtime.role_setup import (make_learners, make_samplers, role_name,
                                         role_resources, sampler_envs)
from walle_ray.runtime.sampler_restarts import SamplerRestarts
from walle_ray.runtime.stalls import StallWatch
from walle_ray.topology import (Packing, ResourcePlan, Topology, plan_packing,
                                sampler_share_left)

if TYPE_CHECKING:
    from pathlib import Path

    from walle_ray.algos.spec import Algorithm


class RayFleet:
    """Named Ray actors (``walle/sampler-3``, or ``walle/sampler-0,2,4`` for a process that
    runs several logical samplers, ``topology.pack``); every wait has a timeout whose message
    names the role. A sampler process that dies is restarted by Ray and called again, its
    fragments in flight lost (``faults/``); a learner or memory that dies fails the run with
    ``RoleDied``, which the driver may answer by rebuilding from the last checkpoint. The
    calls in flight, the waits on them and what their failures mean are ``Calls``'
    (``runtime/ray_calls.py``).

    Synchronous: each step calls every sampler process's ``collect`` with the weights' box
    and hands each fragment's ref to its sampler's learner (no memory process), then the
    learners ``learn`` and learner 0 publishes. Asynchronous: samplers ``run`` (pushing
    into their memories) and learners ``train`` (pulling from theirs) are called again as
    each call ends; a step collects the reports of the calls that ended.
    """

    def __init__(self, cfg: DictConfig, algo: Algorithm, topo: Topology, obs_space: gym.Space,
                 action_space: gym.Space, plan: ResourcePlan, timeout_s: float,
                 packing: Packing | None = None, stall_dir: Path | None = None):
        """``stall_dir``: where the stacks of stalled roles go (``runtime/stalls.py``)."""
        import ray

        from walle_ray.runtime import remote

        self.ray = ray
        self.cfg, self.algo, self.topo, self.plan, self.timeout_s = cfg, algo, topo, plan, timeout_s
        self.packing = packing or plan_packing(topo, plan.cluster_cpus, "off")
        self.sync = algo.loop == "sync"
        self.offline = algo.reads_dataset
        self.overlap, self.prefetched = bool(cfg.algo.get("overlap", False)), False
        self.faults = new_faults()
        self.running = False  # the stall watch looks once the run has started
        self.sampler_names = [role_name("sampler", group) for group in self.packing.samplers]
        # The envs each sampler process steps together (None: its samplers in turn), and the
        # logical samplers that step so, which feed every memory (``RunTimes``).
        self.lane_rows, self.envs = sampler_envs(cfg, algo, topo, self.packing)
        self.lanes = frozenset(i for group, rows in zip(self.packing.samplers, self.lane_rows)
                               if rows is not None for i in group)
        self.watch = (StallWatch(ray, self._roles, cfg.run.stall_s, cfg.run.stall_start_s,
                                 stall_dir) if cfg.run.stall_s else None)
        self.restarts = SamplerRestarts(
            self.sampler_names, [self._death_cost(p) for p in range(len(self.packing.samplers))],
            self.faults, None if self.watch is None else self.watch.forget)
        self.calls = Calls(ray, timeout_s, self.restarts, self._look_for_stalls)
        self.learners = make_learners(cfg, algo, self.packing, obs_space, action_space, plan,
                                      timeout_s)
        self.ps = (remote.RemoteParameterServer.options(
            name="walle/ps", num_cpus=plan.ps_cpus, resources=role_resources(cfg, "ps")).remote()
                   if self.packing.processes(topo).param_servers else None)
        self.memories, self.memory_names = [], []  # per memory process
        self.memory_refs: dict = {}  # per logical memory: its remote.MemoryRef
        # An asynchronous algorithm's memories wait for room and for batches (the
        # back-pressure, runtime/memory_worker.py); a synchronous one's learners take the
        # iteration's fragments directly, grouped as the topology maps memories to learners.
        for group in (() if self.sync else self.packing.memories):
            name = role_name("memory", group)
            actor = remote.RemoteAsyncMemory.options(
                name=name, num_cpus=plan.memory_cpus, resources=role_resources(cfg, "memory")
            ).remote({k: algo.memory(cfg, k) for k in group}, self.weights_source())
            self.memories.append(actor)
            self.memory_names.append(name)
            self.memory_refs.update({k: remote.MemoryRef(actor, k) for k in group})
        self._fit_samplers_to_nodes()
        memory_names = {k: name for group, name in zip(self.packing.memories, self.memory_names)
                        for k in group}
        self.samplers = make_samplers(cfg, algo, topo, self.packing, self.plan, self.lane_rows,
                                      memory_names, self.weights_source())
        if not self.sync:
            self.calls.get([lr.attach.remote([self._shard_memories(j) for j in group], self.ps,
                                             g == 0, cfg.algo.prefetch, cfg.algo.publish_every)
                            for g, (lr, group) in enumerate(zip(self.learners,
                                                                self.packing.learners))],
                           "learners (attaching memories)")

    def _fit_samplers_to_nodes(self) -> None:
        """On a cluster of several nodes, the samplers' CPU share cut to what the nodes they
        may run on have left once the other roles are placed (``sampler_share_left``)."""
        nodes = [n for n in self.ray.nodes() if n["Alive"]]
        if len(nodes) < 2 or not self.packing.samplers:
            return
        others = [*self.learners, *self.memories, *([self.ps] if self.ps is not None else [])]
        where = self.calls.get([handle.where.remote() for handle in others], "roles (placing)")
        asks = ([self.plan.learner_cpus] * len(self.learners)
                + [self.plan.memory_cpus] * len(self.memories)
                + [self.plan.ps_cpus] * (self.ps is not None))
        share = self.plan.sampler_cpus
        fit = sampler_share_left(nodes, role_resources(self.cfg, "sampler") or {},
                                 list(zip(where, asks)), len(self.packing.samplers), share,
                                 by_hand=self.cfg.topology.sampler_cpus is not None)
        if fit == share:
            return
        print(f"walle_ray: samplers get {fit:g} CPU each to fit the nodes they run on "
              f"(planned {share:g})", flush=True)
        self.plan = replace(self.plan, sampler_cpus=fit)

    def _shard_memories(self, j: int) -> list:
        """The memories learner shard j reads (``Topology.memories_of_learner``)."""
        return [self.memory_refs[k] for k in self.topo.memories_of_learner(j)]

    def weights_source(self) -> str:
        """The name of the process that serves the newest weights: the parameter server,
        or learner 0 where the topology has none."""
        return "walle/ps" if self.ps is not None else role_name("learner", self.packing.learners[0])

    def _slots(self, p: int) -> int:
        """The samplers process p collects with in turn: one where they step together."""
        return 1 if self.lane_rows[p] is not None else len(self.packing.samplers[p])

    def _fragments_per_call(self, p: int) -> int:
        """Fragments each sampler of process p collects per call: ``algo.fragments_per_call``
        per process, at least one per sampler, so a packed process reports as often as one
        sampler would."""
        return max(1, -(-self.cfg.algo.fragments_per_call // self._slots(p)))

    def _death_cost(self, p: int) -> tuple[int, int]:
        """(samplers, fragments) a death of process p loses: its call in flight. Samplers
        that step together lose one sampler's call, as an env failure counts them."""
        samplers = self._slots(p)
        return samplers, samplers * (1 if self.sync else self._fragments_per_call(p))

    def _call_sampler(self, p: int) -> None:
        if self.sync:
            refs = self.samplers[p].collect.options(
                num_returns=len(self.packing.samplers[p]) + 1).remote(self.version, self.weights)
            self.calls.pending[refs[-1]] = ("sampler", p, refs[:-1])
        else:
            ref = self.samplers[p].run.remote(self._fragments_per_call(p))
            self.calls.pending[ref] = ("sampler", p, None)

    def _call_learner(self, j: int, env_steps: int) -> None:
        updates = self.cfg.algo.updates_per_call
        if self.algo.reads_dataset:  # no more than the budget needs; learners update in
            # lockstep, so each is asked the same sequence of counts
            updates = capped(updates, self.updates_left - self.updates_asked[j])
            self.updates_asked[j] += updates
        ref = self.learners[j].train.remote(updates, env_steps)
        self.calls.pending[ref] = ("learner", j, None)

    def _look_for_stalls(self) -> None:
        """A stalled sampler process is killed, for Ray to start again: its call in flight
        then fails as a death does. Any other stalled role is a RoleDied, for the driver to
        rebuild from the last checkpoint (``runtime/stalls.py``)."""
        if self.watch is None or not self.running:
            return
        for stall in self.watch.check(self.restarts.restarting()):
            handle = self._roles()[stall.name]
            self.watch.report(stall, handle)
            self.watch.forget(stall.name)
            self.faults["stalls"] += 1
            if stall.name not in self.sampler_names:
                self.calls.stalled = stall.role
                raise RoleDied(f"{stall.role} stalled")
            self.ray.kill(handle, no_restart=False)

    def _finished(self, timeout_s: float) -> list[tuple]:
        """(kind, process index, result, fragment refs) of the calls that ended within
        ``timeout_s`` (a sampler process's result is a report per sampler); each restarted
        sampler process is asked whether it is back, and called again once it is."""
        self._look_for_stalls()
        asking = {index for kind, index, _ in self.calls.pending.values() if kind == "restarted"}
        for i in self.restarts.due(asking):  # ask dead samplers whether they are back
            self.calls.pending[self.samplers[i].ready.remote()] = ("restarted", i, None)
        done = []
        for kind, index, result, extra in self.calls.ended(timeout_s):
            if kind == "restarted":
                self.restarts.back(index)
                self._call_sampler(index)
                continue
            if kind == "sampler":
                self.restarts.reported(index)
                for report in result:
                    count_faults(self.faults, report)
            done.append((kind, index, result, extra))
        return done

    def publish(self) -> None:
        """The new weights' version and box, which each collect call carries to the samplers
        (no round trip to the parameter server)."""
        self.version, self.weights = self.calls.get(self.learners[0].publish.remote(self.ps),
                                                    "learner-0 (publishing weights)")

    def start(self, env_steps: int = 0) -> None:
        """Publish the first weights and, for an asynchronous algorithm, set every role to
        work; ``env_steps``: the run's so far (a resumed run's).

        The stall watch looks once every learner, memory and the parameter server is built:
        a process still in its constructor (a memory reading a large dataset) cannot answer
        it, and its building is bounded by ``run.role_timeout_s`` instead."""
        others = [*self.learners, *self.memories, *([self.ps] if self.ps is not None else [])]
        self.calls.get([handle.where.remote() for handle in others], "roles (starting)")
        self.running = True
        self.publish()
        self.updates_left = (offline_updates_left(self.cfg, env_steps)
                             if self.algo.reads_dataset else 0)
        self.updates_asked = [0] * len(self.learners)
        self.idle_learners: set[int] = set()  # learner processes whose call has ended
        if not self.sync:
            for i in range(len(self.samplers)):
                self._call_sampler(i)
            for j in range(len(self.learners)):
                self._call_learner(j, 0)

    def step(self, env_steps: int, learn_if: LearnIf | None = None, timeout_s: float = 1.0) -> Step:
        """What finished within ``timeout_s``; a synchronous fleet's step is one iteration,
        whose update is made only where ``learn_if(reports)`` (when given) says so."""
        if self.sync:
            return self._iteration(env_steps, learn_if)
        out = Step()
        for kind, index, result, _ in self._finished(timeout_s):
            if kind == "sampler":
                out.reports.extend(result)
                self._call_sampler(index)
            else:
                result["learner"] = ",".join(map(str, self.packing.learners[index]))  # its shards
                out.learned.append(result)
                self.idle_learners.add(index)
        # Learner processes are called again together, once every one's call has ended: each
        # update starts with an all-reduce, so one called alone would wait there for the
        # others, and a call the driver queues behind it (the state for a checkpoint or an
        # evaluation) would wait for a peer the driver has not called yet.
        if len(self.idle_learners) == len(self.learners):
            for j in sorted(self.idle_learners):
                self._call_learner(j, env_steps)
            self.idle_learners.clear()
        return out

    def _iteration(self, env_steps: int, learn_if: LearnIf | None) -> Step:
        """Every sampler's fragment, each learner process given the references of those its
        shards learn from (sampler i's goes to the learner reading memory i mod M); one
        update, unless ``learn_if(reports)`` says not; new weights. With ``algo.overlap``
        the samplers are called for the next batch as the update starts, with the weights
        before it, so the next iteration finds its batch collected or under way, and learns
        from it one version behind (a policy lag of 1)."""
        t0 = time.perf_counter()
        deadline = t0 + self.timeout_s
        if not self.prefetched:
            for p in range(len(self.samplers)):
                self._call_sampler(p)
        reports: list = [None] * self.topo.samplers
        fragments: dict = {}  # sampler index -> its fragment's ref
        while self.calls.pending or self.restarts:
            if time.perf_counter() > deadline:
                late = sorted({v[1] for v in self.calls.pending.values()} | set(self.restarts))
                raise RoleTimeout(f"{self.sampler_names[late[0]].removeprefix('walle/')} did not "
                                  f"answer within {self.timeout_s:.0f} s (run.role_timeout_s)")
            for _, _, stats, rollouts in self._finished(0.2):
                for report, rollout in zip(stats, rollouts, strict=True):
                    reports[report["sampler"]] = report
                    fragments[report["sampler"]] = rollout
        t1 = time.perf_counter()
        if learn_if is not None and not learn_if(reports):
            self.prefetched = False  # nothing is under way
            if self.overlap:  # these episodes were played by the weights before the update
                self.calls.get([lr.rewind.remote() for lr in self.learners], "learners (rewinding)")
            return Step(reports, [], {"collect_s": t1 - t0, "learn_s": 0.0})
        calls = [lr.learn.remote([fragments[i] for i in sorted(fragments)
                                  if self.topo.learner_of_sampler(i) in group],
                                 env_steps, g == 0, self.ps)
                 for g, (lr, group) in enumerate(zip(self.learners, self.packing.learners))]
        self.prefetched = self.overlap  # the next iteration's fragments are under way
        if self.overlap:
            for p in range(len(self.samplers)):
                self._call_sampler(p)
        answers = self.calls.get(calls, "learners")
        metrics, (self.version, self.weights) = answers[0]
        # the update's CPU seconds are every learner process's (the bottleneck report's)
        metrics["learn_cpu_s"] = sum(m.get("learn_cpu_s", 0.0) for m, _ in answers)
        t2 = time.perf_counter()
        rows = sum(r["env_steps"] for r in reports)
        return Step(reports, [timed_update(metrics, rows, t2 - t1)],
                    {"collect_s": t1 - t0, "learn_s": t2 - t1})

    def stop_learning(self) -> None:
        """The loop is over: learners waiting for batches stop waiting (a dead one is left
        to ``shutdown``)."""
        self.calls.answers([lr.stop_waiting.remote() for lr in self.learners], timeout_s=1.0)

    def learner_state(self) -> dict:
        return self.calls.get(self.learners[0].state_dict.remote(),
                              "learner-0 (state for checkpoint)")

    def load_learner_state(self, state: dict) -> None:
        ref = self.ray.put(state)
        self.calls.get([lr.load_state_dict.remote(ref) for lr in self.learners],
                       "learners (loading state)")

    def placement(self) -> dict[str, str]:
        """The Ray node (its id) of each role process, by role name (``walle/learner-0``)."""
        roles = self._roles()
        nodes = self.calls.get([handle.where.remote() for handle in roles.values()],
                               "roles (placement)")
        return dict(zip(roles, nodes))

    def _roles(self) -> dict:
        """Every role process's handle, by its name (``walle/learner-0``)."""
        return {**dict(zip(self.sampler_names, self.samplers)),
                **dict(zip(self.memory_names, self.memories)),
                **{role_name("learner", g): lr
                   for g, lr in zip(self.packing.learners, self.learners)},
                **({"walle/ps": self.ps} if self.ps is not None else {})}

    def ask_usage(self) -> list:
        """A usage call to every role process (``Placed.usage``); the answers come through
        ``usage_answers``."""
        return [handle.usage.remote() for handle in self._roles().values()]

    def usage_answers(self, asked: list, timeout_s: float) -> tuple[list[dict], list]:
        """(the answers among ``asked`` that came within ``timeout_s``, the calls still in
        flight). A process that died or is restarting answers nothing."""
        return self.calls.answers(asked, timeout_s)

    def processes(self) -> int:
        """Role processes: samplers, memories, learners and the parameter server."""
        return (len(self.samplers) + len(self.memories) + len(self.learners)
                + (self.ps is not None))

    def _per_memory(self, method: str, what: str) -> list:
        """``method``'s answer for each logical memory, in topology order (none for a
        synchronous algorithm, which has no memory processes)."""
        if not self.memories:
            return []
        answers = self.calls.get([getattr(m, method).remote() for m in self.memories], what)
        merged = {k: value for answer in answers for k, value in answer.items()}
        return [merged[k] for k in range(self.topo.memories)]

    def memory_stats(self) -> list[dict]:
        return self._per_memory("stats", "memories")

    def memory_states(self) -> list[dict]:
        return self._per_memory("state_dict", "memories (snapshot)")

    def load_memory_states(self, states: list[dict]) -> None:
        self.calls.get([m.load_state_dict.remote({k: states[k] for k in group})
                        for m, group in zip(self.memories, self.packing.memories, strict=True)],
                       "memories (restoring the snapshot)")

    def shutdown(self) -> None:
        """Samplers first, then the rest. The calls still in flight are collected, so a
        sampler whose put met an already killed memory ends quietly rather than as an
        unhandled error printed after the run."""
        self.running = False
        for group, kinds in ((self.samplers, ("sampler", "restarted")),
                             ([*self.memories, *self.learners, self.ps], None)):
            for handle in group:
                if handle is not None:
                    self.ray.kill(handle, no_restart=True)
            self.calls.drain(kinds, timeout_s=3.0)

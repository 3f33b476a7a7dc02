"""The role instances of one run: ``LocalFleet`` in this process (``topology=local``),
``RayFleet`` (``runtime/ray_fleet.py``) as Ray actors. They differ only in where the roles
run. Each runs a synchronous algorithm (every sampler collects a fragment, then the
learners update once) or an asynchronous one (samplers fill memories while learners drain
them), as the algorithm's ``loop`` says, and both offer the driver loop (``runtime/loop.py``) the same calls:
``start``, ``step``, the learner's and memories' state, and ``shutdown``.

This module holds ``LocalFleet`` and what both share: the errors that name a failed role,
the ``Step`` a fleet returns, and the fault counters.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Callable
from dataclasses import dataclass, field

import gymnasium as gym
import torch
from omegaconf import DictConfig

from walle_ray.actors.param_server import ParameterServer
from walle_ray.actors.restart import RestartingSampler
from walle_ray.learners.collective import GroupLost
from walle_ray.runtime.checkpoint import first_line
from walle_ray.runtime.process import prepare_process, usable_cpus
from walle_ray.runtime.threads import ThreadChoice
from walle_ray.topology import Topology

if TYPE_CHECKING:
    from walle_ray.algos.spec import Algorithm


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
        name = re.search(r"^\s*name: (\S+)", str(cause), re.MULTILINE)  # Ray names the actor
        return RoleDied(f"{role} lost a role it was using{f' ({name[1]})' if name else ''}: "
                        f"{type(cause).__name__}: {first_line(cause)}")
    if isinstance(cause, GroupLost):  # another learner of its group died or stalled
        return RoleDied(f"{role} lost its learner group: {first_line(cause)}")
    if lost_an_object(exc):  # what it read lived on a process or node that is gone
        return RoleDied(f"{role} lost an object it was reading: {type(cause).__name__}")
    if lost_its_node(exc):
        whose = ("its node" if lost_its_node(exc, nested=False)
                 else "a role it was using, with its node")
        return RoleDied(f"{role} lost {whose}: {type(cause).__name__}: {first_line(cause)}")
    return RoleFailed(f"{role} failed: {type(cause).__name__}: {first_line(cause)}")


def lost_an_object(exc: BaseException) -> bool:
    """Whether an error raised inside a role is Ray's: an object it read was lost with the
    node or process that held or owned it."""
    import ray

    cause = getattr(exc, "cause", None) or exc
    return isinstance(cause, (ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError))


# where walle_ray's or Ray's own code runs, in a traceback's frame
RAY_CALLERS = re.compile(r"(^|[/\\])((site|dist)-packages[/\\]ray|walle_ray)[/\\]")


def lost_its_node(exc: BaseException, nested: bool = True) -> bool:
    """Whether an error raised inside a role is Ray's ``OSError`` ("Broken pipe"): the
    process's link to its node's raylet broke, as when the node is lost, in the moments
    before the process goes with it. It is told from an ``OSError`` of other code (a library
    that would not load, a full disk) by its lack of an errno and by where it was raised:
    under a call of walle_ray's or Ray's, the last frame of the traceback Ray shows (Ray
    hides its core's frames). ``nested``: an error of a role this one called counts too (a
    learner reading from a memory whose node went)."""
    wrapper, cause = None, exc
    while getattr(cause, "cause", None) is not None:  # Ray's wrappers, one per role called
        if wrapper is not None and not nested:
            return False
        wrapper, cause = cause, cause.cause
    if type(cause) is not OSError or cause.errno is not None or wrapper is None:
        return False
    frames = re.findall(r'File "([^"]+)"', str(wrapper))
    return bool(frames) and RAY_CALLERS.search(frames[-1]) is not None


@dataclass
class Step:
    """What one ``Fleet.step`` brought: sampler reports (env steps, episodes, timings),
    learner metrics (one dict per update call, with ``updates`` and ``env_steps_consumed``),
    and for a synchronous iteration its collect/learn wall-clock split."""

    reports: list[dict] = field(default_factory=list)
    learned: list[dict] = field(default_factory=list)
    timing: dict | None = None


# Asked of a synchronous iteration's sampler reports before its update: whether to make it.
LearnIf = Callable[[list[dict]], bool]


def new_faults() -> dict:
    """The fault counters every fleet reports as ``faults/<key>``."""
    return {"sampler_restarts": 0, "lost_fragments": 0, "stalls": 0}


def carry_faults(fleet, faults: dict, role_restarts: int) -> None:
    """A rebuilt fleet's fault counters go on from the last fleet's ``faults``, so they never
    go backwards: added into the dict that the new fleet and its sampler restarts count
    into, not put in its place."""
    fleet.faults.update(faults, role_restarts=role_restarts)


def count_faults(faults: dict, stats: dict) -> None:
    """Add a sampler report's fault counts (fragments lost to env failures) to ``faults``."""
    for key in faults:
        faults[key] += stats.pop(key, 0)


def timed_update(learner_metrics: dict, rows: int, learn_s: float) -> dict:
    """A synchronous update's metrics with the counters an asynchronous train call reports."""
    learner_metrics.update(updates=1, env_steps_consumed=rows, batch_wait_s=0.0, train_s=learn_s)
    return learner_metrics


def offline_updates_left(cfg: DictConfig, env_steps: int) -> int:
    """The updates an offline run, whose env steps are the recorded rows learned from
    (``algo.batch_size`` an update, over all its learners), has left after ``env_steps``."""
    return -(-(cfg.run.total_env_steps - env_steps) // cfg.algo.batch_size)


def capped(most: int, left: int) -> int:
    """``most`` updates for a call, no more than the ``left`` a budget needs; ``most`` again
    once none are left, so that a run whose learners took fewer rows still reaches its end."""
    return most if left <= 0 else min(most, left)


class LocalFleet:
    """Every role in the driver process; the reference the Ray fleet is tested against.
    An asynchronous step is one fragment per sampler, then every update the memories can
    serve (capped per step where a memory is ``free_running``)."""

    lanes = frozenset()  # its samplers step in turn (``RayFleet.lanes``)

    def __init__(self, cfg: DictConfig, algo: Algorithm, topo: Topology, obs_space: gym.Space,
                 action_space: gym.Space):
        # The driver is every role's process, and they take turns: the learner may run a
        # thread on each of its CPUs while the samplers wait, and unless
        # ``learner.torch_threads`` says, it times whether they pay (``runtime/threads.py``).
        prepare_process(cfg.learner.torch_threads or usable_cpus())
        choose = not cfg.learner.torch_threads and not cfg.algo.get("compile", False)
        self.threads = ThreadChoice(torch.get_num_threads(), choose=choose)
        self.cfg = cfg
        self.sync = algo.loop == "sync"
        self.topo = topo
        self.offline = algo.reads_dataset  # topology=local: its one sampler is not made
        self.samplers = [RestartingSampler(*algo.sampler(cfg, topo, i))
                         for i in range(0 if self.offline else topo.samplers)]
        self.envs = len(self.samplers) * int(cfg.env.envs_per_sampler)  # stepped in all
        self.faults = new_faults()
        self.learner = algo.build_learner(cfg, obs_space, action_space)
        self.ps = ParameterServer()
        # A synchronous algorithm's learner takes the iteration's fragments directly.
        self.memories = [] if self.sync else [cls(*args, **kwargs) for cls, args, kwargs in
                                              (algo.memory(cfg, k) for k in range(topo.memories))]
        self.publish_every = cfg.algo.get("publish_every", 1)
        self.overlap, self.prefetched = bool(cfg.algo.get("overlap", False)), None
        self.max_updates = (cfg.algo.updates_per_call
                            if any(getattr(m, "free_running", False) for m in self.memories) else None)

    def publish(self) -> None:
        version, weights = self.learner.weights()
        self.ps.publish(version, weights)
        for memory in self.memories:
            if getattr(memory, "wants_weights", False):  # it ranks rows with the current policy
                memory.set_weights(weights, version)

    # The samplers' weights feed (``contracts.WeightsFeed``): the parameter server at hand.
    lead = 0

    def refresh(self, sampler) -> None:
        """Give a sampler the newest weights, if it does not have them."""
        latest = self.ps.latest(sampler.version)
        if latest is not None:
            sampler.set_weights(latest[1], latest[0])

    def ahead(self) -> None:
        pass

    def start(self, env_steps: int = 0) -> None:
        self.publish()

    def _collect(self, sampler) -> tuple:
        item, stats = sampler.collect(self)
        count_faults(self.faults, stats)
        return item, stats

    def _collect_all(self) -> list[tuple]:
        """A fragment of every sampler: (the fragment, its report)."""
        return [self._collect(sampler) for sampler in self.samplers]

    def step(self, env_steps: int, learn_if: LearnIf | None = None) -> Step:
        """Collect, and learn from what memories can serve; a synchronous fleet's step is
        one iteration, whose update is made only where ``learn_if(reports)`` (when given)
        says so."""
        if self.sync:
            return self._iteration(env_steps, learn_if)
        reports = []
        for i, sampler in enumerate(self.samplers):
            memory = self.memories[self.topo.memory_of_sampler(i)]
            item, stats = self._collect(sampler)
            stats["dropped"] = 0 if memory.has_room(item) else 1
            if not stats["dropped"]:
                memory.put(item)
            reports.append(stats)
        return Step(reports, [m for memory in self.memories for m in self._drain(memory, env_steps)])

    def _iteration(self, env_steps: int, learn_if: LearnIf | None) -> Step:
        """Every sampler's fragment, then one update on them (none where ``learn_if`` says
        not). With ``algo.overlap`` the next batch is collected before the update, with the
        weights the Ray fleet's samplers would have while the learner works: the same data,
        one after the other."""
        t0 = time.perf_counter()
        collected, self.prefetched = self.prefetched or self._collect_all(), None
        rollouts = [rollout for rollout, _ in collected]
        reports = [stats for _, stats in collected]
        if learn_if is not None and not learn_if(reports):
            if self.overlap:  # these episodes were played by the weights before the update
                self.learner.rewind()
            return Step(reports, [], {"collect_s": time.perf_counter() - t0, "learn_s": 0.0})
        if self.overlap:
            self.prefetched = self._collect_all()
        t1 = time.perf_counter()
        metrics = self.threads.update(self.learner, rollouts, env_steps)
        self.publish()
        t2 = time.perf_counter()
        learned = timed_update(metrics, sum(r.num_steps for r in rollouts), t2 - t1)
        return Step(reports, [learned], {"collect_s": t1 - t0, "learn_s": t2 - t1})

    def _drain(self, memory, env_steps: int):
        """Updates on the batches ``memory`` can serve now, feedback going back to it."""
        updates = 0
        most = (capped(self.max_updates, offline_updates_left(self.cfg, env_steps))
                if self.offline else self.max_updates)
        while memory.can_sample() and (most is None or updates < most):
            batch = memory.sample()
            metrics = self.threads.update(self.learner, [batch], env_steps, steps=1)
            feedback = self.learner.memory_feedback()
            if feedback is not None:
                memory.feedback(feedback)
            updates += 1
            if self.learner.version % self.publish_every == 0:
                self.publish()
            yield timed_update(metrics, batch.num_steps, 0.0)

    def processes(self) -> int:
        """Role processes besides the driver: none, every role runs in it."""
        return 0

    def ask_usage(self) -> list:
        """No role process to ask: the driver's own CPU time is the run's."""
        return []

    def usage_answers(self, asked: list, timeout_s: float) -> tuple[list[dict], list]:
        return [], []

    def stop_learning(self) -> None:
        """The loop is over; here no learner waits for batches on a thread of its own."""

    def learner_state(self) -> dict:
        return self.learner.state_dict()

    def load_learner_state(self, state: dict) -> None:
        self.learner.load_state_dict(state)

    def memory_stats(self) -> list[dict]:
        return [m.stats() for m in self.memories]

    def memory_states(self) -> list[dict]:
        return [m.state_dict() for m in self.memories]

    def load_memory_states(self, states: list[dict]) -> None:
        for memory, state in zip(self.memories, states, strict=True):
            memory.load_state_dict(state)

    def shutdown(self) -> None:
        for s in self.samplers:
            s.close()

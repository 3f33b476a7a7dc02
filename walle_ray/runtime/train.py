"""The driver of a training run: check and build (``runtime/start.py``), loop, log,
checkpoint, rebuild after a failure, stop."""

from __future__ import annotations

import sys
import time
import weakref
from dataclasses import dataclass, field
from os import cpu_count
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from ray.exceptions import RayError

from walle_ray.config import to_container
from walle_ray.logging.metrics import Progress, ReturnWindow, Sinks
from walle_ray.models.precision import describe as describe_bf16
from walle_ray.runtime.auto import ClusterWatch, Replan, node_cpus, replan
from walle_ray.runtime.checkpoint import (arrays_to_tensors, first_line, load_checkpoint,
                                          save_checkpoint)
from walle_ray.runtime.files import write_text_atomic
from walle_ray.runtime.fleet import RoleDied, RoleError, carry_faults
from walle_ray.runtime.footprint import Footprint
from walle_ray.runtime.loop import Periodic, run_loop, stop_reason
from walle_ray.runtime.milestones import Milestones, milestone_targets
from walle_ray.runtime.outputs import Evaluation, make_sinks, milestone_summary
from walle_ray.runtime.signals import StopSignals
from walle_ray.runtime.start import (Start, checked_start, make_fleet, restore_memories,
                                     resume_into)
from walle_ray.runtime.times import RunTimes
from walle_ray.topology import parse_topology


@dataclass
class RunResult:
    """What a finished run returns (``walle_ray.train``)."""

    run_dir: Path
    counters: dict  # env_steps, iterations, episodes, wall_s, ...
    stopped_by: str  # budget | wall | return | signal
    exit_code: int
    metrics: dict = field(default_factory=dict)  # the last record, as in metrics.jsonl


def train(cfg: DictConfig, run_dir: Path, overrides: list[str] | None = None) -> RunResult:
    """Train until a budget runs out or a signal arrives; always leave a checkpoint behind.

    ``overrides`` (the command line's) are kept in ``overrides.yaml`` once the run has passed
    its checks, for ``run.resume`` to start from; a refused attempt leaves them as they were.
    A SIGINT or SIGTERM from the first line on stops the run cleanly: during start-up, once
    the roles are up (a second Ctrl-C stops at once).
    """
    with StopSignals() as signals:
        return _train(cfg, run_dir, overrides, signals)


def _train(cfg: DictConfig, run_dir: Path, overrides: list[str] | None,
           signals: StopSignals) -> RunResult:
    run_dir = Path(run_dir)
    start = checked_start(cfg, run_dir)
    label = f"{cfg.algo.name} {cfg.env.name} {start.topo}"
    print(f"walle_ray: {label}: run directory {run_dir.resolve()}", flush=True)
    if len(start.obs_space.shape) == 3:
        print(f"walle_ray: {describe_bf16(cfg.model.bf16)}"
              + ("; GPU learners decide for their GPU" if cfg.learner.num_gpus > 0 else ""),
              flush=True)
    run = Run(cfg, run_dir, start, label)
    # once the run has passed its checks
    write_text_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    if overrides is not None:
        write_text_atomic(run_dir / "overrides.yaml", yaml.safe_dump(list(overrides)))
    return run.train(signals)


class Run:
    """A run from its first role to its last line: builds the fleet and the sinks, runs the
    loop, checkpoints, rebuilds every role from the last checkpoint when one dies (or, with
    topology=auto, when the cluster changes), and always leaves a checkpoint behind.

    ``self.topo`` and ``self.fleet`` are those of now (a rebuild replaces the fleet, a replan
    the topology); ``self.start`` keeps what was decided before the first role started."""

    def __init__(self, cfg: DictConfig, run_dir: Path, start: Start, label: str):
        self.cfg, self.run_dir, self.start, self.label = cfg, run_dir, start, label
        self.algo, self.topo, self.auto = start.algo, start.topo, start.auto
        self.counters = start.counters
        self.namespace = f"walle_ray-{run_dir.name}"
        self.last_saved_iteration = self.counters["iterations"]
        self.record: dict = {}
        self.fleet = make_fleet(cfg, self.algo, self.topo, start.obs_space, start.action_space,
                                namespace=self.namespace, first=True,
                                stall_dir=run_dir / "stalls")
        try:
            self._open()
        except BaseException:
            if hasattr(self, "metrics"):
                self.metrics.close(1)
            self.fleet.shutdown()
            raise

    def _open(self) -> None:
        """Restore a resumed run into the roles; open the sinks, the evaluations, the progress
        line, the milestones and the accounts of where the time goes (``report.json``)."""
        cfg, start, counters, auto = self.cfg, self.start, self.counters, self.auto
        if start.ckpt:
            resume_into(cfg, self.fleet, start.ckpt, counters, self.run_dir)
        self.metrics: Sinks = make_sinks(cfg, self.run_dir,
                                         counters["env_steps"] if start.ckpt is not None else None,
                                         on_ray=not self.topo.local)
        # The hooks read the fleet of the moment without holding the run, so no cycle keeps
        # the last fleet's learner and memories once train() has returned.
        me = weakref.ref(self)
        fleet_now = lambda: me().fleet  # noqa: E731
        # A run with no samplers sees episodes only in evaluation: the window holds one's.
        self.window = ReturnWindow(cfg.eval.episodes if start.offline else cfg.run.return_window,
                                   counters.get("recent_returns"))
        self.evaluation = (Evaluation(cfg, fleet_now, self.run_dir, self.metrics.media,
                                      self.window if start.offline else None)
                           if start.eval_every else None)
        if self.evaluation is not None:
            self.metrics.also_close.append(self.evaluation)
        self.footprint = Footprint(fleet_now, counters)
        self.progress = Progress(self.label, cfg.run.total_env_steps, cfg.logger.progress,
                                 cfg.logger.print_every_s)
        self.milestones = Milestones(milestone_targets(cfg.run), counters, fleet_now, self.window)
        self.times = RunTimes.for_run(cfg, self.algo, self.topo, self.run_dir,
                                      resumed=start.ckpt is not None, fleet=self.fleet)
        if auto is not None:
            self.times.meta["auto"] = auto.to_json()
        self.times.meta["cpus"] = (auto.cpus if auto is not None else
                                   [float(cpu_count() or 1)] if self.topo.local else node_cpus())

    def checkpoint(self) -> None:
        counters = self.counters
        counters["recent_returns"] = list(self.window.returns)
        self.milestones.keep_totals()
        payload = {"learner": self.fleet.learner_state(), "counters": counters,
                   "config": to_container(self.cfg)}
        if self.cfg.memory.checkpoint:
            payload["memories"] = arrays_to_tensors(self.fleet.memory_states())
        save_checkpoint(self.run_dir / "checkpoints" / "last.pt", payload)
        self.last_saved_iteration = counters["iterations"]

    def rebuild(self, failure: RoleDied) -> None:
        """Replace every role, restoring the learners from the last checkpoint; with
        topology=auto, as the plan for the cluster of now says."""
        cfg, counters = self.cfg, self.counters
        if isinstance(failure, Replan):  # no role failed: not a restart
            print(f"walle_ray: {failure}; rebuilding the roles from a checkpoint made now",
                  flush=True)
        else:
            counters["restarts"] = counters.get("restarts", 0) + 1
            print(f"walle_ray: {failure}; rebuilding the roles from the last checkpoint "
                  f"(restart {counters['restarts']} of run.max_restarts="
                  f"{cfg.run.max_restarts})", file=sys.stderr, flush=True)
        faults = self.fleet.faults  # counters carry over, so they never go backwards
        self.fleet.shutdown()
        if not self.topo.local:  # a node just lost is listed as alive for a while: not on it
            from walle_ray.runtime.ray_init import settle_nodes

            settle_nodes()
        replanned = self.auto is not None and replan(cfg, self.auto)
        if replanned:  # the run's config and report say what runs now
            self.topo = parse_topology(cfg.topology.spec)
            write_text_atomic(self.run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        if self.auto is not None:
            self.times.meta.update(auto=self.auto.to_json(), cpus=self.auto.cpus)
        self.fleet = make_fleet(cfg, self.algo, self.topo, self.start.obs_space,
                                self.start.action_space, namespace=self.namespace,
                                first=replanned, stall_dir=self.run_dir / "stalls")
        self.times.replanned(cfg, self.algo, self.topo, self.fleet)
        carry_faults(self.fleet, faults, counters.get("restarts", 0))
        last = self.run_dir / "checkpoints" / "last.pt"
        if last.is_file():
            saved = load_checkpoint(last)
            self.fleet.load_learner_state(saved["learner"])
            restore_memories(cfg, self.fleet, saved)

    def report(self, record: dict) -> None:
        self.record = record
        self.metrics.write(record)
        self.progress.update(record)

    def hooks(self, signals: StopSignals, started: tuple[float, int]) -> list:
        """What each record passes through, in order (``runtime/loop.py``, ``Periodic``)."""
        cfg, counters, evaluation = self.cfg, self.counters, self.evaluation
        hooks = [Periodic("env_steps", self.start.eval_every, evaluation,
                          counters["env_steps"])] if evaluation else []
        hooks += [self.footprint, self.milestones,
                  Periodic("iteration", 1, self.report, counters["iterations"]),
                  Periodic("iteration", cfg.run.checkpoint_every, lambda _: self.checkpoint(),
                           counters["iterations"])]
        if self.auto is not None:  # last: the record that finds the change is written first
            hooks.append(ClusterWatch(self.auto, lambda: stop_reason(
                cfg, counters, self.window, started[0], signals) is not None))
        return hooks

    def train(self, signals: StopSignals) -> RunResult:
        """The loop until a budget, the return, a signal or an error stops it; then the final
        checkpoint, the sinks' summaries and the report."""
        cfg, counters = self.cfg, self.counters
        stopped_by = "error"
        started = (time.perf_counter(), counters["env_steps"])
        signals.starting = False
        ended = False  # the loop stopped for a reason of its own (budget, return, signal)
        try:
            hooks = self.hooks(signals, started)
            while True:
                try:
                    stopped_by = run_loop(cfg, self.fleet, counters, self.window, hooks,
                                          signals, started, times=self.times)
                    ended = True
                    break
                except Replan as change:  # the cluster changed under topology=auto
                    try:
                        self.checkpoint()
                    except (RoleError, RayError):  # a role went with the node: the last stands
                        pass
                    self.rebuild(change)
                except RoleDied as failure:
                    if counters.get("restarts", 0) >= cfg.run.max_restarts:
                        raise RoleDied(f"{failure}; gave up after run.max_restarts="
                                       f"{cfg.run.max_restarts} restarts") from None
                    self.rebuild(failure)
        finally:
            self._close(ended, stopped_by, signals)
        counters["faults"] = dict(self.fleet.faults)
        self.times.finish(self.run_dir, counters)  # the bottleneck report: report.json
        print(f"walle_ray: {self.label}: stopped ({stopped_by}) at {counters['env_steps']} env "
              f"steps; {'evaluation ' if self.start.offline else ''}return "
              f"{self.window.mean:.2f}; results in {self.run_dir.resolve()}", flush=True)
        return RunResult(self.run_dir, counters, stopped_by, signals.exit_code, dict(self.record))

    def _close(self, ended: bool, stopped_by: str, signals: StopSignals) -> None:
        """The final checkpoint, then the sinks and the roles, whatever stopped the loop. A
        run that ended writes one even after no iteration (this command's minutes and
        core-hours count); one stopped by an error only if it learned since the last."""
        self.progress.close()
        self.milestones.finish()
        try:
            self.fleet.stop_learning()
            if ended or self.counters["iterations"] > self.last_saved_iteration or not (
                    self.run_dir / "checkpoints" / "last.pt").exists():
                self.checkpoint()
        except (RoleError, RayError) as exc:  # a dead learner cannot hand over its state
            print(f"walle_ray: no final checkpoint ({first_line(exc)}); the last one, at "
                  f"iteration {self.last_saved_iteration}, is intact", file=sys.stderr,
                  flush=True)
        finally:
            self.metrics.summary(milestone_summary(self.counters))
            self.metrics.close(signals.exit_code or int(stopped_by == "error"))
            self.fleet.shutdown()

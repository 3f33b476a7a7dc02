"""The driver of a training run: build the roles, loop, log, checkpoint, stop."""

from __future__ import annotations

import sys
import time
from os import cpu_count
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import yaml
from omegaconf import DictConfig, OmegaConf
from ray.exceptions import RayError

from walle_ray.algos import algorithm_for, validate
from walle_ray.algos.spec import Algorithm
from walle_ray.config import ConfigError, to_container
from walle_ray.datasets import check_datasets, dataset_paths
from walle_ray.envs import env_spaces
from walle_ray.envs.masks import mask_mode
from walle_ray.logging.metrics import (MetricsFile, Progress, ReturnWindow, Sinks,
                                       keep_records_until)
from walle_ray.models.precision import describe as describe_bf16
from walle_ray.models.user import check_user_model
from walle_ray.runtime.times import RunTimes
from walle_ray.runtime.checkpoint import (CheckpointError, arrays_to_tensors, first_line,
                                          load_checkpoint, save_checkpoint, tensors_to_arrays)
from walle_ray.runtime.files import write_text_atomic
from walle_ray.runtime.auto import ClusterWatch, Replan, is_auto, node_cpus, plan_auto, replan
from walle_ray.runtime.fleet import RoleDied, RoleError
from walle_ray.runtime.footprint import Footprint
from walle_ray.runtime.loop import Periodic, run_loop, stop_reason
from walle_ray.report import run_cost
from walle_ray.runtime.milestones import Milestones, milestone_targets
from walle_ray.runtime.run_dir import check_run_dir, taken
from walle_ray.runtime.signals import StopSignals
from walle_ray.topology import check_samplers, parse_topology


@dataclass
class RunResult:
    """What a finished run returns (``walle_ray.train``)."""

    run_dir: Path
    counters: dict  # env_steps, iterations, episodes, wall_s, ...
    stopped_by: str  # budget | wall | return | signal
    exit_code: int
    metrics: dict = field(default_factory=dict)  # the last record, as in metrics.jsonl


def _check_resume(cfg: DictConfig, ckpt: dict, path: str) -> None:
    """A resumed run goes on with the algorithm, env and action masks it was trained with:
    another algorithm's update would take this one's optimizer state and counters as its
    own. Said before any role starts."""
    trained = (ckpt["config"].get("algo") or {}).get("name")
    if trained is not None and trained != cfg.algo.name:
        raise CheckpointError(f"checkpoint in {path} was trained with algo={trained}, not "
                              f"{cfg.algo.name}; resume it with algo={trained}, or start a new "
                              "run")
    old = ckpt["config"].get("env", {})
    for key in ("id", "entry_point"):
        if old.get(key) != cfg.env[key]:
            raise CheckpointError(f"checkpoint in {path} was trained on env.{key}="
                                  f"{old.get(key)!r}, not {cfg.env[key]!r}")
    masked = old.get("action_mask", "none")  # a checkpoint from before masks masked nothing
    if masked != cfg.env.action_mask:
        raise CheckpointError(f"checkpoint in {path} was trained with env.action_mask={masked}, "
                              f"not {cfg.env.action_mask}; resume it with "
                              f"env.action_mask={masked}")


def make_fleet(cfg: DictConfig, algo: Algorithm, topo, obs_space, action_space,
               namespace: str = "walle_ray", first: bool = False,
               stall_dir: Path | None = None):
    """A LocalFleet for ``topology=local``, else Ray actors packed into processes
    (``topology.pack``) and placed by the resource plan (``runtime/plan.py``). ``first``:
    the run's first build, which prints the plan and checks its memory against the machine
    before any role starts (a rebuild after a lost role makes the same plan). The stacks of
    stalled roles go to ``stall_dir``.

    Each run's actors live in their own Ray namespace, so two runs on one cluster can both
    name theirs ``walle/sampler-0``.
    """
    from walle_ray.runtime.fleet import LocalFleet
    from walle_ray.runtime.plan import (check_local_memory, check_plan_memory, plan_cpus,
                                        plan_processes)
    from walle_ray.runtime.ray_fleet import RayFleet
    from walle_ray.runtime.ray_init import (check_gpus, check_role_resources, cluster_resources,
                                            live_nodes, placement_lines, start_ray)

    if topo.local:
        if cfg.learner.num_gpus > 0:
            raise ConfigError("learner.num_gpus: topology=local runs on this process's CPU; "
                              "use a Ray topology such as 1a1m1l to place a learner on a GPU")
        if first:
            check_local_memory(cfg, algo, obs_space, action_space)
        return LocalFleet(cfg, algo, topo, obs_space, action_space)
    start_ray(cfg.run.ray_address, cfg.run.ray_num_cpus, namespace=namespace)
    cpus, gpus = cluster_resources()
    check_gpus(topo.learners, cfg.learner.num_gpus, gpus)
    packing, processes = plan_processes(cfg, algo, topo, cpus)
    nodes = live_nodes()
    resources = [node["Resources"] for node in nodes.values()]
    check_role_resources(cfg.topology.resources, {
        "sampler": processes.samplers, "memory": processes.memories,
        "learner": processes.learners, "ps": processes.param_servers}, resources)
    plan = plan_cpus(cfg, algo, topo, processes, cpus, resources)
    if first:
        print(f"walle_ray: {topo} on {cpus:g} CPUs: "
              f"{packing.describe(topo, memories=algo.loop != 'sync')} "
              f"(topology.pack={cfg.topology.pack})", flush=True)
        crowded = crowded_envs(topo.samplers, cfg.env.envs_per_sampler, cpus)
        if crowded:
            print(f"walle_ray: {crowded}", flush=True)
        check_plan_memory(cfg, algo, topo, packing, processes, cpus, obs_space, action_space,
                          resources)
    fleet = RayFleet(cfg, algo, topo, obs_space, action_space, plan, cfg.run.role_timeout_s,
                     packing, stall_dir)
    if len(nodes) > 1:  # where each role process runs, on a cluster
        try:
            placement = fleet.placement()
        except BaseException:
            fleet.shutdown()
            raise
        print(f"walle_ray: role processes on {len(set(placement.values()))} of the cluster's "
              f"{len(nodes)} nodes:", *placement_lines(placement, nodes), sep="\n", flush=True)
    return fleet


ENVS_PER_CPU = 32  # above this, a run's envs each step slowly enough for a note


def crowded_envs(samplers: int, envs_per_sampler: int, cpus: float) -> str | None:
    """A note for a topology whose envs crowd the cluster's CPUs: each env then plays its
    episodes slowly, so the return (the mean of the last finished episodes) and the
    milestones report late (docs/performance.md, "Many envs on few cores"). None otherwise."""
    envs = samplers * envs_per_sampler
    if cpus <= 0 or envs / cpus <= ENVS_PER_CPU:
        return None
    fewer = max(1, int(ENVS_PER_CPU * cpus) // envs_per_sampler)
    return (f"{envs} envs ({samplers} samplers x {envs_per_sampler}) share {cpus:g} CPUs, so "
            "each finishes its episodes slowly and the return and milestones report late by "
            f"about an episode's length; {fewer} samplers or fewer report sooner")


def restore_memories(cfg: DictConfig, fleet, ckpt: dict) -> None:
    """Refill the replay shards from the checkpoint's snapshot (``memory.checkpoint=true``)."""
    if not cfg.memory.checkpoint or "memories" not in ckpt:
        return
    states = tensors_to_arrays(ckpt["memories"])
    if len(states) != fleet.topo.memories:
        raise CheckpointError(f"the checkpoint holds {len(states)} replay shards; this topology "
                              f"has {fleet.topo.memories} memories")
    fleet.load_memory_states(states)
    # IMPALA's mixed memories count rows (``held``), the replay shards transitions (``ids``).
    rows = any("held" in state for state in states)
    held = sum(int(state["held"]) if rows else len(state["ids"]) for state in states)
    print(f"walle_ray: replay restored: {held} {'rows' if rows else 'transitions'} in "
          f"{len(states)} memor{'ies' if len(states) > 1 else 'y'}", flush=True)


def milestone_summary(counters: dict) -> dict:
    """The run's milestones and cost, for the sinks' summaries (W&B, TensorBoard)."""
    out = {f"milestones/{score}/{key}": value
           for score, entry in counters.get("milestones", {}).items()
           for key, value in entry.items() if key != "gpu_hours" or value}
    cost = run_cost(counters)
    out.update(minutes=cost["minutes"], core_hours=cost["core_hours"])
    if cost["gpu_hours"]:
        out["gpu_hours"] = cost["gpu_hours"]
    return out


def make_sinks(cfg: DictConfig, run_dir: Path, resumed_at: int | None, on_ray: bool) -> Sinks:
    """metrics.jsonl always; W&B with logger=wandb; TensorBoard with logger.tensorboard; Ray
    gauges when running on Ray. ``resumed_at``: the env steps of the checkpoint a resumed
    run starts from; metrics.jsonl and TensorBoard drop what they hold past it, and the
    resumed run writes those steps again (W&B keeps it: docs/watching.md). Where W&B or TensorBoard take media, the end of a synchronous
    run adds its timing figure (``<run dir>/timing.png``).

    A new run creates metrics.jsonl: where another run created it first, in the same
    directory since ``check_run_dir`` looked, it is refused."""
    try:
        sinks = [MetricsFile(run_dir / "metrics.jsonl", append=resumed_at is not None)]
    except FileExistsError:
        raise ConfigError(taken(run_dir, ["metrics.jsonl"])) from None
    try:
        if cfg.logger.name == "wandb":
            from walle_ray.logging.wandb_sink import WandbSink

            sinks.append(WandbSink(cfg, run_dir, resumed_at is not None))
        if cfg.logger.tensorboard:
            from walle_ray.logging.tensorboard_sink import TensorBoardSink

            sinks.append(TensorBoardSink(cfg, run_dir, resumed_at))
        if cfg.logger.ray_metrics and on_ray:
            from walle_ray.logging.ray_metrics import RayMetrics

            sinks.append(RayMetrics(run_dir.name, cfg.algo.name, cfg.env.name))
    except BaseException:
        Sinks(sinks).close(1)
        raise
    metrics = Sinks(sinks)
    if metrics.takes_media:
        from walle_ray.logging.timing import timing_image

        metrics.at_close.append(lambda all_sinks: timing_image(run_dir, all_sinks))
    return metrics


class Evaluation:
    """Episodes on separate envs with the current learner weights (greedy unless
    ``eval.deterministic=false``), as a periodic hook every ``eval.every_env_steps``;
    ``fleet()`` gives the fleet of the moment, which a restart replaces.

    With ``eval.video`` each evaluation's episodes are kept as
    ``<eval.video_dir or run dir/videos>/<env_steps>/episode-NNN.mp4`` and handed to
    ``media`` (``Sinks.media``) as the videos ``eval/video``. A run with no samplers
    (``algo=bc``) passes its ``window``: its episodes are these, so the run's return, the
    progress line and ``run.stop_at_return`` read the evaluations."""

    def __init__(self, cfg: DictConfig, fleet: Callable, run_dir: Path,
                 media: Callable | None = None, window: ReturnWindow | None = None):
        from walle_ray.runtime.evaluate import Evaluator

        self.cfg, self.fleet, self.media, self.window = cfg, fleet, media, window
        self.video_dir = Path(cfg.eval.video_dir or run_dir / "videos") if cfg.eval.video else None
        self.evaluator = Evaluator(cfg, seed=cfg.run.seed + 10_000,
                                   deterministic=cfg.eval.deterministic, video_dir=self.video_dir)

    def __call__(self, record: dict) -> dict:
        state = self.fleet().learner_state()
        weights = {k: v.detach().cpu().numpy() for k, v in state["model"].items()}
        result = self.evaluator.run(weights, int(state["version"]), self.cfg.eval.episodes)
        out = {"eval/return": result["return_mean"], "eval/return_std": result["return_std"]}
        if self.window is not None:  # the run's return is this evaluation's, in this record too
            self.window.add(result["returns"], result["lengths"])
            out.update({"return": self.window.mean, "episode_length": self.window.mean_length})
        if self.video_dir is not None:  # the Evaluator rewrites its files each run: move them on
            kept = self.video_dir / str(record["env_steps"])
            kept.mkdir(parents=True, exist_ok=True)
            videos = [Path(p).replace(kept / Path(p).name) for p in result["videos"]]
            if self.media is not None:
                self.media(record["env_steps"], videos={"eval/video": videos})
        return out

    def close(self) -> None:
        self.evaluator.close()


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
    algo = algorithm_for(cfg.algo)  # resolved here, once, and handed to every part
    validate(cfg, algo, own_checks=False)
    obs_space, action_space = env_spaces(cfg.env)
    cfg.env.action_mask = mask_mode(obs_space)  # auto decided once, here, for every role
    algo.check_spaces(obs_space, action_space)  # the wrong kind of env is the first thing to say
    auto = None
    if is_auto(cfg):  # measure, choose, and write the choice into cfg (runtime/auto.py)
        check_run_dir(Path(run_dir), cfg.run.resume)
        resumed = None
        if cfg.run.resume:  # the plan keeps the memories and learners the checkpoint holds
            resumed = load_checkpoint(Path(cfg.run.resume))["config"]["topology"]["spec"]
        auto = plan_auto(cfg, algo, obs_space, action_space, f"walle_ray-{Path(run_dir).name}",
                         resumed)
    topo = parse_topology(cfg.topology.spec)
    check_user_model(algo, obs_space, action_space, cfg)  # model._target_: one build, one forward
    check_samplers(topo, cfg.algo.name, algo.reads_dataset)
    algo.validate(cfg)
    offline = algo.reads_dataset
    # Offline runs evaluate 20 times over the budget unless told otherwise: evaluation is
    # their only measure of the policy.
    eval_every = cfg.eval.every_env_steps or (max(1, cfg.run.total_env_steps // 20) if offline
                                              else None)
    if offline:
        datasets = check_datasets(dataset_paths(cfg.dataset.path), obs_space, action_space,
                                  cfg.env.id, topo.memories)
        print(f"walle_ray: dataset: {sum(d.episodes for d in datasets)} episodes, "
              f"{sum(d.steps for d in datasets)} steps from "
              f"{', '.join(str(d.path) for d in datasets)}", flush=True)
        # Memories may run in another directory or on another node: they get the data
        # directories as found here, absolute.
        cfg.dataset.path = [str(d.path) for d in datasets]
    run_dir = Path(run_dir)
    check_run_dir(run_dir, cfg.run.resume)  # never another run's files
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = None
    if cfg.run.resume:
        ckpt = load_checkpoint(Path(cfg.run.resume))
        _check_resume(cfg, ckpt, cfg.run.resume)
    torch.manual_seed(cfg.run.seed)

    counters = dict(ckpt["counters"]) if ckpt else {
        "env_steps": 0, "iterations": 0, "episodes": 0, "wall_s": 0.0, "recent_returns": []}
    label = f"{cfg.algo.name} {cfg.env.name} {topo}"
    print(f"walle_ray: {label}: run directory {run_dir.resolve()}", flush=True)
    if len(obs_space.shape) == 3:
        print(f"walle_ray: {describe_bf16(cfg.model.bf16)}"
              + ("; GPU learners decide for their GPU" if cfg.learner.num_gpus > 0 else ""),
              flush=True)
    namespace = f"walle_ray-{run_dir.name}"
    fleet = make_fleet(cfg, algo, topo, obs_space, action_space, namespace=namespace,
                       first=True, stall_dir=run_dir / "stalls")
    try:
        if ckpt:
            try:
                fleet.load_learner_state(ckpt["learner"])
            except (RuntimeError, KeyError, ValueError) as exc:
                raise CheckpointError(f"checkpoint {cfg.run.resume} does not fit this model "
                                      f"({first_line(exc)})") from None
            restore_memories(cfg, fleet, ckpt)
            print(f"walle_ray: resumed at {counters['env_steps']} env steps, "
                  f"iteration {counters['iterations']}", flush=True)
            dropped = keep_records_until(run_dir / "metrics.jsonl", counters["iterations"])
            if dropped:
                print(f"walle_ray: metrics.jsonl: {dropped} line(s) after the checkpoint dropped; "
                      "the resumed run writes those iterations again", flush=True)
        metrics = make_sinks(cfg, run_dir, counters["env_steps"] if ckpt is not None else None,
                             on_ray=not topo.local)
        # A run with no samplers sees episodes only in evaluation: the window holds one's.
        window = ReturnWindow(cfg.eval.episodes if offline else cfg.run.return_window,
                              counters.get("recent_returns"))
        evaluation = (Evaluation(cfg, lambda: fleet, run_dir, metrics.media,
                                 window if offline else None) if eval_every else None)
        if evaluation is not None:
            metrics.also_close.append(evaluation)
    except BaseException:
        fleet.shutdown()
        raise
    # once the run has passed its checks
    write_text_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    if overrides is not None:
        write_text_atomic(run_dir / "overrides.yaml", yaml.safe_dump(list(overrides)))
    progress = Progress(label, cfg.run.total_env_steps, cfg.logger.progress, cfg.logger.print_every_s)
    state = {"counters": counters, "last_saved_iteration": counters["iterations"], "record": {}}

    milestones = Milestones(milestone_targets(cfg.run), counters, lambda: fleet, window)

    def checkpoint() -> None:
        counters["recent_returns"] = list(window.returns)
        milestones.keep_totals()
        payload = {"learner": fleet.learner_state(), "counters": counters,
                   "config": to_container(cfg)}
        if cfg.memory.checkpoint:
            payload["memories"] = arrays_to_tensors(fleet.memory_states())
        save_checkpoint(run_dir / "checkpoints" / "last.pt", payload)
        state["last_saved_iteration"] = counters["iterations"]

    def rebuild(failure: RoleDied) -> None:
        """Replace every role, restoring the learners from the last checkpoint; with
        topology=auto, as the plan for the cluster of now says."""
        nonlocal fleet, topo
        if isinstance(failure, Replan):  # no role failed: not a restart
            print(f"walle_ray: {failure}; rebuilding the roles from a checkpoint made now",
                  flush=True)
        else:
            counters["restarts"] = counters.get("restarts", 0) + 1
            print(f"walle_ray: {failure}; rebuilding the roles from the last checkpoint "
                  f"(restart {counters['restarts']} of run.max_restarts="
                  f"{cfg.run.max_restarts})", file=sys.stderr, flush=True)
        faults = fleet.faults  # counters carry over, so they never go backwards
        fleet.shutdown()
        if not topo.local:  # a node just lost is listed as alive for a while: not on it
            from walle_ray.runtime.ray_init import settle_nodes

            settle_nodes()
        replanned = auto is not None and replan(cfg, auto)
        if replanned:  # the run's config and report say what runs now
            topo = parse_topology(cfg.topology.spec)
            write_text_atomic(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
            times.replanned(cfg, algo, topo)
        if auto is not None:
            times.meta.update(auto=auto.to_json(), cpus=auto.cpus)
        fleet = make_fleet(cfg, algo, topo, obs_space, action_space, namespace=namespace,
                           first=replanned, stall_dir=run_dir / "stalls")
        fleet.faults = faults
        fleet.faults["role_restarts"] = counters.get("restarts", 0)
        last = run_dir / "checkpoints" / "last.pt"
        if last.is_file():
            saved = load_checkpoint(last)
            fleet.load_learner_state(saved["learner"])
            restore_memories(cfg, fleet, saved)

    times = RunTimes.for_run(cfg, algo, topo, run_dir, resumed=ckpt is not None)  # report.json
    if auto is not None:
        times.meta["auto"] = auto.to_json()
    times.meta["cpus"] = (auto.cpus if auto is not None else [float(cpu_count() or 1)]
                          if topo.local else node_cpus())
    stopped_by = "error"
    start = (time.perf_counter(), counters["env_steps"])
    signals.starting = False
    ended = False  # the loop stopped for a reason of its own (budget, return, signal), not an error
    try:
        def report(record: dict) -> None:
            state["record"] = record
            metrics.write(record)
            progress.update(record)

        hooks = [Periodic("env_steps", eval_every, evaluation,
                          counters["env_steps"])] if evaluation else []
        hooks += [Footprint(lambda: fleet, counters), milestones,
                  Periodic("iteration", 1, report, counters["iterations"]),
                  Periodic("iteration", cfg.run.checkpoint_every, lambda _: checkpoint(),
                           counters["iterations"])]
        if auto is not None:  # last: the record that finds the change is written first
            hooks.append(ClusterWatch(auto, lambda: stop_reason(
                cfg, counters, window, start[0], signals) is not None))
        while True:
            try:
                stopped_by = run_loop(cfg, fleet, counters, window, hooks, signals, start,
                                      times=times)
                ended = True
                break
            except Replan as change:  # the cluster changed under topology=auto
                try:
                    checkpoint()
                except (RoleError, RayError):  # a role went with the node: the last one stands
                    pass
                rebuild(change)
            except RoleDied as failure:
                if counters.get("restarts", 0) >= cfg.run.max_restarts:
                    raise RoleDied(f"{failure}; gave up after run.max_restarts="
                                   f"{cfg.run.max_restarts} restarts") from None
                rebuild(failure)
    finally:
        progress.close()
        milestones.finish()
        try:  # a run that ended writes one even after no iteration: this command's minutes
            # and core-hours count; one stopped by an error only if it learned since the last
            if ended or counters["iterations"] > state["last_saved_iteration"] or not (
                    run_dir / "checkpoints" / "last.pt").exists():
                checkpoint()
        except (RoleError, RayError) as exc:  # a dead learner cannot hand over its state
            print(f"walle_ray: no final checkpoint ({first_line(exc)}); the last one, at "
                  f"iteration {state['last_saved_iteration']}, is intact", file=sys.stderr,
                  flush=True)
        finally:
            metrics.summary(milestone_summary(counters))
            metrics.close(signals.exit_code or int(stopped_by == "error"))
            fleet.shutdown()
    counters["faults"] = dict(fleet.faults)
    times.finish(run_dir, counters)  # the bottleneck report: report.json and its paragraph
    print(f"walle_ray: {label}: stopped ({stopped_by}) at {counters['env_steps']} env steps; "
          f"{'evaluation ' if offline else ''}return {window.mean:.2f}; results in "
          f"{run_dir.resolve()}", flush=True)
    return RunResult(run_dir, counters, stopped_by, signals.exit_code, dict(state["record"]))

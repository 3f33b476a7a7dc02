"""What a run writes beyond its checkpoints: the metrics sinks (``make_sinks``), the summary
of its milestones and cost, and its periodic evaluations (``Evaluation``)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from omegaconf import DictConfig

from walle_ray.config import ConfigError
from walle_ray.logging.metrics import MetricsFile, ReturnWindow, Sinks
from walle_ray.report import run_cost
from walle_ray.runtime.run_dir import taken


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

"""Evaluation: whole episodes with given weights, from a checkpoint (mode=eval) or during
training (an Evaluator built once and run with each new set of weights)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from omegaconf import DictConfig, OmegaConf

from walle_ray.algos import algorithm_of
from walle_ray.config import ConfigError, EnvConfig, ModelConfig
from walle_ray.envs import is_atari, make_vector_env
from walle_ray.runtime.checkpoint import checked_config, latest_checkpoint, load_checkpoint
from walle_ray.runtime.video import AtariFrames, EpisodeVideos, GymFrames

def typed_sections(trained: DictConfig, algo_cls: type) -> SimpleNamespace:
    """The env, model and algo sections as the dataclasses envs and policies are built from."""
    schemas = {"env": EnvConfig, "model": ModelConfig, "algo": algo_cls}
    return SimpleNamespace(**{
        key: OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), trained[key]))
        for key, schema in schemas.items()})


class Evaluator:
    """Runs whole episodes of a trained run's env with given weights; build once, run often.

    ``trained`` is the config of the run the weights come from (its algo, env and model).
    The env is built as that run's samplers built theirs, as a single copy so that short
    episodes are not over-counted. Every ``run`` resets it with the same ``seed``, so
    successive evaluations differ only by the weights. With ``video_dir`` each episode is
    also written to ``video_dir/episode-NNN.mp4``; the next run overwrites them.
    """

    def __init__(self, trained: DictConfig, seed: int, deterministic: bool = True,
                 video_dir: Path | None = None):
        algo = algorithm_of(OmegaConf.to_container(trained.algo))
        cfg = typed_sections(trained, algo.config_cls)
        atari = is_atari(cfg.env.id)
        kwargs = dict(cfg.env.kwargs or {})
        if video_dir is not None and not atari:
            kwargs["render_mode"] = "rgb_array"  # changes what render returns, not the observations
        cfg.env = dataclasses.replace(cfg.env, envs_per_sampler=1, kwargs=kwargs)
        self.env_id = cfg.env.entry_point or cfg.env.id
        self.seed = seed
        self.env = make_vector_env(cfg.env)
        try:
            self.videos = None
            if video_dir is not None:
                source = AtariFrames(cfg.env.obs_size) if atari else GymFrames(self.env, cfg.env.id)
                self.videos = EpisodeVideos(source, Path(video_dir))
            obs_space, action_space = self.env.observation_space, self.env.action_space
            self.policy = algo.eval_policy(obs_space, action_space, cfg, seed, deterministic)
        except BaseException:
            self.env.close()
            raise

    def run(self, weights: dict[str, np.ndarray], version: int, episodes: int) -> dict:
        """``episodes`` whole episodes from a fresh reset.

        Returns are raw episode scores (Atari: unclipped game scores over whole games);
        ``videos`` lists the MP4 files written, one per episode, or is empty."""
        t0 = time.perf_counter()
        self.policy.set_weights(weights)
        reset = getattr(self.policy, "reset", None)  # a recurrent policy's state per episode
        if reset is not None:
            reset(np.ones(1, bool))
        obs = np.array(self.env.reset(seed=self.seed))
        reward = np.empty(1, np.float32)
        terminated, truncated = np.empty(1, bool), np.empty(1, bool)
        if self.videos is not None:
            self.videos.reset(obs)
        returns: list[float] = []
        lengths: list[int] = []
        while len(returns) < episodes:
            ended = self.env.step(self.policy.act(obs), obs, reward, terminated, truncated)
            if self.videos is not None:
                self.videos.step(obs, ended)
            if ended is not None:
                if reset is not None:
                    reset(terminated | truncated)
                returns += ended.episode_returns
                lengths += ended.episode_lengths
        return {"episodes": len(returns), "return_mean": float(np.mean(returns)),
                "return_std": float(np.std(returns)), "returns": returns, "lengths": lengths,
                "videos": [str(p) for p in self.videos.paths] if self.videos is not None else [],
                "version": version, "eval_s": time.perf_counter() - t0}

    def close(self) -> None:
        if self.videos is not None:
            self.videos.close()
        self.env.close()


def run_dir_of(checkpoint: Path) -> Path:
    """The run directory a checkpoint file (or a run directory) belongs to."""
    path = latest_checkpoint(checkpoint) if checkpoint.is_dir() else checkpoint
    return path.parent.parent if path.parent.name == "checkpoints" else path.parent


def evaluate(cfg: DictConfig) -> dict:
    """``mode=eval``: ``eval.episodes`` episodes of ``run.checkpoint``'s policy on its env,
    one MP4 per episode when ``eval.video``."""
    if not cfg.run.checkpoint:
        raise ConfigError("run.checkpoint: mode=eval needs a checkpoint file or run directory, "
                          "e.g. run.checkpoint=runs/<run>/checkpoints/last.pt")
    if cfg.eval.episodes < 1:
        raise ConfigError(f"eval.episodes: got {cfg.eval.episodes}; use a positive whole number, "
                          "e.g. eval.episodes=10")
    checkpoint = Path(cfg.run.checkpoint)
    video_dir = None
    if cfg.eval.video:
        video_dir = Path(cfg.eval.video_dir or run_dir_of(checkpoint) / "videos")
    return evaluate_checkpoint(checkpoint, cfg.eval.episodes, cfg.run.seed + 1,
                               cfg.eval.deterministic, video_dir, cfg.run.trust_code, own=cfg)


def evaluate_checkpoint(checkpoint: Path, episodes: int, seed: int, deterministic: bool = True,
                        video_dir: Path | None = None, trust_code: bool = False,
                        own: DictConfig | None = None) -> dict:
    """Run ``episodes`` episodes with a checkpoint's policy on the checkpoint's env, writing
    one MP4 per episode into ``video_dir`` when given; prints and returns the results. The
    code the checkpoint names is refused unless ``trust_code`` or the caller's config
    ``own`` names the same (``checkpoint.checked_config``)."""
    ckpt = load_checkpoint(checkpoint)
    trained = OmegaConf.create(checked_config(ckpt, checkpoint, trust_code, own))
    evaluator = Evaluator(trained, seed, deterministic, video_dir)
    try:
        weights = {k: v.numpy() for k, v in ckpt["learner"]["model"].items()}
        result = evaluator.run(weights, int(ckpt["learner"]["version"]), episodes)
    finally:
        evaluator.close()
    result.update(env_id=evaluator.env_id, env_steps_trained=ckpt["counters"]["env_steps"])
    print(f"walle_ray: eval {evaluator.env_id}: {result['episodes']} episodes, return "
          f"{result['return_mean']:.2f} ± {result['return_std']:.2f}", flush=True)
    if video_dir is not None:
        print(f"walle_ray: eval: {len(result['videos'])} videos in {video_dir.resolve()}",
              flush=True)
    return result

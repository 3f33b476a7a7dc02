"""mode=eval: greedy episodes from a checkpoint, mean and std of the return."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from walle_ray.actors.replay_sampler import ReplaySampler
from walle_ray.actors.sampler import Sampler
from walle_ray.algos import ALGORITHMS
from walle_ray.config import ConfigError, EnvConfig, ModelConfig
from walle_ray.runtime.checkpoint import load_checkpoint


def evaluate(cfg: DictConfig) -> dict:
    """Run ``eval.episodes`` episodes with the checkpoint's policy on the checkpoint's env."""
    if not cfg.run.checkpoint:
        raise ConfigError("run.checkpoint: mode=eval needs a checkpoint file or run directory, "
                          "e.g. run.checkpoint=runs/<run>/checkpoints/last.pt")
    ckpt = load_checkpoint(Path(cfg.run.checkpoint))
    trained = OmegaConf.create(ckpt["config"])
    env_cfg = trained.env
    env_cfg.envs_per_sampler = 1  # one env, so short episodes are not over-counted
    algo = ALGORITHMS.get(trained.algo.name)  # policy-gradient variants (ppo_kl) share ppo's
    if algo is not None and algo.replay:
        typed = {key: OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), trained[key]))
                 for key, schema in (("env", EnvConfig), ("model", ModelConfig),
                                     ("algo", algo.config_cls))}
        sampler = ReplaySampler(typed["env"], typed["model"], typed["algo"], algo.explorer, 256,
                                seed=cfg.run.seed + 1, greedy=cfg.eval.deterministic)
    else:
        sampler = Sampler(env_cfg, trained.model, fragment_length=256, gamma=1.0, index=0,
                          seed=cfg.run.seed + 1, deterministic=cfg.eval.deterministic)
    weights = {k: v.numpy() for k, v in ckpt["learner"]["model"].items()}
    sampler.set_weights(weights, int(ckpt["learner"]["version"]))
    returns: list[float] = []
    while len(returns) < cfg.eval.episodes:
        _, stats = sampler.collect()
        returns += stats["episode_returns"]
    sampler.close()
    returns = returns[: cfg.eval.episodes]
    result = {"episodes": len(returns), "return_mean": float(np.mean(returns)),
              "return_std": float(np.std(returns)), "returns": returns,
              "env_id": env_cfg.id, "env_steps_trained": ckpt["counters"]["env_steps"]}
    print(f"walle_ray: eval {env_cfg.id}: {len(returns)} episodes, return "
          f"{result['return_mean']:.2f} ± {result['return_std']:.2f}", flush=True)
    return result

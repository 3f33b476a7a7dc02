"""``mode=collect``: whole episodes of a trained policy (``run.checkpoint``), or of uniform
random actions (``collect.random=true``), written as a Minari dataset for the offline
algorithms (``algo=bc``, ``algo=marwil``) or anything else that reads Minari."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from omegaconf import DictConfig, OmegaConf

from walle_ray.algos import algorithm_of
from walle_ray.config import ConfigError, EnvConfig, env_name
from walle_ray.datasets import DatasetWriter
from walle_ray.envs import is_atari, make_vector_env
from walle_ray.runtime.checkpoint import checked_config, load_checkpoint
from walle_ray.runtime.evaluate import run_dir_of, typed_sections


class RandomPolicy:
    """Uniform random actions, seeded, as a policy gives them to the vector env: a Discrete
    or MultiDiscrete space's as indices from 0 (the env adds the space's start). Where the
    env masks actions (``obs_space.action_mask``), uniform over the allowed ones."""

    def __init__(self, action_space: gym.Space, seed: int, obs_space: gym.Space | None = None):
        self.space = action_space
        self.space.seed(seed)
        self.start = np.asarray(getattr(action_space, "start", 0))
        self.mask = getattr(obs_space, "action_mask", None)
        nvec = getattr(action_space, "nvec", None)
        self.splits = None if nvec is None else np.cumsum(nvec)[:-1]

    def act(self, obs: np.ndarray) -> np.ndarray:
        if self.mask is None:
            return np.stack([self.space.sample() for _ in range(len(obs))]) - self.start
        masks = (obs[:, self.mask[0]:self.mask[1]] > 0.5).astype(np.int8)
        if self.splits is None:
            return np.stack([self.space.sample(mask=m) for m in masks]) - self.start
        return np.stack([self.space.sample(mask=tuple(np.split(m, self.splits)))
                         for m in masks]) - self.start


class EpsilonMix:
    """A policy whose every action is replaced, with probability ``p`` per env and step, by
    a random policy's (a noisy-expert dataset)."""

    def __init__(self, policy, random: RandomPolicy, p: float, seed: int):
        self.policy, self.random, self.p = policy, random, p
        self.rng = np.random.default_rng([seed, 7])
        self.reset = getattr(policy, "reset", None)

    def act(self, obs: np.ndarray) -> np.ndarray:
        action = np.array(self.policy.act(obs))  # a recurrent policy's state still steps
        swap = self.rng.random(len(obs)) < self.p
        if swap.any():
            action[swap] = self.random.act(obs[swap]).astype(action.dtype)
        return action


def env_actions(action: np.ndarray, space: gym.Space) -> np.ndarray:
    """What the env was given for a policy's ``action``, as the dataset stores it: a Box's
    clipped to its bounds, a Discrete or MultiDiscrete one shifted by the space's start
    (``GymVectorEnv.step``)."""
    if isinstance(space, gym.spaces.Box):
        return np.clip(action, space.low, space.high)
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return (action + np.asarray(space.start)).astype(space.dtype)
    return np.asarray(action).astype(space.dtype)


def _check(c) -> None:
    if c.episodes is None and c.steps is None:
        raise ConfigError("collect.episodes: set how many episodes to record "
                          "(collect.episodes=200), or how many steps (collect.steps=1000000)")
    for key in ("episodes", "steps"):
        value = c[key]
        if value is not None and value <= 0:
            raise ConfigError(f"collect.{key}: must be positive (or null)")
    if c.envs <= 0:
        raise ConfigError("collect.envs: must be positive")
    if not 0 <= c.random_prob <= 1:
        raise ConfigError("collect.random_prob: is a probability; use a value in [0, 1]")
    if c.random_prob > 0 and c.random:
        raise ConfigError("collect.random_prob: mixes random actions into a checkpoint's; with "
                          "collect.random=true every action is random already")


def _policy_and_env(cfg: DictConfig):
    """(policy, env config, what acts, default out dir) for the checkpoint or random actions."""
    c = cfg.collect
    if c.random:
        if cfg.run.checkpoint:
            raise ConfigError("collect.random: records uniform random actions and reads no "
                              "checkpoint; leave run.checkpoint unset, or collect.random=false")
        if not c.out:
            raise ConfigError("collect.out: a random-action dataset needs a directory to go to, "
                              "e.g. collect.out=datasets/random")
        env_cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(EnvConfig), cfg.env))
        return None, env_cfg, "random", None
    if not cfg.run.checkpoint:
        raise ConfigError("run.checkpoint: mode=collect records a trained policy; give its "
                          "checkpoint file or run directory (run.checkpoint=runs/<run>), or "
                          "collect.random=true for random actions")
    checkpoint = Path(cfg.run.checkpoint)
    ckpt = load_checkpoint(checkpoint)
    trained = OmegaConf.create(checked_config(ckpt, checkpoint, cfg.run.trust_code, own=cfg))
    algo = algorithm_of(OmegaConf.to_container(trained.algo))
    sections = typed_sections(trained, algo.config_cls)
    weights = {k: v.numpy() for k, v in ckpt["learner"]["model"].items()}
    make = lambda obs_space, action_space, seed: _trained(  # noqa: E731
        algo, obs_space, action_space, sections, seed, c.deterministic, weights)
    return make, sections.env, f"walle_ray {algo.name}", run_dir_of(checkpoint) / "dataset"


def _trained(algo, obs_space, action_space, sections, seed, deterministic, weights):
    policy = algo.eval_policy(obs_space, action_space, sections, seed, deterministic)
    policy.set_weights(weights)
    return policy


def _env_spec(env_cfg: EnvConfig):
    """The gymnasium spec Minari stores with the dataset, where one describes what was
    recorded: a registered env, made without wrappers (ALE frames are preprocessed)."""
    if is_atari(env_cfg.id) or env_cfg.entry_point or env_cfg.wrappers or env_cfg.imports:
        return None
    try:
        spec = gym.spec(env_cfg.id)
    except gym.error.Error:
        return None
    changes = dict(env_cfg.kwargs or {})
    return dataclasses.replace(spec, kwargs={**spec.kwargs, **changes},
                               max_episode_steps=env_cfg.max_episode_steps or spec.max_episode_steps)


def collect(cfg: DictConfig) -> dict:
    """Record ``collect.episodes`` whole episodes (or until ``collect.steps``) into a new
    Minari dataset at ``collect.out``; prints progress and what it wrote."""
    c = cfg.collect
    make_policy, env_cfg, source, default_out = _policy_and_env(cfg)
    _check(c)
    out = Path(c.out or default_out)
    # Whole games: an Atari run that learned with a life as an episode is recorded by game.
    env_cfg = dataclasses.replace(env_cfg, envs_per_sampler=int(c.envs), episodic_life=False)
    env = make_vector_env(env_cfg)
    try:
        obs_space, action_space = env.observation_space, env.action_space
        seed = int(cfg.run.seed)
        policy = (RandomPolicy(action_space, seed, obs_space) if make_policy is None
                  else make_policy(obs_space, action_space, seed))
        if c.random_prob > 0 and make_policy is not None:
            policy = EpsilonMix(policy, RandomPolicy(action_space, seed + 1, obs_space),
                                c.random_prob, seed)
        name = c.name or f"walle_ray/{env_name(env_cfg.id, env_cfg.entry_point)}/" \
                         f"{re.sub(r'[^0-9a-z_]+', '_', out.resolve().name.lower()).strip('_') or 'dataset'}-v0"
        how = "random actions" if make_policy is None else (
            "greedy actions" if c.deterministic else "sampled actions")
        if isinstance(policy, EpsilonMix):
            how += f", each replaced by a random one with probability {c.random_prob:g}"
        writer = DatasetWriter(out, name, obs_space, action_space, _env_spec(env_cfg),
                               f"{source}, {how}, on {env_cfg.id}", source)
        result = _record(env, policy, writer, c, seed)
    finally:
        env.close()
    result.update(path=str(writer.path.resolve()), dataset_id=name)
    print(f"walle_ray: collect: wrote {result['episodes']} episodes ({result['steps']} steps, "
          f"return {result['return_mean']:.2f} ± {result['return_std']:.2f}) to {out.resolve()}; "
          f"learn from it with dataset.path={out} topology=0a1m1l algo=bc", flush=True)
    return result


def _record(env, policy, writer: DatasetWriter, c, seed: int) -> dict:
    """Step ``env`` with ``policy`` until enough whole episodes are written; an episode
    still running at the end is dropped."""
    n = env.num_envs
    reset = getattr(policy, "reset", None)  # a recurrent policy's state per episode
    if reset is not None:
        reset(np.ones(n, bool))
    obs = np.array(env.reset(seed=seed))
    reward = np.empty(n, np.float32)
    terminated, truncated = np.empty(n, bool), np.empty(n, bool)
    ep_obs = [[o.copy()] for o in obs]
    ep_act: list[list] = [[] for _ in range(n)]
    ep_rew: list[list] = [[] for _ in range(n)]
    returns: list[float] = []
    t0 = last = time.perf_counter()
    want_episodes = c.episodes if c.episodes is not None else float("inf")
    want_steps = c.steps if c.steps is not None else float("inf")
    try:
        while writer.episodes < want_episodes and writer.steps < want_steps:
            action = policy.act(obs)
            ended = env.step(action, obs, reward, terminated, truncated)
            executed = env_actions(action, env.action_space)
            for i in range(n):
                ep_act[i].append(executed[i])
                ep_rew[i].append(float(reward[i]))
                if not (terminated[i] or truncated[i]):
                    ep_obs[i].append(obs[i].copy())
                    continue
                ep_obs[i].append(ended.final_obs[i].copy())
                if writer.episodes < want_episodes and writer.steps < want_steps:
                    writer.add(np.stack(ep_obs[i]), np.stack(ep_act[i]), np.asarray(ep_rew[i]),
                               bool(terminated[i]))
                ep_obs[i], ep_act[i], ep_rew[i] = [obs[i].copy()], [], []
            if ended is not None:
                returns += ended.episode_returns
                if reset is not None:
                    reset(terminated | truncated)
            now = time.perf_counter()
            if now - last >= 5.0:
                last = now
                goal = (f"/{c.episodes}" if c.episodes is not None else "")
                recent = f", return {np.mean(returns[-20:]):.1f} (last 20)" if returns else ""
                print(f"walle_ray: collect: {writer.episodes}{goal} episodes, {writer.steps} steps"
                      f"{recent}, {writer.steps / (now - t0):.0f} steps/s", flush=True)
    finally:
        writer.flush()  # what was recorded stays, whatever stopped the loop
    kept = returns[:writer.episodes]
    return {"episodes": writer.episodes, "steps": writer.steps,
            "return_mean": float(np.mean(kept)) if kept else float("nan"),
            "return_std": float(np.std(kept)) if kept else float("nan"),
            "collect_s": time.perf_counter() - t0}

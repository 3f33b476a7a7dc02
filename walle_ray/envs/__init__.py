"""Environment factory: classic control, MuJoCo, ALE and the test envs, by gymnasium id."""

from __future__ import annotations

import difflib
import re

import gymnasium as gym

from walle_ray.config import ConfigError, EnvConfig
from walle_ray.envs.base import Ended, VectorEnv
from walle_ray.envs.testing import register_test_envs
from walle_ray.envs.user import prepare, wrapper_factories

__all__ = ["Ended", "VectorEnv", "check_env_id", "env_spaces", "make_vector_env"]

register_test_envs()


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/")


def check_env_id(env_id: str) -> None:
    """Raise ConfigError when no environment has this id, with close matches."""
    if is_atari(env_id):
        import ale_py
        from walle_ray.envs.atari import ale_game_name

        known = set(ale_py.roms.get_all_rom_ids())
        game = ale_game_name(env_id)
        if game not in known:
            close = difflib.get_close_matches(game, sorted(known), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"env.id: unknown Atari game {env_id!r} (ROM {game!r}){hint}")
        return
    if env_id not in gym.envs.registry:
        close = difflib.get_close_matches(env_id, list(gym.envs.registry), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"env.id: unknown environment id {env_id!r}{hint} (any registered gymnasium id "
            "works, e.g. env.id=Acrobot-v1; your own: env.id=my_pkg.envs:MyEnv-v0, "
            "env.imports=[my_pkg.envs] or env.entry_point=my_pkg.envs:MyEnv)")


def make_vector_env(cfg: EnvConfig, num_envs: int | None = None) -> VectorEnv:
    """Build the vector env of one sampler from the env config, after importing the user's
    env modules (``walle_ray/envs/user.py``) in this process."""
    num_envs = num_envs or cfg.envs_per_sampler
    env_id = prepare(cfg)
    wrappers = wrapper_factories(cfg.wrappers)
    if is_atari(env_id) and wrappers:
        raise ConfigError("env.wrappers: ALE ids run in ale_py's C++ vector env, which has no "
                          "gymnasium env to wrap; remove env.wrappers (its env.* keys set frame "
                          "size, stacking, skipping and the rest)")
    check_env_id(env_id)
    if is_atari(env_id):
        from walle_ray.envs.atari import AtariEnv

        if cfg.action_mask in ("obs", "info"):
            raise ConfigError(f"env.action_mask={cfg.action_mask}: ALE games allow every action "
                              "in every state; remove env.action_mask")

        return AtariEnv(env_id, num_envs, obs_size=cfg.obs_size, frame_stack=cfg.frame_stack,
                        frame_skip=cfg.frame_skip, episodic_life=cfg.episodic_life,
                        repeat_action_probability=cfg.repeat_action_probability,
                        noop_max=cfg.noop_max, clip_rewards=cfg.clip_rewards,
                        max_episode_steps=cfg.max_episode_steps, threads=cfg.env_threads)
    from walle_ray.envs.gym_vector import GymVectorEnv

    kwargs = dict(cfg.kwargs or {})
    try:
        return GymVectorEnv(env_id, num_envs, cfg.max_episode_steps, kwargs, wrappers,
                            cfg.action_mask)
    except TypeError as exc:
        bad = unexpected_kwarg(exc, kwargs)
        if bad is None:
            raise
        raise ConfigError(f"env.kwargs: {env_id} takes no argument {bad!r}; remove env.kwargs."
                          f"{bad} or correct its name") from None


def unexpected_kwarg(exc: TypeError, kwargs: dict) -> str | None:
    """The key of ``kwargs`` that ``exc`` says a call did not take, or None when ``exc`` is
    about something else (a fault inside the env's own code)."""
    match = re.search(r"unexpected keyword argument '([^']+)'", str(exc))
    return match.group(1) if match and match.group(1) in kwargs else None


def env_spaces(cfg: EnvConfig) -> tuple[gym.Space, gym.Space]:
    """Observation and action space of one env, without keeping it open."""
    env = make_vector_env(cfg, num_envs=1)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()

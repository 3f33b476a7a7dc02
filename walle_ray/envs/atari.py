"""Atari through ale_py.AtariVectorEnv: a threaded C++ vector env."""

from __future__ import annotations

import re

import numpy as np

from walle_ray.envs.base import Ended, EpisodeTracker


def ale_game_name(env_id: str) -> str:
    """'ALE/SpaceInvaders-v5' -> 'space_invaders' (the ROM name ale_py uses)."""
    name = env_id.split("/", 1)[-1].split("-v")[0]
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class AtariEnv:
    """Grayscale, frame-skipped, frame-stacked Atari frames as uint8 [B, stack, H, W].

    Rewards are clipped to their sign for learning when ``clip_rewards``; the episode
    returns reported are raw game scores over whole games (not single lives).
    """

    def __init__(self, env_id: str, num_envs: int, obs_size: int = 84, frame_stack: int = 4,
                 frame_skip: int = 4, episodic_life: bool = False,
                 repeat_action_probability: float = 0.0, noop_max: int = 30,
                 clip_rewards: bool = True, max_episode_steps: int | None = None,
                 threads: int = 1):
        import ale_py

        kwargs = {}
        if max_episode_steps is not None:
            kwargs["max_num_frames_per_episode"] = max_episode_steps * frame_skip
        self.env = ale_py.AtariVectorEnv(
            ale_game_name(env_id), num_envs, num_threads=threads, autoreset_mode="SameStep",
            img_height=obs_size, img_width=obs_size, grayscale=True, stack_num=frame_stack,
            frameskip=frame_skip, episodic_life=episodic_life, noop_max=noop_max,
            repeat_action_probability=repeat_action_probability, reward_clipping=False,
            **kwargs)
        self.num_envs = num_envs
        self.observation_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space
        self.clip_rewards = clip_rewards
        self.episodic_life = episodic_life
        self._tracker = EpisodeTracker(num_envs)

    def reset(self, seed: int | None = None) -> np.ndarray:
        obs, _ = self.env.reset(seed=seed)
        self._tracker = EpisodeTracker(num_envs=self.num_envs)
        return obs

    def step(self, actions: np.ndarray, obs: np.ndarray, reward: np.ndarray,
             terminated: np.ndarray, truncated: np.ndarray) -> Ended | None:
        next_obs, raw, term, trunc, info = self.env.step(np.asarray(actions, dtype=np.int64))
        obs[...] = next_obs
        terminated[...] = term
        truncated[...] = trunc
        raw = raw.astype(np.float32)
        reward[...] = np.sign(raw) if self.clip_rewards else raw
        done = term | trunc
        game_over = truncated | (terminated & (info["lives"] == 0)) if self.episodic_life else done
        rets, lens = self._tracker.update(raw, game_over)
        if not done.any():
            return None
        return Ended(info["final_obs"], rets, lens)

    def close(self) -> None:
        self.env.close()

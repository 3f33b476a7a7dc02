"""Action masks: envs that forbid some actions in some states (``env.action_mask``).

An env says which actions are allowed in one of two ways:

- ``obs``: a Dict observation with an ``action_mask`` entry (PettingZoo's classic envs and
  many gymnasium envs), a MultiBinary (or 0/1 Box) of one column per action;
- ``info``: ``info["action_mask"]`` from ``reset`` and every ``step`` (gymnasium's Taxi).
  ``InfoMask`` moves it into the observation, a Dict of the env's own observation (``obs``,
  or its entries when it is a Dict) and ``action_mask``.

Either way the mask ends up as columns of the flattened observation (``FlatSpace.action_mask``),
so it travels with every observation a sampler writes, a memory stores, a dataset records and
a learner reads, and the network's logits (or Q-values) are masked where they are computed
(``models/masking.py``). ``auto`` takes the first of the two that the env has.

A Discrete(n) space's mask has n columns; a MultiDiscrete's one per action of each component,
concatenated (``sum(nvec)``; an info mask may also be a tuple of one array per component).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from walle_ray.config import ConfigError
from walle_ray.envs.spaces import MASK_KEY

MODES = ("auto", "obs", "info", "none")


class NoActionAllowed(ValueError):
    """An env's mask allows no action in a state where the episode goes on."""


def mask_width(action_space: gym.Space) -> int | None:
    """Columns of a mask for this action space: n for Discrete, sum(nvec) for MultiDiscrete;
    None for a space that cannot be masked."""
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gym.spaces.MultiDiscrete) and action_space.nvec.ndim == 1:
        return int(action_space.nvec.sum())
    return None


def component_sizes(action_space: gym.Space) -> list[int]:
    """The actions of each masked component: [n] for Discrete, nvec for MultiDiscrete."""
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return [int(n) for n in action_space.nvec]
    return [int(action_space.n)]


def first_columns(action_space: gym.Space) -> np.ndarray:
    """Each component's first column in a mask."""
    return np.cumsum([0, *component_sizes(action_space)])[:-1]


def allows_some(allowed: np.ndarray, first: np.ndarray) -> np.ndarray:
    """allowed [N, width] bool -> [N, components]: whether each component allows an action."""
    return np.logical_or.reduceat(allowed, first, axis=1)


def has_obs_mask(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Dict) and MASK_KEY in space.spaces


def resolve_mode(mode: str, env: gym.Env, env_id: str) -> str:
    """``env.action_mask`` for this env: ``obs``, ``info`` or ``none``. ``auto`` looks for a
    Dict observation's entry, then for the entry in the info of one reset of ``env``; a mode
    the env cannot give is a ConfigError."""
    if mode not in MODES:
        raise ConfigError(f"env.action_mask: got {mode!r}; use one of {', '.join(MODES)}")
    if mode == "none":
        return mode
    in_obs = has_obs_mask(env.observation_space)
    if mode == "obs" and not in_obs:
        raise ConfigError(f"env.action_mask=obs: {env_id}'s observations ({env.observation_space}) "
                          f"have no {MASK_KEY!r} entry; use env.action_mask=info for a mask in "
                          f"info[{MASK_KEY!r}], or env.action_mask=none")
    auto = mode == "auto"
    if mode == "auto" and in_obs:
        mode = "obs"
    elif mode in ("auto", "info"):  # one reset shows whether the info holds a mask
        _, info = env.reset()
        in_info = isinstance(info, dict) and MASK_KEY in info
        if mode == "info" and not in_info:
            raise ConfigError(f"env.action_mask=info: {env_id}'s reset gave no "
                              f"info[{MASK_KEY!r}]; use env.action_mask=obs for a Dict "
                              f"observation's {MASK_KEY!r} entry, or env.action_mask=none")
        mode = "info" if in_info else "none"
    if mode != "none" and mask_width(env.action_space) is None:
        if auto:  # a mask no policy of this action space can apply: not a mask for it
            return "none"
        raise ConfigError(f"env.action_mask={mode}: {env_id} gives an {MASK_KEY!r} but acts in "
                          f"{env.action_space}; masks are for Discrete and MultiDiscrete actions "
                          "(set env.action_mask=none)")
    if mode == "obs":
        check_mask_space(env.observation_space.spaces[MASK_KEY], env.action_space, env_id)
    return mode


def mask_mode(obs_space: gym.Space) -> str:
    """The resolved ``env.action_mask`` of an env's observation space: obs, info or none
    (what ``auto`` decided; the driver writes it into the run's config once)."""
    return getattr(obs_space, "mask_from", None) or "none"


def check_mask_space(space: gym.Space, action_space: gym.Space, env_id: str) -> None:
    """A Dict entry holds a mask of one column per action, or a ConfigError says why not."""
    width = mask_width(action_space)
    if not isinstance(space, (gym.spaces.MultiBinary, gym.spaces.Box, gym.spaces.Tuple)) \
            or gym.spaces.flatdim(space) != width:
        raise ConfigError(f"env.action_mask: {env_id}'s {MASK_KEY!r} is {space}; for "
                          f"{action_space} it must be a MultiBinary({width}) (one 0/1 column "
                          "per action)")


class InfoMask(gym.Wrapper):
    """Puts ``info["action_mask"]`` into the observation: a Dict of the env's observation
    (as ``obs``, or its own entries when it is a Dict) and ``action_mask``, a MultiBinary of
    ``mask_width(action_space)`` columns."""

    def __init__(self, env: gym.Env, env_id: str):
        super().__init__(env)
        self.env_id = env_id
        self.width = mask_width(env.action_space)
        inner = env.observation_space
        mask = gym.spaces.MultiBinary(self.width)
        if isinstance(inner, gym.spaces.Dict):
            if MASK_KEY in inner.spaces:
                raise ConfigError(f"env.action_mask=info: {env_id}'s observations already have "
                                  f"an {MASK_KEY!r} entry; use env.action_mask=obs")
            self._dict = True
            self.observation_space = gym.spaces.Dict({**inner.spaces, MASK_KEY: mask})
        else:
            self._dict = False
            self.observation_space = gym.spaces.Dict({"obs": inner, MASK_KEY: mask})

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._with_mask(obs, info, "reset"), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._with_mask(obs, info, "step"), reward, terminated, truncated, info

    def _with_mask(self, obs, info, where: str) -> dict:
        mask = info.get(MASK_KEY) if isinstance(info, dict) else None
        if mask is None:
            raise ConfigError(f"env.action_mask=info: {self.env_id}'s {where} gave no "
                              f"info[{MASK_KEY!r}]; an env with an info mask gives it from reset "
                              "and every step (or set env.action_mask=none)")
        if isinstance(mask, (tuple, list)) and not np.isscalar(mask[0]):
            mask = np.concatenate([np.ravel(m) for m in mask])  # one array per component
        mask = np.asarray(mask, np.int8).ravel()
        if mask.size != self.width:
            raise ConfigError(f"env.action_mask=info: {self.env_id}'s info[{MASK_KEY!r}] has "
                              f"{mask.size} entries; {self.env.action_space} needs {self.width}")
        return {**obs, MASK_KEY: mask} if self._dict else {"obs": obs, MASK_KEY: mask}


class MaskCheck:
    """Raises ``NoActionAllowed`` when an observation a policy will act on allows no action
    (in some component, for MultiDiscrete), naming the env and its step in the episode."""

    def __init__(self, columns: tuple[int, int], action_space: gym.Space, env_id: str):
        self.start, self.stop = columns
        self.env_id = env_id
        self.first = first_columns(action_space)

    def __call__(self, obs: np.ndarray, episode_steps) -> None:
        ok = allows_some(obs[:, self.start:self.stop] > 0.5, self.first).all(axis=1)
        if not ok.all():
            row = int(np.flatnonzero(~ok)[0])
            raise NoActionAllowed(f"{self.env_id}: env {row}'s {MASK_KEY!r} allows no action at "
                                  f"step {int(episode_steps[row])} of its episode; an env must "
                                  "allow at least one action wherever the episode goes on")

"""Action masks in the networks: logits (or Q-values) of forbidden actions set so low that
no choice, sample or maximum ever takes them (``env.action_mask``, ``envs/masks.py``).

The mask is read from the observation's own columns (``FlatSpace.action_mask``), so every
network output computed from an observation is masked where it is computed: a sampler's
actions and behaviour logits, a learner's target logits (V-trace's ratios, PPO's ratios,
entropies and KLs then run over the allowed actions only), a Q-network's greedy choice and
its targets' maximum over the next state's allowed actions, an offline learner's
likelihood, evaluation and ``load_policy``.

Forbidden entries become ``MASKED``, finite rather than -inf, as ``MultiCategoricalHead``
pads: their probability is exactly 0 and ``0 * MASKED`` stays 0 in entropies and KLs.
An all-ones mask changes nothing. A state whose mask allows nothing (an episode's last
observation, which no policy acts on but a learner may value) is left unmasked; the env
refuses such a mask where a policy would act on it (``envs/masks.MaskCheck``).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from walle_ray.envs.masks import allows_some, component_sizes, first_columns

MASKED = -1e9


class ActionMask:
    """The mask in columns ``[start, stop)`` of an observation, for ``action_space``."""

    def __init__(self, columns: tuple[int, int], action_space: gym.Space):
        self.start, self.stop = int(columns[0]), int(columns[1])
        sizes = component_sizes(action_space)
        self.components = len(sizes)
        # component of each column (MultiDiscrete), for "allows nothing" per component
        self._component = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
        self._first, self._sizes = first_columns(action_space), sizes

    def allowed(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [..., D] -> allowed [..., width] bool; all true where nothing is allowed."""
        allowed = obs[..., self.start:self.stop] > 0.5
        if self.components == 1:
            return allowed | ~allowed.any(-1, keepdim=True)
        component = self._on(obs.device)
        counts = torch.zeros(*allowed.shape[:-1], self.components, device=obs.device)
        counts.index_add_(-1, component, allowed.float())
        return allowed | (counts == 0)[..., component]

    def _on(self, device) -> torch.Tensor:
        if self._component.device != device:
            self._component = self._component.to(device)
        return self._component

    def apply(self, out: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """Logits or Q-values ``out`` [..., width] of the observations ``obs`` [..., D], with
        forbidden actions' entries set to ``MASKED`` (the lowest value of a narrower float)."""
        return out.masked_fill(~self.allowed(obs), max(MASKED, torch.finfo(out.dtype).min))

    def allowed_np(self, obs: np.ndarray) -> np.ndarray:
        """``allowed`` for numpy observations [N, D] (an explorer's random choice)."""
        allowed = obs[:, self.start:self.stop] > 0.5
        return allowed | ~np.repeat(allows_some(allowed, self._first), self._sizes, axis=1)


def action_mask(obs_space: gym.Space, action_space: gym.Space) -> ActionMask | None:
    """The mask a network for these spaces applies, or None when the run does not mask."""
    columns = getattr(obs_space, "action_mask", None)
    return None if columns is None else ActionMask(columns, action_space)


def masked(mask: ActionMask | None, out: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
    """``out`` with ``mask`` applied (unchanged without one)."""
    return out if mask is None else mask.apply(out, obs)


def random_allowed(rng: np.random.Generator, allowed: np.ndarray) -> np.ndarray:
    """A uniformly random allowed action per row of ``allowed`` [N, n] (Discrete)."""
    return np.argmax(np.where(allowed, rng.random(allowed.shape), -1.0), axis=1)

"""Typed rollout fragments: what samplers emit and learners consume."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass
class Rollout:
    """A fixed-length fragment of T steps from B envs, produced by one behaviour policy.

    Time-major arrays, ``[T, B, ...]``; ``*_t`` names the value at step t.
    """

    obs_t: np.ndarray  # [T, B, *obs_shape] observation acted on at step t (raw, unnormalised)
    action_t: np.ndarray  # [T, B] int64 or [T, B, act_dim] float32 (before clipping to bounds)
    reward_t: np.ndarray  # [T, B] float32 reward after action t (clipped where the env says so)
    terminated_t: np.ndarray  # [T, B] bool, the episode ended in a terminal state after step t
    truncated_t: np.ndarray  # [T, B] bool, the episode was cut by a time limit after step t
    logp_t: np.ndarray  # [T, B] float32 log-probability of action_t under the behaviour policy
    dist_t: np.ndarray  # [T, B, D] float32 behaviour distribution parameters (logits or mean|log_std)
    v_t: np.ndarray  # [T, B] float32 behaviour value estimate of obs_t
    final_v_t: np.ndarray  # [T, B] float32 value of the final observation where truncated_t, else 0
    return_t: np.ndarray  # [T, B] float32 running discounted return (for reward scaling)
    last_obs: np.ndarray  # [B, *obs_shape] observation after the fragment (for bootstrapping)
    last_v: np.ndarray  # [B] float32 behaviour value of last_obs
    policy_version: int  # version of the weights that acted
    sampler_index: int = 0  # which sampler produced it

    @property
    def num_steps(self) -> int:
        return int(self.reward_t.shape[0] * self.reward_t.shape[1])

    def check(self) -> None:
        """Raise ValueError when arrays disagree on [T, B]."""
        t, b = self.reward_t.shape
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, np.ndarray):
                continue
            lead = value.shape[:1] if f.name.startswith("last_") else value.shape[:2]
            want = (b,) if f.name.startswith("last_") else (t, b)
            if lead != want:
                raise ValueError(f"Rollout.{f.name} has shape {value.shape}, expected {want} first")


def concat_rollouts(rollouts: list[Rollout]) -> Rollout:
    """Join fragments of equal length along the env axis B."""
    if len(rollouts) == 1:
        return rollouts[0]
    joined = {}
    for f in fields(Rollout):
        values = [getattr(r, f.name) for r in rollouts]
        if isinstance(values[0], np.ndarray):
            axis = 0 if f.name.startswith("last_") else 1
            joined[f.name] = np.concatenate(values, axis=axis)
    joined["policy_version"] = min(r.policy_version for r in rollouts)
    joined["sampler_index"] = -1
    return Rollout(**joined)

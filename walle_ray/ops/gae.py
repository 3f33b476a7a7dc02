"""Generalised advantage estimation with terminal and truncated episode ends."""

from __future__ import annotations

import numpy as np


def next_values(v_t: np.ndarray, last_v: np.ndarray, truncated_t: np.ndarray,
                final_v_t: np.ndarray) -> np.ndarray:
    """Value of the state after each step: v_{t+1}, the fragment's bootstrap ``last_v`` at the
    edge, and the value of the final observation where the episode was truncated.

    Shapes: v_t, truncated_t, final_v_t [T, B]; last_v [B] -> [T, B].
    """
    v_tp1 = np.concatenate([v_t[1:], last_v[None]], axis=0)
    return np.where(truncated_t, final_v_t, v_tp1)


def gae(r_t: np.ndarray, v_t: np.ndarray, v_tp1: np.ndarray, terminated_t: np.ndarray,
        truncated_t: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and value targets, both [T, B].

    delta_t = r_t + gamma * (1 - terminated_t) * v_tp1_t - v_t
    A_t = delta_t + gamma * lam * (1 - end_t) * A_{t+1}, end_t = terminated_t | truncated_t

    A terminal step does not bootstrap; a truncated step bootstraps from the value of its
    final observation (in v_tp1) and cuts the trace, since the next row is a new episode.
    """
    discount_t = gamma * (1.0 - terminated_t.astype(np.float32))
    delta_t = r_t + discount_t * v_tp1 - v_t
    trace_t = gamma * lam * (1.0 - (terminated_t | truncated_t).astype(np.float32))
    adv_t = np.empty_like(delta_t, dtype=np.float32)
    acc = np.zeros(delta_t.shape[1:], dtype=np.float32)
    for t in range(delta_t.shape[0] - 1, -1, -1):
        acc = delta_t[t] + trace_t[t] * acc
        adv_t[t] = acc
    return adv_t, adv_t + v_t

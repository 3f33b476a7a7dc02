"""ES's pure parts: the shared noise table, centred-rank fitness shaping, the gradient."""

from __future__ import annotations

import numpy as np


def noise_table(size: int, seed: int) -> np.ndarray:
    """The table every perturbation is a slice of: ``size`` standard normal float32 values."""
    return np.random.default_rng(seed).standard_normal(size, dtype=np.float32)


def sample_offsets(rng: np.random.Generator, table_size: int, dim: int, count: int) -> np.ndarray:
    """``count`` start offsets of perturbations of ``dim`` values within the table."""
    if dim > table_size:
        raise ValueError(f"the policy has {dim} parameters and the noise table {table_size} "
                         "values; raise algo.noise_size above the parameter count")
    return rng.integers(0, table_size - dim + 1, size=count)


def centered_ranks(x: np.ndarray) -> np.ndarray:
    """Each value's rank over all of ``x``, scaled to [-0.5, 0.5] (Salimans et al. 2017,
    fitness shaping): the update sees only the order of the returns, not their scale or
    outliers. Ties keep their order of appearance."""
    flat = x.ravel()
    ranks = np.empty(flat.size, dtype=np.float64)
    ranks[np.argsort(flat, kind="stable")] = np.arange(flat.size)
    if flat.size > 1:
        ranks = ranks / (flat.size - 1) - 0.5
    else:
        ranks[:] = 0.0
    return ranks.reshape(x.shape)


def es_gradient(table: np.ndarray, offsets: np.ndarray, returns_pos: np.ndarray,
                returns_neg: np.ndarray, dim: int) -> np.ndarray:
    """The ascent direction: sum_i (r+_i - r-_i) eps_i / (2n), the r the centred ranks of all
    2n returns and eps_i the table's slice at ``offsets[i]``. As in Salimans et al.'s code
    (and RLlib's), sigma is not divided out: the step size absorbs it."""
    ranks = centered_ranks(np.stack([returns_pos, returns_neg], axis=1))
    weights = ranks[:, 0] - ranks[:, 1]
    g = np.zeros(dim, dtype=np.float64)
    for w, offset in zip(weights, offsets):
        g += w * table[offset: offset + dim]
    return g / (2 * len(offsets))

"""Segment trees over priorities for proportional prioritized replay (numpy, batched)."""

from __future__ import annotations

from typing import Callable

import numpy as np


def last_wins(indices: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique ``indices`` with the value each was given last in ``values``."""
    unique, first_from_end = np.unique(indices[::-1], return_index=True)
    return unique, values[::-1][first_from_end]


class _SegmentTree:
    """A complete binary tree of float64 nodes over ``capacity`` leaves.

    Leaves are padded to a power of two with ``neutral``; node ``i`` has children ``2i`` and
    ``2i + 1``, the root is node 1 and leaf ``j`` is node ``leaves + j``. Every inner node
    is ``op`` of its two children, recomputed (never adjusted by deltas) on each update.
    """

    neutral: float
    op: Callable[[np.ndarray, np.ndarray], np.ndarray]

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"{type(self).__name__} capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.depth = (capacity - 1).bit_length()  # levels below the root
        self.leaves = 1 << self.depth
        self.nodes = np.full(2 * self.leaves, self.neutral, np.float64)

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``indices`` to ``values`` (a repeated index keeps its last value)."""
        indices = np.asarray(indices, np.int64).ravel()
        values = np.asarray(values, np.float64).ravel()
        if indices.shape != values.shape:
            raise ValueError(f"{indices.size} indices but {values.size} values")
        if indices.size == 0:
            return
        if indices.min() < 0 or indices.max() >= self.capacity:
            raise IndexError(f"leaf index out of range [0, {self.capacity})")
        nodes, values = last_wins(indices, values)
        nodes += self.leaves
        self.nodes[nodes] = values
        for _ in range(self.depth):
            nodes = np.unique(nodes >> 1)
            self.nodes[nodes] = self.op(self.nodes[2 * nodes], self.nodes[2 * nodes + 1])

    def __getitem__(self, indices: np.ndarray) -> np.ndarray:
        """The leaf values at ``indices``."""
        return self.nodes[np.asarray(indices, np.int64) + self.leaves]


class SumTree(_SegmentTree):
    """Sums of non-negative leaves; finds the leaf a cumulative sum falls in."""

    neutral = 0.0
    op = staticmethod(np.add)

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def find_prefix(self, prefix_sums: np.ndarray) -> np.ndarray:
        """For each s in ``prefix_sums``, the leaf i with ``sum(leaf[:i]) <= s < sum(leaf[:i+1])``.

        One descent for the whole batch, a few numpy ops per level. Give s in [0, total):
        round-off near ``total`` can still end in a zero leaf past the last positive one,
        so callers clip the result to the leaves they filled.
        """
        remaining = np.array(prefix_sums, np.float64)
        nodes = np.ones(remaining.shape, np.int64)
        for _ in range(self.depth):
            left = 2 * nodes
            left_sum = self.nodes[left]
            go_right = remaining >= left_sum
            remaining -= np.where(go_right, left_sum, 0.0)
            nodes = left + go_right
        return nodes - self.leaves


class MinTree(_SegmentTree):
    """Minimum over leaves; leaves never set count as +inf."""

    neutral = np.inf
    op = staticmethod(np.minimum)

    @property
    def min(self) -> float:
        return float(self.nodes[1])

"""A uniform replay buffer of rollout rows (single-env trajectories of T steps)."""

from __future__ import annotations

from typing import Any

import numpy as np


class UniformReplay:
    """Fixed capacity, oldest row evicted first; samples uniformly with replacement."""

    def __init__(self, capacity: int, seed: int = 0):
        if capacity < 1:
            raise ValueError(f"UniformReplay capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.rows: list[Any] = []
        self.next = 0
        self.added = 0
        self.rng = np.random.default_rng(seed)

    def add(self, row: Any) -> None:
        if len(self.rows) < self.capacity:
            self.rows.append(row)
        else:
            self.rows[self.next] = row
        self.next = (self.next + 1) % self.capacity
        self.added += 1

    def sample(self, k: int) -> list[Any]:
        idx = self.rng.integers(len(self.rows), size=k)
        return [self.rows[i] for i in idx]

    def __len__(self) -> int:
        return len(self.rows)

    def stats(self) -> dict:
        return {"size": len(self.rows), "capacity": self.capacity, "added": self.added}

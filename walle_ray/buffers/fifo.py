"""A bounded first-in first-out queue: the on-policy part of IMPALA's memory mix
(``MixedMemory``), which takes each row once."""

from __future__ import annotations

from collections import deque
from typing import Any


class FIFOQueue:
    """Bounded FIFO of rows; ``put`` refuses when full. Not a memory role itself: the
    memory that holds it (``MixedMemory``) says when there is room."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"FIFOQueue capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.items: deque[Any] = deque()
        self.dropped = 0

    def put(self, item: Any) -> bool:
        """Append an item; False (and nothing stored) when full."""
        if len(self.items) >= self.capacity:
            self.dropped += 1
            return False
        self.items.append(item)
        return True

    def take(self, n: int | None = None) -> list[Any]:
        """Remove and return up to ``n`` oldest items (all of them when n is None)."""
        n = len(self.items) if n is None else min(n, len(self.items))
        return [self.items.popleft() for _ in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def stats(self) -> dict:
        return {"depth": len(self.items), "capacity": self.capacity, "dropped": self.dropped}

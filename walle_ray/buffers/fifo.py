"""The on-policy memory role: a bounded first-in first-out queue of fragments."""

from __future__ import annotations

from collections import deque
from typing import Any


class FIFOMemory:
    """Bounded FIFO; ``put`` refuses when full so the writer can wait (back-pressure).

    Items are fragments, or under Ray one-element lists holding a fragment's ObjectRef, so
    the data stays in the object store and this actor only moves references.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"FIFOMemory capacity must be at least 1, got {capacity}")
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

"""The parameter-server role: the newest weights and their version."""

from __future__ import annotations

from typing import Any


class ParameterServer:
    """Holds one versioned weights object; readers get it only when it is newer than theirs.

    Under Ray the weights object is a one-element list holding an ObjectRef, so the weights
    are stored once in the object store and never copied through this actor.
    """

    def __init__(self) -> None:
        self.version = -1
        self.weights: Any = None

    def publish(self, version: int, weights: Any) -> None:
        if version > self.version:
            self.version, self.weights = version, weights

    def latest(self, have_version: int = -1) -> tuple[int, Any] | None:
        """(version, weights) when newer than ``have_version``, else None."""
        if self.version > have_version:
            return self.version, self.weights
        return None

"""The parameter-server role: the newest weights and their version."""

from __future__ import annotations

from typing import Any


class ParameterServer:
    """Holds one versioned weights object; readers get it only when it is newer than theirs.

    Under Ray the weights object is a one-element list holding an ObjectRef, so the weights
    are stored once in the object store and never copied through this actor.
    The pair is replaced as one tuple, so a reader on another thread (a learner serving
    weights while it trains, ``...0p``) never sees a version with another version's weights.
    """

    def __init__(self) -> None:
        self.current: tuple[int, Any] = (-1, None)

    def publish(self, version: int, weights: Any) -> None:
        if version > self.current[0]:
            self.current = (version, weights)

    def latest(self, have_version: int = -1) -> tuple[int, Any] | None:
        """(version, weights) when newer than ``have_version``, else None."""
        current = self.current
        return current if current[0] > have_version else None

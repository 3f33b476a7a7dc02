"""The process that holds ES's shared noise table in the object store, in a module that
imports neither torch nor envs.

Ray cannot restart an actor whose constructor arguments hold object-store references
(ray-project/ray#53727), so ES's samplers, which must survive restarts, are given the
holder's name and ask it for the table's reference (``noise_source``).
"""

from __future__ import annotations


class RefHolder:
    """Keeps a box (a one-element list holding an ObjectRef) and hands it out."""

    def __init__(self, box: list):
        self.box = box

    def get(self) -> list:
        return self.box

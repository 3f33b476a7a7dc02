"""A process that holds object-store references for roles, in a module that imports
neither torch nor envs.

Ray cannot restart an actor whose constructor arguments hold object-store references
(ray-project/ray#53727), so a role that must survive restarts is given a holder's name and
asks it for the reference (ES's samplers and the shared noise table: ``algos/es``).
"""

from __future__ import annotations


class RefHolder:
    """Keeps a box (a one-element list holding an ObjectRef) and hands it out."""

    def __init__(self, box: list):
        self.box = box

    def get(self) -> list:
        return self.box

"""Dict and Tuple observations as one float vector: ``FlatSpace``.

Samplers, writers, memories and learners handle one array per observation batch. A Dict or
Tuple observation is therefore flattened as it leaves the env (gymnasium's ``flatten``:
Boxes flattened, Discrete parts one-hot) and every part of the framework sees a 1-D float32
Box. The space keeps the original structure, so a user's network can take the observation
apart again with ``unflatten``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import gymnasium as gym
import numpy as np

MASK_KEY = "action_mask"  # the Dict entry that says which actions are allowed (envs/masks.py)

@dataclass(frozen=True)
class _Part:
    """Where one sub-space lies in the flat vector, and the shape it takes back."""

    start: int  # first column of the part
    stop: int  # one past its last column
    shape: tuple  # trailing shape of the unflattened part (one-hot columns for Discrete)
    children: Union["_Layout", None]  # a nested Dict's or Tuple's layout (same columns), else None


@dataclass(frozen=True)
class _Layout:
    """The parts of a Dict (``keys`` set) or a Tuple (``keys`` None), in flattening order."""

    keys: Union[tuple, None]
    parts: tuple


def _layout(space: gym.Space, offset: int = 0) -> _Layout:
    subspaces = space.spaces
    items = list(subspaces.items()) if isinstance(space, gym.spaces.Dict) else list(enumerate(subspaces))
    parts = []
    for _, sub in items:
        size = gym.spaces.flatdim(sub)
        nested = isinstance(sub, (gym.spaces.Dict, gym.spaces.Tuple))
        parts.append(_Part(offset, offset + size, _part_shape(sub, size),
                           _layout(sub, offset) if nested else None))
        offset += size
    keys = tuple(k for k, _ in items) if isinstance(space, gym.spaces.Dict) else None
    return _Layout(keys, tuple(parts))


def _part_shape(sub: gym.Space, size: int) -> tuple:
    """Box and MultiBinary parts take their own shape back; one-hot parts (Discrete,
    MultiDiscrete) stay the flat columns gymnasium wrote."""
    if isinstance(sub, (gym.spaces.Box, gym.spaces.MultiBinary)):
        return tuple(sub.shape)
    return (size,)


class FlatSpace(gym.spaces.Box):
    """The flattened view of a Dict or Tuple space: a 1-D float32 Box of
    ``gymnasium.spaces.flatdim(source)`` columns, laid out as ``gymnasium.spaces.flatten``
    writes them. ``source`` is the original space; ``unflatten`` takes a batch apart.

    ``action_mask``: the columns ``(start, stop)`` of the Dict's ``action_mask`` entry, which
    the policy reads to act only where the mask allows (``envs/masks.py``), or None when the
    run does not mask; ``mask_from`` says where the env put it (``obs`` or ``info``: the
    resolved ``env.action_mask``)."""

    def __init__(self, source: gym.Space, mask_from: str | None = None):
        if not isinstance(source, (gym.spaces.Dict, gym.spaces.Tuple)):
            raise TypeError(f"FlatSpace flattens Dict and Tuple spaces; got {source}")
        if not source.is_np_flattenable:
            raise TypeError(f"{source} cannot be flattened to one vector (it holds a space of "
                            "variable size, such as Sequence, Graph or Text)")
        flat = gym.spaces.flatten_space(source)
        super().__init__(flat.low.astype(np.float32), flat.high.astype(np.float32),
                         dtype=np.float32)
        self.source = source
        self.layout = _layout(source)
        self.mask_from = mask_from
        self.action_mask: tuple[int, int] | None = None
        if mask_from:
            part = self.layout.parts[self.layout.keys.index(MASK_KEY)]
            self.action_mask = (part.start, part.stop)

    def unflatten(self, x):
        """x [..., D] (a torch tensor or numpy array) -> the source's structure: a dict
        (Dict) or tuple (Tuple) of views [..., *part_shape]; Box and MultiBinary parts in
        their own shape, Discrete and MultiDiscrete parts one-hot, nested spaces nested."""
        return _unflatten(self.layout, x)

    def __eq__(self, other) -> bool:
        return (isinstance(other, FlatSpace) and self.source == other.source
                and self.action_mask == other.action_mask)

    def __hash__(self) -> int:
        return hash(("FlatSpace", repr(self.source), self.action_mask))

    def __repr__(self) -> str:
        masked = f", action mask in columns {self.action_mask}" if self.action_mask else ""
        return f"FlatSpace({self.shape[0]} columns of {self.source}{masked})"


def _unflatten(layout: _Layout, x):
    lead = tuple(x.shape[:-1])
    parts = [_unflatten(p.children, x) if p.children is not None
             else x[..., p.start:p.stop].reshape(*lead, *p.shape) for p in layout.parts]
    return tuple(parts) if layout.keys is None else dict(zip(layout.keys, parts))


def flattens(space: gym.Space) -> bool:
    """Whether observations of this space are flattened into a ``FlatSpace``."""
    return isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple))


def to_space(space: gym.Space, actions: np.ndarray) -> np.ndarray:
    """Actions as an action head gives them (a batch), as values of ``space``: a Box's clipped
    to its bounds, Discrete and MultiDiscrete ones shifted by the space's start, MultiBinary
    ones in its dtype (what ``walle_ray.load_policy`` hands a user)."""
    if isinstance(space, gym.spaces.Box):
        return np.clip(actions, space.low, space.high)
    start = getattr(space, "start", 0)
    return (actions + start if np.any(start) else actions).astype(space.dtype, copy=False)


def stored_obs(space: gym.Space) -> tuple[tuple, np.dtype]:
    """One observation's shape and dtype as samplers write it: float32 for a floating space
    (and a ``FlatSpace``), the space's own dtype otherwise (uint8 frames stay uint8)."""
    dtype = np.dtype(space.dtype)
    return tuple(space.shape), np.dtype(np.float32) if dtype.kind == "f" else dtype


def stored_action(space: gym.Space) -> tuple[tuple, np.dtype]:
    """One action's shape and dtype as samplers write it: int64 indices for Discrete and
    MultiDiscrete actions, float32 for Box and MultiBinary ones."""
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return tuple(space.shape), np.dtype(np.int64)
    return tuple(space.shape), np.dtype(np.float32)

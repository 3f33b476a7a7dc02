"""Stacked Atari frames held once in a replay shard, however many transitions show them.

A Pong transition carries two stacks of 4 frames (``obs`` and ``next_obs``), but one env's
consecutive steps share 3 of their 4 frames and a 3-step transition's next observation is
a later transition's observation, so a shard of stacks holds every frame about 8 times.
``FrameStore`` keeps each distinct frame once, with a count of the references to it, and a
shard keeps per transition only the indices of its frames (``[S]`` int32 per stack).
"""

from __future__ import annotations

import math

import numpy as np

# Distinct frames a shard holds per transition: each env's stream adds a frame per step,
# and every episode, and every stretch of a stream between evicted transitions, adds the
# frames at its ends (measured on Pong: docs/performance.md, "What a run holds in memory").
FRAMES_PER_TRANSITION = 1.2
# Bytes of Python bookkeeping per distinct frame held: its entry in ``by_key`` (the hash and
# the list of its places; measured as above).
FRAME_BOOKKEEPING = 340


def is_frame_stack(obs: np.ndarray) -> bool:
    """``[N, S, H, W]`` uint8: stacked image frames, worth storing frame by frame."""
    return obs.dtype == np.uint8 and obs.ndim == 4


class FrameStore:
    """Distinct frames with reference counts; a frame is freed when nothing refers to it.

    Frames are matched by content: a hash of their bytes, then a comparison of the bytes
    themselves, so two different frames are never merged. The arrays grow (by half again)
    as needed and freed places are reused, so the memory follows the distinct frames held.
    """

    def __init__(self, frame_shape: tuple[int, ...], dtype: np.dtype, initial: int = 1024):
        self.frames = np.zeros((initial, *frame_shape), dtype)
        self.refs = np.zeros(initial, np.int64)
        self.keys = np.zeros(initial, np.int64)  # content hash of the frame at each place
        self.by_key: dict[int, list[int]] = {}  # hash -> places holding frames with that hash
        self.free = list(range(initial - 1, -1, -1))  # unused places, the lowest popped first

    @staticmethod
    def planned_bytes(frame_bytes: int, transitions: int, initial: int) -> int:
        """The most a store started with ``initial`` places holds for a shard of
        ``transitions``: the distinct frames (``FRAMES_PER_TRANSITION`` each) and, as the
        arrays grow past ``initial``, the old and the new arrays at once (``_grow``)."""
        held = math.ceil(FRAMES_PER_TRANSITION * transitions)
        size, before = initial, 0
        while size < held:
            before, size = size, size + FrameStore._extra(size)
        per_place = frame_bytes + 2 * np.dtype(np.int64).itemsize  # the frame, refs, keys
        return (size + before) * per_place + held * FRAME_BOOKKEEPING

    def __len__(self) -> int:
        """Distinct frames held."""
        return len(self.refs) - len(self.free)

    @property
    def nbytes(self) -> int:
        """Bytes of the distinct frames held."""
        return len(self) * self.frames[0].nbytes

    def add(self, stacks: np.ndarray) -> np.ndarray:
        """Reference the frames of ``stacks`` [N, S, *frame]; returns their places [N, S]."""
        n, s = stacks.shape[:2]
        frames = stacks.reshape(n * s, *stacks.shape[2:])
        keys = np.fromiter((hash(f.tobytes()) for f in frames), np.int64, n * s)
        unique_keys, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        if not np.array_equal(frames[first][inverse], frames):  # two frames share a hash
            first, inverse = np.arange(n * s), np.arange(n * s)
            unique_keys = keys
        places = np.array([self._place(int(k), frames[i]) for k, i in zip(unique_keys, first)],
                          np.int64)
        held = places[inverse]
        np.add.at(self.refs, held, 1)
        return held.reshape(n, s).astype(np.int32)

    def release(self, places: np.ndarray) -> None:
        """Drop one reference per entry of ``places``; frames left with none are freed."""
        places = np.asarray(places, np.int64).ravel()
        np.add.at(self.refs, places, -1)
        for place in np.unique(places[self.refs[places] == 0]).tolist():
            same = self.by_key[int(self.keys[place])]
            same.remove(place)
            if not same:
                del self.by_key[int(self.keys[place])]
            self.free.append(place)

    def get(self, places: np.ndarray) -> np.ndarray:
        """The frames at ``places`` [N, S] as stacks [N, S, *frame] (a copy)."""
        return self.frames[places]

    def _place(self, key: int, frame: np.ndarray) -> int:
        """Where ``frame`` is held: found by content, or put in a free place (references
        are counted by the caller)."""
        same = self.by_key.setdefault(key, [])
        for place in same:
            if np.array_equal(self.frames[place], frame):
                return place
        if not self.free:
            self._grow()
        place = self.free.pop()
        self.frames[place] = frame
        self.keys[place] = key
        same.append(place)
        return place

    @staticmethod
    def _extra(size: int) -> int:
        """Places added to arrays of ``size`` places when they are full."""
        return max(size // 2, 1024)

    def _grow(self) -> None:
        """Half as many places again. The copy writes every place of the new arrays, and the
        old ones are held until it ends (``planned_bytes`` counts both)."""
        size = len(self.refs)
        extra = self._extra(size)
        self.frames = np.concatenate([self.frames, np.zeros((extra, *self.frames.shape[1:]),
                                                            self.frames.dtype)])
        self.refs = np.concatenate([self.refs, np.zeros(extra, np.int64)])
        self.keys = np.concatenate([self.keys, np.zeros(extra, np.int64)])
        self.free.extend(range(size + extra - 1, size - 1, -1))

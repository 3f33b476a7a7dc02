"""One replay shard of n-step transitions: proportional prioritized (or uniform) sampling.

Each memory actor holds one shard. Samplers ``put`` transitions while ``has_room``;
learners take a ``sample`` while ``can_sample`` and send back ``feedback``: new priorities
by the batch's insert ids, which the shard ignores for transitions it has since evicted.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from walle_ray.batch import Priorities, ReplayBatch, Transitions
from walle_ray.buffers.frames import FrameStore, is_frame_stack
from walle_ray.buffers.sum_tree import MinTree, SumTree, last_wins

# Transitions fields held per slot; priorities live in the trees and ``priority``.
STORED = tuple(f.name for f in fields(Transitions) if f.name != "priority")
STACKS = ("obs", "next_obs")  # held as frame places [S] per slot when they are frame stacks


class PrioritizedReplay:
    """A ring buffer of ``capacity`` transitions, oldest evicted first.

    Prioritized sampling (Schaul et al. 2016, proportional variant) draws transition i with
    probability ``P(i) = p_i / sum_j p_j`` where ``p_i = (|TD error| + eps) ** alpha``, and
    weights it by ``(N * P(i)) ** -beta`` divided by the largest such weight. ``beta`` rises
    linearly to 1 over ``beta_anneal_updates`` batches (0: fixed).

    With ``replay_ratio`` (transitions sampled per transition inserted after
    ``learning_starts``) the shard also limits both sides: learners may not run ahead of the
    ratio, and samplers may run ahead of it by at most ``max_lead`` transitions (0: two
    batches). Keep fragments no larger than the lead or neither side can move.
    """

    def __init__(self, capacity: int, batch_size: int, *, prioritized: bool = True,
                 alpha: float = 0.6, beta: float = 0.4, beta_anneal_updates: int = 0,
                 eps: float = 1e-6, learning_starts: int = 1000,
                 replay_ratio: float | None = None, max_lead: int = 0, seed: int = 0):
        _check_args(capacity=capacity, batch_size=batch_size, alpha=alpha, beta=beta,
                   beta_anneal_updates=beta_anneal_updates, eps=eps,
                   learning_starts=learning_starts, replay_ratio=replay_ratio, max_lead=max_lead)
        self.capacity = capacity
        self.batch_size = batch_size
        self.prioritized = prioritized
        self.alpha = alpha
        self.beta_start = beta
        self.beta_anneal_updates = beta_anneal_updates
        self.eps = eps
        self.learning_starts = learning_starts
        self.replay_ratio = replay_ratio
        self.lead = max_lead or 2 * batch_size
        self.rng = np.random.default_rng(seed)

        self.storage: dict[str, np.ndarray] = {}  # field -> [capacity, ...], made at the first put
        self.frames: FrameStore | None = None  # frame stacks' frames, when obs are frame stacks
        self.ids = np.full(capacity, -1, np.int64)  # insert id of the transition in each slot
        self.priority = np.zeros(capacity, np.float32)  # last |TD error| given to each slot
        self.sums = SumTree(capacity) if prioritized else None
        self.mins = MinTree(capacity) if prioritized else None
        self.max_priority = 1.0  # largest |TD error| seen; given to rows that come without one

        self.inserted = 0
        self.sampled = 0
        self.batches = 0
        self.priority_updates = 0

    @staticmethod
    def planned_bytes(capacity: int, obs: tuple[tuple, np.dtype], action: tuple[tuple, np.dtype],
                      prioritized: bool = True) -> int:
        """The most a shard of ``capacity`` transitions holds once full, given the shape and
        dtype of one observation and one action as samplers write them: each slot's fields,
        insert id and priority, the two trees, and frame stacks' distinct frames
        (``FrameStore.planned_bytes``) or else both observations of every transition."""
        obs_shape, obs_dtype = tuple(obs[0]), np.dtype(obs[1])
        action_bytes = int(np.prod(action[0], dtype=np.int64)) * np.dtype(action[1]).itemsize
        slot = (action_bytes + 4 + 4 + 8  # action, reward, discount, version_b
                + 8 + 4)  # the insert id and priority
        frames = 0
        if obs_dtype == np.uint8 and len(obs_shape) == 3:  # is_frame_stack: places, not stacks
            stack, frame = obs_shape[0], int(np.prod(obs_shape[1:])) * obs_dtype.itemsize
            slot += len(STACKS) * stack * np.dtype(np.int32).itemsize
            frames = FrameStore.planned_bytes(frame, capacity, capacity)
        else:
            slot += len(STACKS) * int(np.prod(obs_shape, dtype=np.int64)) * obs_dtype.itemsize
        leaves = 1 << (capacity - 1).bit_length()
        trees = 2 * 2 * leaves * 8 if prioritized else 0  # SumTree, MinTree: float64 nodes
        return capacity * slot + frames + trees

    def __len__(self) -> int:
        return min(self.inserted, self.capacity)

    @property
    def beta(self) -> float:
        """The importance-sampling exponent for the next batch."""
        if self.beta_anneal_updates == 0:
            return self.beta_start
        progress = min(1.0, self.batches / self.beta_anneal_updates)
        return self.beta_start + (1.0 - self.beta_start) * progress

    @property
    def free_running(self) -> bool:
        """Whether learners may sample without limit (no ``replay_ratio``)."""
        return self.replay_ratio is None

    def has_room(self, item: Transitions) -> bool:
        """Whether a sampler may put ``item`` now without running ahead of ``replay_ratio``."""
        if self.replay_ratio is None:
            return True
        if self.sampled > self.replay_ratio * (self.inserted - self.learning_starts):
            # learners wait for new transitions: a sampler must be let in, however big its
            # item (n-step transitions flushed at episode ends can exceed the lead)
            return True
        ahead = self.inserted + item.num_steps - self.learning_starts
        return ahead <= self.sampled / self.replay_ratio + self.lead

    def can_sample(self) -> bool:
        """Whether a learner may take a batch now: enough data, and not ahead of the ratio."""
        if len(self) < max(self.learning_starts, self.batch_size):
            return False
        if self.replay_ratio is None:
            return True
        return self.sampled <= self.replay_ratio * (self.inserted - self.learning_starts)

    def put(self, item: Transitions) -> None:
        """Copy ``item``'s rows in, overwriting the oldest; only the last ``capacity`` fit."""
        item.check()
        if not self.storage:
            self._allocate(item)
        n = item.num_steps
        kept = min(n, self.capacity)
        first_id = self.inserted + n - kept
        ids = np.arange(first_id, first_id + kept, dtype=np.int64)
        slots = ids % self.capacity
        rows = {name: getattr(item, name)[n - kept:] for name in STORED}
        if self.frames is not None:
            held = slots[self.ids[slots] >= 0]
            for name in STACKS:
                self.frames.release(self.storage[name][held])
                rows[name] = self.frames.add(rows[name])
        for name, array in self.storage.items():
            array[slots] = rows[name]
        self.ids[slots] = ids
        self._set_priorities(slots, item.priority[n - kept:])
        self.inserted += n

    def sample(self) -> ReplayBatch:
        """``batch_size`` transitions (copies) with their weights and insert ids."""
        size = len(self)
        if size == 0:
            raise RuntimeError("sample() from an empty replay shard")
        if self.prioritized:
            slots, weight = self._sample_prioritized(size)
        else:
            slots = self.rng.integers(size, size=self.batch_size)
            weight = np.ones(self.batch_size, np.float32)
        self.sampled += self.batch_size
        self.batches += 1
        rows = {name: array[slots] for name, array in self.storage.items()}
        if self.frames is not None:
            for name in STACKS:
                rows[name] = self.frames.get(rows[name])
        return ReplayBatch(**rows, priority=self.priority[slots], weight=weight,
                           index=self.ids[slots])

    def feedback(self, item: Priorities) -> int:
        """What an update sends back (``Update.memory_feedback``): new priorities."""
        return self.update_priorities(item.index, item.priority)

    def update_priorities(self, index: np.ndarray, priority: np.ndarray) -> int:
        """Set new |TD errors| by insert id; returns how many ids were still held (not stale)."""
        index = np.asarray(index, np.int64)
        slots = index % self.capacity
        live = (index >= 0) & (self.ids[slots] == index)
        self._set_priorities(slots[live], np.asarray(priority)[live])
        applied = int(live.sum())
        self.priority_updates += applied
        return applied

    def stats(self) -> dict:
        """Counters for logging; ``mean_priority`` is in |TD error| units, 0 when uniform."""
        size = len(self)
        in_use = self.prioritized and size > 0
        return {"size": size, "capacity": self.capacity, "fill": size / self.capacity,
                "inserted": self.inserted, "sampled": self.sampled, "batches": self.batches,
                "priority_updates": self.priority_updates,
                "mean_priority": float(self.priority[:size].mean()) if in_use else 0.0,
                "max_priority": self.max_priority, "beta": self.beta,
                "frames": len(self.frames) if self.frames is not None else 0,
                "obs_bytes": self._obs_bytes()}

    def state_dict(self) -> dict:
        """The filled slots (rows, insert ids, priorities) and the counters: enough to go on
        sampling, rate-limiting and annealing as before (``memory.checkpoint=true``).
        Frame stacks are saved as their distinct frames and each slot's indices into them."""
        size = len(self)
        storage = {name: array[:size].copy() for name, array in self.storage.items()}
        state = {}
        if self.frames is not None:
            places = np.stack([storage[name] for name in STACKS])
            used, inverse = np.unique(places.ravel(), return_inverse=True)
            inverse = inverse.reshape(places.shape).astype(np.int32)
            for i, name in enumerate(STACKS):
                storage[name] = inverse[i]
            state["frames"] = self.frames.get(used)
        return {"storage": storage, **state,
                "ids": self.ids[:size].copy(), "priority": self.priority[:size].copy(),
                "max_priority": self.max_priority, "inserted": self.inserted,
                "sampled": self.sampled, "batches": self.batches,
                "priority_updates": self.priority_updates}

    def load_state_dict(self, state: dict) -> None:
        size = len(state["ids"])
        if size > self.capacity:
            raise ValueError(f"the snapshot holds {size} transitions; this shard has room for "
                             f"{self.capacity} (algo.capacity)")
        self.storage = {name: np.zeros((self.capacity, *array.shape[1:]), array.dtype)
                        for name, array in state["storage"].items()}
        for name, array in state["storage"].items():
            self.storage[name][:size] = array
        self.frames = None
        if "frames" in state:  # slots index the saved frames; hold them in a fresh store
            saved = np.asarray(state["frames"])
            self.frames = FrameStore(saved.shape[1:], saved.dtype, max(self.capacity, len(saved)))
            places = self.frames.add(saved[:, None])[:, 0]
            for name in STACKS:
                self.storage[name][:size] = places[self.storage[name][:size]]
                np.add.at(self.frames.refs, self.storage[name][:size].ravel(), 1)
            self.frames.release(places)  # only the slots' references remain
        self.ids[:] = -1
        self.ids[:size] = state["ids"]
        self.inserted, self.sampled = int(state["inserted"]), int(state["sampled"])
        self.batches, self.priority_updates = int(state["batches"]), int(state["priority_updates"])
        self._set_priorities(np.arange(size), np.asarray(state["priority"], np.float64))
        self.max_priority = float(state["max_priority"])

    def _allocate(self, item: Transitions) -> None:
        """Per-slot arrays shaped after the first item (frame stacks as frame places)."""
        shapes = {name: (getattr(item, name).shape[1:], getattr(item, name).dtype) for name in STORED}
        if is_frame_stack(item.obs):
            stack, *frame = item.obs.shape[1:]
            self.frames = FrameStore(tuple(frame), item.obs.dtype, self.capacity)
            shapes.update({name: ((stack,), np.int32) for name in STACKS})
        self.storage = {name: np.zeros((self.capacity, *shape), dtype)
                        for name, (shape, dtype) in shapes.items()}

    def _obs_bytes(self) -> int:
        """Bytes that observations take in this shard (frames and places, or the stacks)."""
        obs = sum(self.storage[name].nbytes for name in STACKS if name in self.storage)
        return obs + (self.frames.nbytes if self.frames is not None else 0)

    def _set_priorities(self, slots: np.ndarray, priority: np.ndarray) -> None:
        """Store |priority| per slot; the trees get p ** alpha. NaN (none given) and inf (a
        diverged TD error) both get the largest finite priority seen so far: one inf in the
        trees would make their total inf, every weight 0 and every draw the same slot."""
        slots, priority = last_wins(slots, np.abs(np.asarray(priority, np.float64)))
        known = np.isfinite(priority)
        if known.any():
            self.max_priority = max(self.max_priority, float(priority[known].max()))
        priority[~known] = self.max_priority
        self.priority[slots] = priority
        if self.prioritized:
            p_alpha = (priority + self.eps) ** self.alpha
            self.sums.update(slots, p_alpha)
            self.mins.update(slots, p_alpha)

    def _sample_prioritized(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Stratified proportional draws: one uniform prefix sum per equal segment of the total."""
        total = self.sums.total
        segment = total / self.batch_size
        prefix = (np.arange(self.batch_size) + self.rng.random(self.batch_size)) * segment
        prefix = np.clip(prefix, 0.0, np.nextafter(total, 0.0))
        slots = np.minimum(self.sums.find_prefix(prefix), size - 1)
        # (N P(i)) ** -beta / (N P_min) ** -beta: N and the total cancel.
        weight = (self.sums[slots] / self.mins.min) ** -self.beta
        return slots, weight.astype(np.float32)


def _check_args(*, capacity: int, batch_size: int, alpha: float, beta: float,
               beta_anneal_updates: int, eps: float, learning_starts: int,
               replay_ratio: float | None, max_lead: int) -> None:
    """Raise ValueError naming the first constructor argument out of range."""
    rules = [
        (batch_size >= 1, f"batch_size must be at least 1, got {batch_size}"),
        (capacity >= batch_size,
         f"capacity ({capacity}) must be at least batch_size ({batch_size})"),
        (alpha >= 0, f"alpha must be >= 0, got {alpha}"),
        (0 <= beta <= 1, f"beta must be in [0, 1], got {beta}"),
        (beta_anneal_updates >= 0, f"beta_anneal_updates must be >= 0, got {beta_anneal_updates}"),
        (eps > 0, f"eps must be > 0 so every transition can be sampled, got {eps}"),
        (0 <= learning_starts <= capacity,
         f"learning_starts must be in [0, capacity={capacity}], got {learning_starts}"),
        (replay_ratio is None or replay_ratio > 0,
         f"replay_ratio must be None or > 0, got {replay_ratio}"),
        (max_lead >= 0, f"max_lead must be >= 0, got {max_lead}"),
    ]
    for ok, message in rules:
        if not ok:
            raise ValueError(message)

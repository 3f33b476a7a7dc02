"""The asynchronous memory role: an on-policy queue and replay buffers, mixed by ratio.

A learner batch of n rows takes ``ratio * n`` rows from each listed memory type: ``queue``
rows are consumed once (on-policy FIFO), ``uniform`` rows are sampled from a replay buffer
and flagged ``replayed_b`` so the loss can correct and clone them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from walle_ray.batch import Rollout, concat_rollouts
from walle_ray.buffers.fifo import FIFOMemory
from walle_ray.buffers.replay import UniformReplay


@dataclass(frozen=True)
class BufferSpec:
    """One memory type of a mix."""

    type: str  # queue | uniform
    ratio: float  # share of each learner batch
    capacity: int  # rows held
    start_rows: int = 0  # rows held before this buffer serves batches


class MixedMemory:
    """Rows go into every buffer; batches are composed by the buffers' ratios."""

    def __init__(self, specs: list[BufferSpec], batch_rows: int, seed: int = 0):
        self.specs = specs
        self.counts = [round(s.ratio * batch_rows) for s in specs]
        self.buffers = [FIFOMemory(s.capacity) if s.type == "queue" else UniformReplay(s.capacity, seed + i)
                        for i, s in enumerate(specs)]
        self.queue = next((b for b in self.buffers if isinstance(b, FIFOMemory)), None)
        self.rows_in = 0
        self.rows_out = 0

    free_running = False  # the on-policy queue serves each row once

    def has_room(self, rollout: Rollout) -> bool:
        """Whether the fragment's rows fit without dropping on-policy data."""
        rows = rollout.reward_t.shape[1]
        return self.queue is None or len(self.queue) + rows <= self.queue.capacity

    def put(self, rollout: Rollout) -> None:
        """Store a fragment's rows; the arrays are copied, so the sender's buffers can go."""
        own = Rollout(**{f.name: np.array(getattr(rollout, f.name)) for f in fields(Rollout)})
        rows = [own.rows(slice(j, j + 1)) for j in range(own.reward_t.shape[1])]
        for buf in self.buffers:
            for row in rows:
                if isinstance(buf, FIFOMemory):
                    buf.put(row)
                else:
                    buf.add(row)
        self.rows_in += len(rows)

    def can_sample(self) -> bool:
        return all(len(buf) >= max(count, spec.start_rows)
                   for buf, count, spec in zip(self.buffers, self.counts, self.specs))

    def sample(self) -> Rollout:
        """One learner batch; call only when ``can_sample()``."""
        parts = []
        for buf, count in zip(self.buffers, self.counts):
            if count == 0:
                continue
            rows = buf.take(count) if isinstance(buf, FIFOMemory) else buf.sample(count)
            batch = concat_rollouts(rows)
            if not isinstance(buf, FIFOMemory):
                batch = Rollout(**{**{f.name: getattr(batch, f.name) for f in fields(Rollout)},
                                   "replayed_b": np.ones(count, bool)})
            parts.append(batch)
        self.rows_out += sum(self.counts)
        return concat_rollouts(parts)

    def stats(self) -> dict:
        out = {"rows_in": self.rows_in, "rows_out": self.rows_out}
        for spec, buf in zip(self.specs, self.buffers):
            out[f"{spec.type}_size"] = len(buf)
            out[f"{spec.type}_capacity"] = spec.capacity
        return out

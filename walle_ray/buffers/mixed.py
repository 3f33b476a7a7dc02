"""The asynchronous memory role: an on-policy queue and replay buffers, mixed by ratio.

An update of N rows takes ``ratio * N`` rows from each listed memory type: ``queue`` rows
are consumed once (on-policy FIFO); ``uniform``, ``elite`` and ``attentive`` rows are sampled
from a replay buffer (the last two ranked by the current policy: ``buffers/ranked.py``) and
flagged ``replayed_b`` so the loss can correct and clone them. With L learner shards, each
memory serves its shard's N / L rows, and a type whose rows L does not divide is dealt
unevenly, in turn (``batch_counts``): with a memory per shard every update still takes the
mix's rows in all; with more memories than shards, each memory deals its own turns, and the
mix holds over the run rather than in every update.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import numpy as np

from walle_ray.batch import Rollout, concat_rollouts
from walle_ray.buffers.fifo import FIFOQueue
from walle_ray.buffers.ranked import RankedReplay
from walle_ray.buffers.replay import UniformReplay


# Bytes of Python objects beside the arrays: per row held, its ``Rollout`` of views; per
# fragment piece put, the copy whose rows are those views (measured: docs/performance.md,
# "What a run holds in memory").
ROW_OBJECT_BYTES = 2400
PIECE_OBJECT_BYTES = 2050
UNRANKED = ("queue", "uniform")  # types that serve any number of rows per batch


@dataclass(frozen=True)
class BufferSpec:
    """One memory type of a mix."""

    type: str  # queue | uniform | elite | attentive
    ratio: float  # share of each update's rows (``batch_counts``)
    capacity: int  # rows held
    start_rows: int = 0  # rows held before this buffer serves batches
    ranking: dict = field(default_factory=dict)  # RankedReplay's keyword settings (elite, attentive)


def update_rows(ratios: list[float], rows: int) -> list[int]:
    """The rows of each memory type, by its ratio, in one update of ``rows`` rows (every
    learner shard's batch together)."""
    return [round(ratio * rows) for ratio in ratios]


def batch_counts(types: list[str], whole: list[int], batch_rows: int, shard: int, shards: int,
                 k: int) -> list[int]:
    """The rows of each memory type (``types``) in batch ``k`` of learner shard ``shard`` of
    ``shards``, where an update takes ``whole[i]`` rows of type i and each shard
    ``batch_rows`` rows.

    A type whose rows the shards do not divide gets ``floor(w (k+1) / L + s / L) -
    floor(w k / L + s / L)`` rows: the shards take them in turn, each ``w / L`` on average,
    and with one memory per shard their counts add up to ``w`` in every update (Hermite's
    identity). The largest unranked type takes what is left of the batch, so it adds up too.
    Ranked types keep a fixed count (``check_replay`` refuses one the shards do not divide).
    The counts repeat every ``shards`` batches."""
    counts = [((k + 1) * w + shard) // shards - (k * w + shard) // shards for w in whole]
    if all(w % shards == 0 for w in whole):
        return counts
    fill = max((i for i, t in enumerate(types) if t in UNRANKED), key=whole.__getitem__)
    counts[fill] = batch_rows - sum(n for i, n in enumerate(counts) if i != fill)
    return counts


def every_count(types: list[str], whole: list[int], batch_rows: int,
                shards: int) -> list[list[int]]:
    """``batch_counts`` of every shard's batches over one cycle (they repeat after it)."""
    return [batch_counts(types, whole, batch_rows, s, shards, k)
            for s in range(shards) for k in range(shards)]


def most_rows(types: list[str], whole: list[int], batch_rows: int, shards: int) -> list[int]:
    """The most rows of each type that one batch of any shard takes (``batch_counts``)."""
    counts = every_count(types, whole, batch_rows, shards)
    return [max(c[i] for c in counts) for i in range(len(whole))]


class MixedMemory:
    """Rows go into every buffer; batches are composed by the buffers' ratios.

    ``encoder`` builds the current policy in this process for the buffers that rank their
    rows (``RankedReplay``); such a memory ``wants_weights``: its runtime hands it each newer
    version (``set_weights``) and calls ``prepare`` to rank the next batch ahead.
    """

    def __init__(self, specs: list[BufferSpec], batch_rows: int, seed: int = 0,
                 encoder: Callable[[], Any] | None = None, shard: int = 0, shards: int = 1):
        """Batches of ``batch_rows`` for learner shard ``shard`` of ``shards``, whose
        batches together make one update of the mix (``batch_counts``)."""
        self.specs = specs
        self.batch_rows, self.shard, self.shards = batch_rows, shard, shards
        self.whole = update_rows([s.ratio for s in specs], batch_rows * shards)
        self.served = 0  # batches served
        self.types = [spec.type for spec in specs]
        self.counts = batch_counts(self.types, self.whole, batch_rows, shard, shards, 0)
        most = most_rows(self.types, self.whole, batch_rows, shards)
        self.buffers = [self._buffer(s, n, seed + i) for i, (s, n) in enumerate(zip(specs, most))]
        self.queue = next((b for b in self.buffers if isinstance(b, FIFOQueue)), None)
        self.ranked = [b for b in self.buffers if isinstance(b, RankedReplay)]
        self.make_encoder, self.encoder = encoder, None  # built with the first weights
        self.building = threading.Lock()  # weights may arrive on two threads at the start
        self.rows_in = 0
        self.rows_out = 0

    @staticmethod
    def planned_bytes(specs: list[BufferSpec], row_bytes: int, piece_rows: int) -> int:
        """The most a memory of this mix holds once full, given the arrays of one row
        (``batch.rollout_row_bytes``) and the rows of each fragment piece it is put: every
        buffer holds the same row objects, the newest of them, so the memory holds as many
        rows as its largest buffer (and the piece the oldest of them came in)."""
        rows = max(spec.capacity for spec in specs) + piece_rows
        return rows * (row_bytes + ROW_OBJECT_BYTES + PIECE_OBJECT_BYTES // max(1, piece_rows))

    @staticmethod
    def _buffer(spec: BufferSpec, rows: int, seed: int):
        if spec.type == "queue":
            return FIFOQueue(spec.capacity)
        if spec.type == "uniform":
            return UniformReplay(spec.capacity, seed)
        return RankedReplay(spec.type, spec.capacity, rows, start_rows=spec.start_rows, seed=seed,
                            **spec.ranking)

    @property
    def wants_weights(self) -> bool:
        return bool(self.ranked)

    @property
    def weights_version(self) -> int:
        return -1 if self.encoder is None else self.encoder.version

    def set_weights(self, weights: Any, version: int) -> None:
        """The learner's newest weights, for the buffers that rank (one model for all)."""
        with self.building:
            if self.encoder is None:
                self.encoder = self.make_encoder()
                for buf in self.ranked:
                    buf.encoder = self.encoder
        self.encoder.set_weights(weights, version)

    def prepare(self) -> None:
        """Rank the next batch's rows of every ranking buffer (a memory process calls this
        on a thread of its own after serving a batch)."""
        for buf in self.ranked:
            buf.prepare()

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
                if isinstance(buf, FIFOQueue):
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
            rows = buf.take(count) if isinstance(buf, FIFOQueue) else buf.sample(count)
            batch = concat_rollouts(rows)
            if not isinstance(buf, FIFOQueue):
                batch = Rollout(**{**{f.name: getattr(batch, f.name) for f in fields(Rollout)},
                                   "replayed_b": np.ones(count, bool)})
            parts.append(batch)
        self.rows_out += sum(self.counts)
        self.served += 1
        self.counts = batch_counts(self.types, self.whole, self.batch_rows, self.shard,
                                   self.shards, self.served)
        return concat_rollouts(parts)

    def stats(self) -> dict:
        out = {"rows_in": self.rows_in, "rows_out": self.rows_out}
        for spec, buf in zip(self.specs, self.buffers):
            out[f"{spec.type}_size"] = len(buf)
            out[f"{spec.type}_capacity"] = spec.capacity
            if isinstance(buf, RankedReplay):
                out.update({f"{spec.type}_{k}": v for k, v in buf.stats().items()})
        return out

    def state_dict(self) -> dict:
        """Every replay buffer's rows and counters (``memory.checkpoint=true``); the queue's
        fragments are on-policy data, used once, and are not kept. A row every buffer holds
        (each holds the same row objects) is saved once, each buffer keeping its indices."""
        distinct: dict[int, int] = {}  # id of a row object -> its place in ``rows``
        rows: list = []
        buffers = []
        for spec, buf in zip(self.specs, self.buffers):
            if isinstance(buf, FIFOQueue):
                buffers.append({"type": spec.type})
                continue
            places = []
            for row in buf.rows:
                if id(row) not in distinct:
                    distinct[id(row)] = len(rows)
                    rows.append(row)
                places.append(distinct[id(row)])
            saved = {"type": spec.type, "rows": np.asarray(places, np.int64), "next": buf.next,
                     "added": buf.added}
            if isinstance(buf, RankedReplay):
                saved["ranked"] = buf.state_dict()
            buffers.append(saved)
        joined = concat_rollouts(rows) if rows else None
        return {"held": len(rows), "buffers": buffers,
                "rows": None if joined is None else {f.name: getattr(joined, f.name)
                                                     for f in fields(Rollout)}}

    def load_state_dict(self, state: dict) -> None:
        saved_types = [b["type"] for b in state["buffers"]]
        types = [spec.type for spec in self.specs]
        if saved_types != types:
            raise ValueError(f"the snapshot holds the memory types {saved_types}; algo.replay "
                             f"lists {types}: resume with the same mix, or memory.checkpoint=false")
        rows = []
        if state["rows"] is not None:
            joined = Rollout(**{k: np.asarray(v) for k, v in state["rows"].items()})
            rows = [joined.rows(slice(j, j + 1)) for j in range(joined.reward_t.shape[1])]
        for buf, saved in zip(self.buffers, state["buffers"]):
            if isinstance(buf, FIFOQueue):
                continue
            held = [rows[j] for j in np.asarray(saved["rows"], np.int64)]
            if len(held) > buf.capacity:
                raise ValueError(f"the snapshot holds {len(held)} rows; this replay has room for "
                                 f"{buf.capacity} (algo.replay capacity)")
            if (isinstance(buf, RankedReplay) and buf.kind == "elite" and buf.fn != "kl"
                    and held and held[0].feature_t.shape[-1] == 0):
                raise ValueError("the snapshot's rows hold no state encodings (they were stored "
                                 f"without elite {buf.fn} replay); resume with "
                                 "memory.checkpoint=false, or rank by dist_function=kl")
            buf.rows = held
            buf.next, buf.added = int(saved["next"]) % buf.capacity, int(saved["added"])
            if isinstance(buf, RankedReplay):
                buf.load_state_dict(saved["ranked"])

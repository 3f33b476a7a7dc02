"""Elite and attentive replay: draw more candidate rows than a batch needs, re-encode their
states with the current policy, keep the ones that rank best.

**Elite sampling** (the elite V-trace platform, ``../shared/seeds/elite_vtrace_readme.txt``)
keeps the rows whose states the current policy encodes most like the behaviour policy did
when it acted: the most on-policy rows, whose V-trace corrections cut least. Each sampler
stores its policy's encoding of every state it acts on (``Rollout.feature_t``;
``ActorCritic.encode``: the conv torso's output for frames, the actor's last hidden layer
for vectors, the torso before the core for a recurrent model). The distance of a row is
taken over all its T steps at once, as the platform does:

- ``ln_norm``: the p-norm of the difference of the two [T, F] encodings, flattened;
- ``cosine``: one minus the cosine similarity of the flattened encodings (the platform
  sorts the similarity itself ascending, which keeps the least similar rows; a distance
  is what ranks the most on-policy rows first);
- ``kl``: the mean over steps of KL(behaviour || current) of the policy's outputs, from the
  distribution parameters every fragment already stores (``Rollout.dist_t``), so nothing
  extra is stored; a recurrent policy's current outputs are unrolled from the stored state.
  The platform's ``kl_div`` differs twice: it takes the other direction, KL(current ||
  behaviour), on its stored 512-wide features read as logits rather than on the policy's
  outputs. KL(behaviour || current) grows where the current policy drops actions the
  behaviour took, which is what cuts V-trace's corrections.

**Attentive experience replay** (Sun, Zhou and Li, AAAI 2020) keeps the rows whose states
are most like the states the current policy visits now. With many envs there are many such
states: the reference is the ``reference_rows`` most recently stored rows' last observations
(each the state an env is in now), all encoded with the current policy, and a row's distance
is the mean over its steps of the distance to the nearest reference state (``ln_norm`` or
``cosine`` on the encodings). The platform's reference is the one latest row's last state.

**Selection** (``strategy``; the platform's ``strategy1`` to ``strategy4``). Of the
candidates ranked by distance, a batch of ``k`` rows keeps:

- ``nearest`` (``strategy1``): the k of least distance;
- ``spread`` (``strategy2``): every (n/k)-th of the n distinct candidates in order of
  distance, the nearest of each group of n/k;
- ``least_served`` (``strategy3``, the platform's default): the rows served the fewest
  times so far first, nearest first among equals;
- ``least_served_in_group`` (``strategy4``): in each group of n/k candidates in order of
  distance, the one served the fewest times (the nearest among equals).

Each row counts the batches it was served in since it was stored. Where fewer distinct
candidates than k were drawn, a batch takes them again in the same order (there the
platform's ``strategy3`` would loop for ever, and its ``strategy2`` and ``strategy4``
divide by zero).

**Annealing.** ``lambda_batch_multiplier`` (lambda) candidates are drawn per row served,
uniformly, without repeats, or with them (``replacement``, as the platform draws); the
selection then keeps ``k``. The platform lowers
lambda linearly to 1 over ``alpha_annealing_factor`` times its learning-rate schedule,
counted in batches drawn; here it falls over ``alpha_annealing_factor`` times the run
counted in the rows this buffer has stored (``anneal_rows``: the rows it stores over
``run.total_env_steps``), so the schedule is the same whether a learner asks for batches
quickly or slowly, and a snapshot carries it. With alpha 1 lambda reaches 1 (uniform replay)
as the run ends; with 2 it is halfway there.

**Cost.** Ranking encodes lambda x k x T states per batch; with half of each batch
replayed, as many as the learner's own forward and backward pass take at lambda 6. ``steps`` reads only that many
steps of each row, evenly spaced (the platform reads all of them): the encodings of
neighbouring frames move together, and the cost falls with the steps read
(``benchmarks/replay_methods.py``; docs/replay.md).

The encoding runs in the memory's process, with the newest weights its runtime hands it
(``set_weights``), and ``prepare`` ranks the next batch's rows ahead of the request, so a
memory process ranks while the learner computes (``runtime/memory_worker.py``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from walle_ray.buffers.replay import UniformReplay

DIST_FUNCTIONS = {"elite": ("ln_norm", "cosine", "kl"), "attentive": ("ln_norm", "cosine")}
STRATEGIES = ("nearest", "spread", "least_served", "least_served_in_group")


def annealed_multiplier(multiplier: float, alpha: float, progress: float) -> float:
    """Candidates per row served at ``progress`` (0 at the start, 1 at the run's end): from
    ``multiplier`` down to 1, linearly over ``alpha`` runs."""
    return max(1.0, multiplier - (multiplier - 1.0) * progress / alpha)


def sequence_distances(new_t: np.ndarray, old_t: np.ndarray, fn: str, p: float = 2.0) -> np.ndarray:
    """Elite's distance per row between two encodings of its steps, new_t and old_t
    [T, N, F] -> [N], each row's T x F values taken as one vector."""
    new = np.moveaxis(new_t, 1, 0).reshape(new_t.shape[1], -1).astype(np.float64)
    old = np.moveaxis(old_t, 1, 0).reshape(old_t.shape[1], -1).astype(np.float64)
    if fn == "ln_norm":
        return (np.abs(new - old) ** p).sum(axis=1) ** (1.0 / p)
    if fn == "cosine":
        norms = np.linalg.norm(new, axis=1) * np.linalg.norm(old, axis=1)
        return 1.0 - (new * old).sum(axis=1) / np.maximum(norms, 1e-12)
    raise ValueError(f"no sequence distance {fn!r}; use ln_norm or cosine")


def reference_distances(enc_t: np.ndarray, ref: np.ndarray, fn: str, p: float = 2.0) -> np.ndarray:
    """Attentive replay's distance per row: the mean over its steps of the distance from the
    step's encoding to the nearest reference state. enc_t [T, N, F], ref [R, F] -> [N].
    Euclidean and cosine distances come from one matrix product; other orders go one
    reference at a time, so no [T, N, R, F] array is ever made."""
    T, N, F = enc_t.shape
    x = enc_t.reshape(T * N, F).astype(np.float64)
    r = ref.astype(np.float64)
    if fn == "cosine":
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        r = r / np.maximum(np.linalg.norm(r, axis=1, keepdims=True), 1e-12)
        d = (1.0 - x @ r.T).min(axis=1)
    elif fn == "ln_norm" and p == 2:
        sq = (x * x).sum(1)[:, None] + (r * r).sum(1)[None, :] - 2.0 * x @ r.T
        d = np.sqrt(np.maximum(sq, 0.0)).min(axis=1)
    elif fn == "ln_norm":
        d = np.full(T * N, np.inf)
        for one in r:
            np.minimum(d, (np.abs(x - one) ** p).sum(1) ** (1.0 / p), out=d)
    else:
        raise ValueError(f"no reference distance {fn!r}; use ln_norm or cosine")
    return d.reshape(T, N).mean(axis=0)


def select(strategy: str, distances: np.ndarray, served: np.ndarray, k: int) -> np.ndarray:
    """Which of n distinct candidates a batch of ``k`` keeps, as positions into
    ``distances`` and ``served`` (the candidates' distances and serving counts; ``strategy``:
    one of ``STRATEGIES``, above). Ties go in drawing order; fewer than k candidates are
    taken again in the same order."""
    order = np.argsort(distances, kind="stable")  # nearest first
    n = len(order)
    if strategy == "nearest":
        picked = order[:k]
    elif strategy == "least_served":
        picked = order[np.argsort(served[order], kind="stable")][:k]
    elif strategy in ("spread", "least_served_in_group"):
        size = max(1, n // k)
        groups = [order[g * size:(g + 1) * size] for g in range(min(k, n))]
        picked = np.array([group[0] if strategy == "spread" else group[np.argmin(served[group])]
                           for group in groups])
    else:
        raise ValueError(f"no selection {strategy!r}; use one of {', '.join(STRATEGIES)}")
    return np.resize(picked, k)


class RankedReplay(UniformReplay):
    """A replay buffer of rollout rows that serves ``k`` of ``lambda_batch_multiplier * k``
    uniform candidates, chosen by their distance (elite or attentive) and ``strategy``
    (above).

    ``encoder`` is what encodes states with the current policy, set by the memory that
    holds the buffer once it has weights: an object with ``version`` (of its weights),
    ``encode(obs_t)`` ([T, N, *obs] -> [T, N, F]) and ``policy_kl(rows)`` ([T, N],
    KL(behaviour || current)); see ``walle_ray/buffers/encoder.py``. Until it has weights
    the buffer serves uniform draws.
    """

    def __init__(self, kind: str, capacity: int, k: int, *,
                 dist_function: str = "ln_norm", p: float = 2.0,
                 lambda_batch_multiplier: float = 1.0, alpha_annealing_factor: float = 1.0,
                 anneal_rows: float = math.inf, reference_rows: int = 16, steps: int = 0,
                 strategy: str = "nearest", replacement: bool = False,
                 start_rows: int = 0, seed: int = 0):
        super().__init__(capacity, seed)
        if dist_function not in DIST_FUNCTIONS[kind]:
            raise ValueError(f"{kind} replay ranks by one of {', '.join(DIST_FUNCTIONS[kind])}, "
                             f"not {dist_function!r}")
        if strategy not in STRATEGIES:
            raise ValueError(f"no selection {strategy!r}; use one of {', '.join(STRATEGIES)}")
        self.kind, self.k, self.fn, self.p = kind, k, dist_function, p
        self.strategy, self.replacement = strategy, replacement
        self.served_count = np.zeros(capacity, np.int64)  # batches each slot's row was served in
        self.steps = steps  # steps of each row the distance reads, evenly spaced; 0: all
        self.multiplier, self.alpha = lambda_batch_multiplier, alpha_annealing_factor
        self.anneal_rows = max(anneal_rows, 1.0)
        self.encoder: Any = None
        self.reference: deque = deque(maxlen=reference_rows)  # latest rows' last observations
        self.ready: list | None = None  # the next batch's rows, ranked ahead (``prepare``)
        self.min_rows = max(k, start_rows)  # rows held before it serves (or ranks ahead)
        # ``prepare`` runs on a thread of the memory's process while ``sample`` may be called
        # on another: one ranks at a time, and a batch ranked ahead is served once.
        self.lock = threading.Lock()
        self.rank_s = 0.0
        self.ranked = 0  # batches ranked
        self.served_ready = 0  # batches served from ``prepare``
        self.served = 0
        self.last = {"candidates": 0, "dist_kept": float("nan"), "dist_drawn": float("nan")}

    def add(self, row: Any) -> None:
        slot = len(self.rows) if len(self.rows) < self.capacity else self.next
        super().add(row)
        self.served_count[slot] = 0
        if self.kind == "attentive":
            self.reference.append(row.last_obs[0])

    @property
    def weights_version(self) -> int:
        return -1 if self.encoder is None else self.encoder.version

    def multiplier_now(self) -> float:
        return annealed_multiplier(self.multiplier, self.alpha, self.added / self.anneal_rows)

    def _candidates(self) -> int:
        """Candidates the next batch draws; at most k means a uniform draw, nothing ranked
        (lambda annealed to 1, too few rows, or no weights yet)."""
        if self.encoder is None or self.encoder.version < 0:
            return self.k
        return min(len(self.rows), max(self.k, round(self.multiplier_now() * self.k)))

    def prepare(self) -> None:
        """Rank the next batch's rows now, so ``sample`` serves them at once."""
        with self.lock:
            if self.ready is None and len(self.rows) >= self.min_rows and self._candidates() > self.k:
                self.ready = self._rank()

    def sample(self, k: int) -> list[Any]:
        if k != self.k:
            raise ValueError(f"this {self.kind} replay serves {self.k} rows per batch, not {k}")
        with self.lock:
            rows, self.ready = self.ready, None
            self.served += 1
            if rows is None:
                return self._rank()
            self.served_ready += 1
            return rows

    def _rank(self) -> list[Any]:
        """The k rows the selection keeps of the ranked candidates, or a uniform draw."""
        n = self._candidates()
        if n <= self.k:
            return self._serve(self.rng.integers(len(self.rows), size=self.k))
        t0 = time.perf_counter()
        drawn = self.rng.choice(len(self.rows), n, replace=self.replacement)
        idx = np.unique(drawn) if self.replacement else drawn  # each distinct row ranked once
        distances = self.distances([self.rows[i] for i in idx])
        keep = select(self.strategy, distances, self.served_count[idx], self.k)
        self.rank_s += time.perf_counter() - t0
        self.ranked += 1
        self.last = {"candidates": n, "dist_kept": float(distances[keep].mean()),
                     "dist_drawn": float(distances.mean())}
        return self._serve(idx[keep])

    def _serve(self, idx: np.ndarray) -> list[Any]:
        """The rows at ``idx``, each counted as served once more."""
        np.add.at(self.served_count, idx, 1)
        return [self.rows[i] for i in idx]

    def distances(self, rows: list) -> np.ndarray:
        """Each candidate row's distance [N] under the current policy (smaller ranks first),
        over the row's steps or ``steps`` of them, evenly spaced."""
        enc = self.encoder
        T = rows[0].reward_t.shape[0]
        at = slice(None) if not self.steps or self.steps >= T else \
            np.linspace(0, T - 1, self.steps).round().astype(int)
        if self.kind == "elite" and self.fn == "kl":
            return enc.policy_kl(rows, at).mean(axis=0)
        obs_t = np.concatenate([r.obs_t[at] for r in rows], axis=1)
        new_t = enc.encode(obs_t)
        if self.kind == "elite":
            old_t = np.concatenate([r.feature_t[at] for r in rows], axis=1)
            return sequence_distances(new_t, old_t, self.fn, self.p)
        ref = enc.encode(np.stack(list(self.reference))[None])[0]  # a copy: puts go on meanwhile
        return reference_distances(new_t, ref, self.fn, self.p)

    def stats(self) -> dict:
        return {"lambda": self.multiplier_now(), **self.last, "rank_s": self.rank_s,
                "ranked": self.ranked, "ready_frac": self.served_ready / max(self.served, 1),
                "weights_version": self.weights_version}

    def state_dict(self) -> dict:
        """The attentive reference (the rows and the counters that carry the annealing are
        the memory's to save: ``MixedMemory.state_dict``). The ranking's time and counts
        start again with the process, as the run's rates do."""
        with self.lock:  # not while a batch is ranked ahead on another thread
            return {"reference": list(self.reference),
                    "served_count": self.served_count[:len(self.rows)].copy()}

    def load_state_dict(self, state: dict) -> None:
        self.reference.clear()
        self.reference.extend(np.asarray(r) for r in state["reference"])
        self.served_count[:] = 0
        served = np.asarray(state.get("served_count", ()), np.int64)  # older snapshots: none
        self.served_count[:len(served)] = served

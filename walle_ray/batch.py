"""Typed rollout fragments: what samplers emit and learners consume."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass
class Rollout:
    """A fixed-length fragment of T steps from B envs, produced by one behaviour policy.

    Time-major arrays, ``[T, B, ...]``; ``*_t`` names the value at step t.
    """

    obs_t: np.ndarray  # [T, B, *obs_shape] observation acted on at step t (raw, unnormalised)
    action_t: np.ndarray  # [T, B] int64 (Discrete), [T, B, k] int64 (MultiDiscrete), or
    #                       [T, B, k] float32 (Box before clipping to bounds; MultiBinary 0/1)
    reward_t: np.ndarray  # [T, B] float32 reward after action t (clipped where the env says so)
    terminated_t: np.ndarray  # [T, B] bool, the episode ended in a terminal state after step t
    truncated_t: np.ndarray  # [T, B] bool, the episode was cut by a time limit after step t
    logp_t: np.ndarray  # [T, B] float32 log-probability of action_t under the behaviour policy
    dist_t: np.ndarray  # [T, B, D] float32 behaviour distribution parameters (logits, or
    #                     mean|log_std; the action head's ``param_dim`` columns)
    v_t: np.ndarray  # [T, B] float32 behaviour value estimate of obs_t
    final_v_t: np.ndarray  # [T, B] float32 behaviour value of the final observation where
    #                        truncated_t (NaN where learners value final_obs themselves), else 0
    final_obs: np.ndarray  # [K, *obs_shape] final observation of each of the K truncated steps,
    #                        in the order of np.nonzero(truncated_t) (time, then row)
    return_t: np.ndarray  # [T, B] float32 running discounted return (zeros unless env.normalize_reward)
    last_obs: np.ndarray  # [B, *obs_shape] observation after the fragment (for bootstrapping)
    last_v: np.ndarray  # [B] float32 behaviour value of last_obs (NaN where the algorithm's
    #                     learners compute it themselves: IMPALA's, fragment_sampler_spec)
    version_b: np.ndarray  # [B] int64 version of the weights that acted, per row
    replayed_b: np.ndarray  # [B] bool, the row came from a replay buffer (not the on-policy queue)
    state_b: np.ndarray | None = None  # [B, S] float32 recurrent core state at step 0 (zeros
    #                                    where an episode starts there; None: width 0, no core)
    feature_t: np.ndarray | None = None  # [T, B, F] float32 the behaviour policy's encoding of
    #                                      obs_t (elite replay; None: width 0, not kept)

    def __post_init__(self) -> None:
        if self.state_b is None:
            self.state_b = np.zeros((self.reward_t.shape[1], 0), np.float32)
        if self.feature_t is None:
            self.feature_t = np.zeros((*self.reward_t.shape, 0), np.float32)

    @property
    def num_steps(self) -> int:
        return int(self.reward_t.shape[0] * self.reward_t.shape[1])

    def first_t(self) -> np.ndarray:
        """[T, B] bool: an episode starts at step t (the one before it ended), where a
        recurrent core's state is zeroed. Step 0's start is already in ``state_b``."""
        first_t = np.zeros(self.reward_t.shape, bool)
        first_t[1:] = self.terminated_t[:-1] | self.truncated_t[:-1]
        return first_t

    def check(self) -> None:
        """Raise ValueError when arrays disagree on [T, B] (and final_obs on K)."""
        t, b = self.reward_t.shape
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "final_obs":
                want = (int(self.truncated_t.sum()), *self.last_obs.shape[1:])
                if value.shape != want:
                    raise ValueError(f"Rollout.final_obs has shape {value.shape}, expected {want}: "
                                     "one final observation per truncated step")
                continue
            want = (b,) if f.name in ROW_FIELDS else (t, b)
            if value.shape[: len(want)] != want:
                raise ValueError(f"Rollout.{f.name} has shape {value.shape}, expected {want} first")

    def rows(self, index) -> "Rollout":
        """The rows (env columns) ``index`` selects: a slice gives views, a list gives copies
        (final_obs is always a copy)."""
        picked = final_index(self.truncated_t)[:, index]
        return Rollout(**{f.name: getattr(self, f.name)[index] if f.name in ROW_FIELDS
                          else self.final_obs[picked[picked >= 0]] if f.name == "final_obs"
                          else getattr(self, f.name)[:, index] for f in fields(self)})


# Fields whose leading axis is B (one value per row) rather than [T, B]; final_obs has
# its own axis K, the truncated steps.
ROW_FIELDS = frozenset({"last_obs", "last_v", "version_b", "replayed_b", "state_b"})


def rollout_row_bytes(steps: int, obs: tuple[tuple, np.dtype], action: tuple[tuple, np.dtype],
                      dist_dim: int, state_dim: int = 0, feature_dim: int = 0) -> int:
    """Bytes of the arrays of one row (an env column) of a ``Rollout`` of ``steps`` steps,
    given one observation's and one action's (shape, dtype) and the widths of ``dist_t``,
    ``state_b`` and ``feature_t``; the final observations of truncated steps (a few per
    episode) are left out."""
    def size(shape_dtype) -> int:
        shape, dtype = shape_dtype
        return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize

    floats = np.dtype(np.float32).itemsize
    per_step = (size(obs) + size(action)
                + floats * (5 + dist_dim + feature_dim)  # reward, logp, v, final_v, return_t
                + 2)  # terminated_t, truncated_t
    per_row = (size(obs) + floats * (1 + state_dim)  # last_obs, last_v, state_b
               + 8 + 1)  # version_b, replayed_b
    return steps * per_step + per_row


def final_index(truncated_t: np.ndarray) -> np.ndarray:
    """[T, B] int64: the index into final_obs of each truncated step, -1 elsewhere."""
    index = np.full(truncated_t.shape, -1, np.int64)
    index[truncated_t] = np.arange(int(truncated_t.sum()))
    return index


def concat_rollouts(rollouts: list[Rollout]) -> Rollout:
    """Join fragments of equal length along the env axis B."""
    if len(rollouts) == 1:
        return rollouts[0]
    joined = {f.name: np.concatenate([getattr(r, f.name) for r in rollouts],
                                     axis=0 if f.name in ROW_FIELDS | {"final_obs"} else 1)
              for f in fields(Rollout)}
    # final_obs is in (time, row) order per part; the joined rows interleave the parts' steps.
    offsets = np.cumsum([0] + [len(r.final_obs) for r in rollouts[:-1]])
    index = np.concatenate([np.where(i >= 0, i + o, -1) for i, o in
                            zip((final_index(r.truncated_t) for r in rollouts), offsets)], axis=1)
    joined["final_obs"] = joined["final_obs"][index[index >= 0]]
    return Rollout(**joined)


@dataclass
class Transitions:
    """N-step transitions a replay sampler emits: flat ``[N, ...]`` arrays.

    A transition from step t sums k rewards, k = n or fewer where the episode ended first:
    ``reward = sum_{i<k} gamma^i r_{t+i}``. ``discount`` is ``gamma^k`` when the learner
    should bootstrap from ``next_obs`` (the observation k steps later; the final one of the
    episode when it was cut by a time limit) and 0 when the episode terminated.
    """

    obs: np.ndarray  # [N, *obs_shape] observation the action was taken in (uint8 frames stay uint8)
    action: np.ndarray  # [N] int64 or [N, act_dim] float32 within the action bounds
    reward: np.ndarray  # [N] float32 n-step discounted reward
    discount: np.ndarray  # [N] float32 gamma^k, or 0 after a terminal state
    next_obs: np.ndarray  # [N, *obs_shape] observation to bootstrap from
    priority: np.ndarray  # [N] float32 initial priority: |TD error| under the sampler's network (NaN: none)
    version_b: np.ndarray  # [N] int64 version of the weights that acted

    @property
    def num_steps(self) -> int:
        return int(self.reward.shape[0])

    def check(self) -> None:
        """Raise ValueError when arrays disagree on N."""
        check_rows(self, self.reward.shape[0])


@dataclass
class ReplayBatch(Transitions):
    """Transitions sampled from a replay shard, with what prioritized replay adds."""

    weight: np.ndarray  # [N] float32 importance-sampling weight, max-normalised (ones if uniform)
    index: np.ndarray  # [N] int64 insert id of each transition, for ``Priorities``


@dataclass
class OfflineBatch:
    """Steps of recorded episodes a dataset memory serves (``buffers/dataset.py``): flat
    ``[N, ...]`` arrays, rows drawn from anywhere in the dataset.

    For advantage-weighted methods each row also carries its discounted return to the end of
    its episode as recorded, ``ret = sum_{i>=t} gamma^(i-t) r_i``, and ``tail`` = gamma^(T-t)
    when the episode was cut by a time limit at its step T (0 when it terminated), so a
    learner completes the return with its own value of ``final_obs``, the episode's last
    observation: ``R_t = ret + tail * V(final_obs)``. BC reads neither (None).
    """

    obs: np.ndarray  # [N, *obs_shape] observation the action was taken in
    action: np.ndarray  # [N] int64 or [N, ...] as the dataset's action space has it
    ret: np.ndarray | None = None  # [N] float32 discounted return to the episode's recorded end
    tail: np.ndarray | None = None  # [N] float32 gamma^(T-t) for a truncated episode, else 0
    final_obs: np.ndarray | None = None  # [N, *obs_shape] the last observation of the row's episode

    @property
    def num_steps(self) -> int:
        return int(self.obs.shape[0])

    def check(self) -> None:
        """Raise ValueError when arrays disagree on N."""
        check_rows(self, self.obs.shape[0])


def check_rows(batch, n: int) -> None:
    """Raise ValueError naming the first array field of a flat batch (fields that are None
    aside) whose first dimension is not ``n``."""
    for f in fields(batch):
        value = getattr(batch, f.name)
        if value is not None and value.shape[:1] != (n,):
            raise ValueError(f"{type(batch).__name__}.{f.name} has shape {value.shape}, "
                             f"expected ({n},) first")


@dataclass
class Priorities:
    """New priorities for transitions a learner trained on: what a DQN or DDPG update sends
    back to the replay shard that served its batch (``Update.memory_feedback``)."""

    index: np.ndarray  # [N] int64 insert ids, from ``ReplayBatch.index``
    priority: np.ndarray  # [N] float32 |TD error| under the updated network's targets

    def split(self, sizes: list[int]) -> list["Priorities"]:
        """The parts for batches of ``sizes`` rows joined in that order: what a packed
        learner (several shards' batches in one update) sends back to each shard."""
        if sum(sizes) != len(self.index):
            raise ValueError(f"priorities for {len(self.index)} rows cannot split into {sizes}")
        cuts = np.cumsum(sizes)[:-1]
        return [Priorities(index=i, priority=p) for i, p in
                zip(np.split(self.index, cuts), np.split(self.priority, cuts), strict=True)]

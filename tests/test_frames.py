"""Frame stacks held frame by frame in a replay shard: same batches, a fraction of the bytes."""

from __future__ import annotations

import numpy as np
import pytest

from walle_ray.batch import Transitions
from walle_ray.buffers import frames as frames_module
from walle_ray.buffers.frames import FrameStore
from walle_ray.buffers.prioritized import PrioritizedReplay

STACK, N_STEP = 4, 3


def stream(length: int, seed: int, size: int = 6) -> np.ndarray:
    """``length`` random uint8 frames of one env, as its emulator would render them."""
    return np.random.default_rng(seed).integers(0, 256, (length, size, size), dtype=np.uint8)


def fragment(frames: np.ndarray, steps: range, first_id: int) -> Transitions:
    """3-step transitions of one env: obs at t is frames t..t+3, next_obs frames t+3..t+6;
    the action holds the transition's insert id so batches can be checked row by row."""
    obs = np.stack([frames[t:t + STACK] for t in steps])
    next_obs = np.stack([frames[t + N_STEP:t + N_STEP + STACK] for t in steps])
    n = len(steps)
    return Transitions(obs=obs, action=np.arange(first_id, first_id + n), next_obs=next_obs,
                       reward=np.zeros(n, np.float32), discount=np.full(n, 0.97, np.float32),
                       priority=np.ones(n, np.float32), version_b=np.zeros(n, np.int64))


def fill(shard: PrioritizedReplay, frames: np.ndarray, puts: int, per_put: int) -> dict:
    """Put ``puts`` fragments of ``per_put`` steps; returns insert id -> (obs, next_obs)."""
    sent = {}
    for k in range(puts):
        item = fragment(frames, range(k * per_put, (k + 1) * per_put), shard.inserted)
        sent.update({int(i): (o, x) for i, o, x in zip(item.action, item.obs, item.next_obs)})
        shard.put(item)
    return sent


def check_batches(shard: PrioritizedReplay, sent: dict, rounds: int = 20) -> None:
    for _ in range(rounds):
        batch = shard.sample()
        np.testing.assert_array_equal(batch.action, batch.index)
        for i, obs, next_obs in zip(batch.index, batch.obs, batch.next_obs):
            np.testing.assert_array_equal(obs, sent[int(i)][0])
            np.testing.assert_array_equal(next_obs, sent[int(i)][1])


def test_batches_rebuild_the_stacks_that_were_put():
    shard = PrioritizedReplay(64, 16, learning_starts=0)
    sent = fill(shard, stream(200, 0), puts=5, per_put=20)  # wrapped: 100 transitions into 64 slots
    check_batches(shard, sent)
    assert shard.batches == 20 and len(shard) == 64


def test_each_frame_is_held_once_and_freed_with_its_last_transition():
    shard = PrioritizedReplay(64, 16, learning_starts=0)
    fill(shard, stream(1000, 1), puts=40, per_put=24)
    held = np.concatenate([shard.storage["obs"].ravel(), shard.storage["next_obs"].ravel()])
    # 64 consecutive transitions show frames t..t+66 of one stream: 70 distinct frames.
    assert len(shard.frames) == len(np.unique(held)) == 64 + N_STEP + STACK - 1
    np.testing.assert_array_equal(np.bincount(held, minlength=len(shard.frames.refs)),
                                  shard.frames.refs)
    stacked = 2 * 64 * STACK * 36
    assert shard.stats()["obs_bytes"] < stacked / 3  # places are int32: 8 x 4 bytes a slot


def test_frames_with_the_same_hash_stay_apart(monkeypatch):
    monkeypatch.setattr(frames_module, "hash", lambda data: 7, raising=False)
    shard = PrioritizedReplay(32, 8, learning_starts=0)
    sent = fill(shard, stream(100, 2), puts=3, per_put=10)
    check_batches(shard, sent)
    assert len(shard.frames) == 30 + N_STEP + STACK - 1


def test_repeated_frames_across_envs_share_one_place():
    store = FrameStore((2, 2), np.uint8, initial=2)
    blank = np.zeros((3, STACK, 2, 2), np.uint8)  # e.g. a black screen in three envs
    places = store.add(blank)
    assert len(store) == 1 and store.refs[places[0, 0]] == 3 * STACK
    store.release(places)
    assert len(store) == 0 and store.by_key == {}


def test_store_grows_past_its_first_size():
    store = FrameStore((3, 3), np.uint8, initial=2)
    stacks = stream(40, 3, size=3).reshape(10, 4, 3, 3)
    places = store.add(stacks)
    np.testing.assert_array_equal(store.get(places), stacks)
    assert len(store) == 40 and len(store.refs) >= 40


def test_compact_shard_round_trips_through_a_checkpoint():
    from walle_ray.runtime.checkpoint import arrays_to_tensors, tensors_to_arrays

    shard = PrioritizedReplay(48, 8, learning_starts=0, seed=4)
    sent = fill(shard, stream(300, 4), puts=6, per_put=12)
    state = tensors_to_arrays(arrays_to_tensors(shard.state_dict()))
    assert len(state["frames"]) == len(shard.frames)  # the distinct frames, not the stacks
    copy = PrioritizedReplay(48, 8, learning_starts=0, seed=4)
    copy.load_state_dict(state)
    assert copy.stats() == shard.stats()
    check_batches(copy, sent)
    fill(copy, stream(300, 5), puts=1, per_put=12)  # the store keeps working after loading
    assert len(copy) == 48


@pytest.mark.parametrize("obs_shape", [(4,), (2, 3)])
def test_vector_observations_are_stored_as_they_are(obs_shape):
    shard = PrioritizedReplay(8, 2, learning_starts=0)
    obs = np.ones((3, *obs_shape), np.float32 if len(obs_shape) == 1 else np.uint8)
    shard.put(Transitions(obs=obs, action=np.zeros(3, np.int64), next_obs=obs,
                          reward=np.zeros(3, np.float32), discount=np.zeros(3, np.float32),
                          priority=np.ones(3, np.float32), version_b=np.zeros(3, np.int64)))
    assert shard.frames is None and shard.storage["obs"].shape == (8, *obs_shape)

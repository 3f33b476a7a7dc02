"""Sum/min trees and the prioritized replay shard: exact sums, sampling law, FIFO, rate limits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from walle_ray.batch import Transitions
from walle_ray.buffers.prioritized import PrioritizedReplay
from walle_ray.buffers.sum_tree import MinTree, SumTree

CAPACITIES = st.integers(1, 70)


def update_batches(capacity: int, values: st.SearchStrategy) -> st.SearchStrategy:
    """Lists of (indices, values) batches for a tree of ``capacity`` leaves, repeats allowed."""
    batch = st.lists(st.tuples(st.integers(0, capacity - 1), values), min_size=1, max_size=20)
    return st.lists(batch, min_size=1, max_size=6)


def apply(tree, batches) -> np.ndarray:
    """Apply the batches to ``tree``; returns the leaves a plain loop (last value wins) gives."""
    leaves = np.full(tree.capacity, tree.neutral)
    for batch in batches:
        indices, values = map(np.array, zip(*batch))
        tree.update(indices, values)
        for i, v in batch:
            leaves[i] = v
    return leaves


@settings(max_examples=60, deadline=None)
@given(st.data(), CAPACITIES)
def test_sum_tree_total_is_leaf_sum(data, capacity):
    tree = SumTree(capacity)
    values = st.floats(0, 1e6, allow_nan=False)
    leaves = apply(tree, data.draw(update_batches(capacity, values)))
    np.testing.assert_array_equal(tree[np.arange(capacity)], leaves)
    np.testing.assert_allclose(tree.total, leaves.sum(), rtol=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.data(), CAPACITIES)
def test_min_tree_is_leaf_min(data, capacity):
    tree = MinTree(capacity)
    leaves = apply(tree, data.draw(update_batches(capacity, st.floats(-1e6, 1e6))))
    assert tree.min == leaves.min()


@settings(max_examples=60, deadline=None)
@given(st.data(), CAPACITIES)
def test_find_prefix_returns_the_interval_holding_the_prefix(data, capacity):
    # Integer leaves keep every partial sum exact, so the interval test has no tolerance.
    tree = SumTree(capacity)
    leaves = apply(tree, data.draw(update_batches(capacity, st.integers(0, 1000).map(float))))
    total = leaves.sum()
    if total == 0:
        return
    prefixes = np.array(data.draw(st.lists(st.floats(0, total, exclude_max=True), min_size=1)))
    found = tree.find_prefix(prefixes)
    cum = np.concatenate([[0.0], np.cumsum(leaves)])
    assert np.all((cum[found] <= prefixes) & (prefixes < cum[found + 1]))


def test_stratified_draws_follow_the_leaf_distribution():
    rng = np.random.default_rng(0)
    leaves = np.array([1.0, 2.0, 0.0, 4.0, 0.5, 8.0, 3.0])
    tree = SumTree(len(leaves))
    tree.update(np.arange(len(leaves)), leaves)
    batch, rounds = 64, 500
    segment = tree.total / batch
    counts = np.zeros(len(leaves))
    for _ in range(rounds):
        found = tree.find_prefix((np.arange(batch) + rng.random(batch)) * segment)
        counts += np.bincount(found, minlength=len(leaves))
    expected = leaves / leaves.sum() * batch * rounds
    assert counts[2] == 0
    positive = expected > 0
    chi2 = ((counts[positive] - expected[positive]) ** 2 / expected[positive]).sum()
    assert chi2 < 20  # 5 degrees of freedom: p < 0.002 (stratification only lowers it)


def test_tree_update_checks_its_inputs():
    tree = SumTree(4)
    with pytest.raises(IndexError):
        tree.update(np.array([4]), np.array([1.0]))
    with pytest.raises(ValueError):
        tree.update(np.array([0, 1]), np.array([1.0]))


def transitions(ids, priority=None, obs_shape=(2, 3)) -> Transitions:
    """Rows whose every field encodes its id; read-only, like arrays from the object store."""
    ids = np.asarray(ids)
    n = len(ids)
    obs = np.broadcast_to(ids.astype(np.uint8)[:, None, None], (n, *obs_shape))
    item = Transitions(obs=obs, action=ids.astype(np.int64), reward=ids.astype(np.float32),
                       discount=np.full(n, 0.99, np.float32), next_obs=obs + 1,
                       priority=np.ones(n, np.float32) if priority is None
                       else np.asarray(priority, np.float32),
                       version_b=np.zeros(n, np.int64))
    for value in vars(item).values():
        value.setflags(write=False)
    return item


def test_put_wraps_and_keeps_the_newest_capacity_rows():
    shard = PrioritizedReplay(8, 4, prioritized=False, learning_starts=0)
    for start in range(0, 15, 3):
        shard.put(transitions(range(start, start + 3)))
    assert len(shard) == 8 and shard.stats()["inserted"] == 15
    assert sorted(shard.ids) == list(range(7, 15))
    for _ in range(20):
        batch = shard.sample()
        assert np.all((batch.index >= 7) & (batch.index < 15))
        np.testing.assert_array_equal(batch.action, batch.index)
        np.testing.assert_array_equal(batch.obs[:, 1, 2], batch.index)
        np.testing.assert_array_equal(batch.next_obs[:, 0, 0], batch.index + 1)
        assert batch.obs.dtype == np.uint8 and batch.obs.shape == (4, 2, 3)


def test_put_larger_than_capacity_keeps_its_last_rows():
    shard = PrioritizedReplay(8, 2, learning_starts=0)
    shard.put(transitions(range(3)))
    shard.put(transitions(range(3, 23)))
    assert sorted(shard.ids) == list(range(15, 23))
    assert shard.stats()["inserted"] == 23
    np.testing.assert_array_equal(shard.storage["action"], shard.ids)
    np.testing.assert_allclose(shard.sums.total, 8 * (1 + 1e-6) ** 0.6)


def test_importance_weights_match_the_formula():
    # p_alpha = (|p| + 1) ** 0.5 = [1, 2, 3, 4]: P = [.1, .2, .3, .4], N = 4, beta = 0.5.
    # w = (N P) ** -beta / max = (P / P_min) ** -0.5 = [1, 1/sqrt(2), 1/sqrt(3), 1/2].
    shard = PrioritizedReplay(4, 4, alpha=0.5, beta=0.5, eps=1.0, learning_starts=0)
    shard.put(transitions(range(4), priority=[0.0, 3.0, 8.0, 15.0]))
    expected = np.array([1.0, 2 ** -0.5, 3 ** -0.5, 0.5])
    seen = np.zeros(4, int)
    for _ in range(300):
        batch = shard.sample()
        np.testing.assert_allclose(batch.weight, expected[batch.index], rtol=1e-6)
        assert batch.weight.dtype == np.float32 and batch.index.dtype == np.int64
        seen += np.bincount(batch.index, minlength=4)
    np.testing.assert_allclose(seen / seen.sum(), [0.1, 0.2, 0.3, 0.4], atol=0.02)


def test_partly_filled_shard_samples_only_filled_slots():
    # Priorities over many magnitudes make round-off at the top of the tree likely.
    rng = np.random.default_rng(3)
    shard = PrioritizedReplay(1000, 64, alpha=1.0, learning_starts=0, seed=3)
    shard.put(transitions(np.zeros(37, int), priority=10.0 ** rng.uniform(-6, 6, 37)))
    for _ in range(200):
        batch = shard.sample()
        assert batch.index.max() < 37
        assert np.all((batch.weight > 0) & (batch.weight <= 1))


def test_beta_anneals_to_one():
    shard = PrioritizedReplay(4, 2, beta=0.2, beta_anneal_updates=4, learning_starts=0)
    shard.put(transitions(range(4)))
    betas = []
    for _ in range(6):
        betas.append(shard.beta)
        shard.sample()
    np.testing.assert_allclose(betas, [0.2, 0.4, 0.6, 0.8, 1.0, 1.0])
    assert shard.stats()["beta"] == 1.0


def test_sampling_follows_priorities_after_updates():
    shard = PrioritizedReplay(6, 6, alpha=1.0, learning_starts=0, seed=1)
    shard.put(transitions(range(6)))
    priority = np.array([5.0, 0.0, 1.0, 2.0, 0.0, 12.0])
    assert shard.update_priorities(np.arange(6), -priority) == 6  # signs do not matter
    counts = np.zeros(6)
    for _ in range(1000):
        counts += np.bincount(shard.sample().index, minlength=6)
    np.testing.assert_allclose(counts / counts.sum(), priority / priority.sum(), atol=0.01)


def test_stale_priority_updates_are_ignored():
    shard = PrioritizedReplay(4, 2, learning_starts=0)
    shard.put(transitions(range(4)))
    batch_ids = np.arange(4)
    shard.put(transitions([4, 5]))  # overwrites ids 0 and 1
    assert shard.update_priorities(batch_ids, np.full(4, 5.0)) == 2
    assert shard.update_priorities(np.array([-1, 99]), np.array([3.0, 3.0])) == 0
    np.testing.assert_allclose(shard.priority, [1, 1, 5, 5])  # slots 0, 1 hold ids 4, 5
    stats = shard.stats()
    assert stats["priority_updates"] == 2 and stats["mean_priority"] == pytest.approx(3.0)


def test_missing_priorities_take_the_largest_seen():
    shard = PrioritizedReplay(8, 2, learning_starts=0)
    shard.put(transitions([0, 1], priority=[np.nan, 0.5]))
    shard.update_priorities(np.array([1]), np.array([7.0]))
    shard.put(transitions([2], priority=[np.nan]))
    np.testing.assert_allclose(shard.priority[:3], [1.0, 7.0, 7.0])
    np.testing.assert_allclose(shard.sums.total, ((np.array([1, 7, 7]) + 1e-6) ** 0.6).sum())


def test_infinite_priorities_never_enter_the_trees():
    """An inf TD error (from a learner, or a sampler's initial priority) gets the largest
    finite priority seen, so the tree total stays finite and draws follow the others."""
    shard = PrioritizedReplay(4, 4, alpha=1.0, learning_starts=0, seed=2)
    shard.put(transitions(range(4), priority=[1.0, 2.0, 3.0, np.inf]))
    shard.update_priorities(np.array([0, 1]), np.array([np.inf, -np.inf]))
    assert shard.max_priority == 3.0 and np.isfinite(shard.sums.total)
    np.testing.assert_allclose(shard.priority, [3.0, 3.0, 3.0, 3.0])
    counts = np.zeros(4)
    for _ in range(200):
        batch = shard.sample()
        assert np.all(batch.weight > 0)
        counts += np.bincount(batch.index, minlength=4)
    assert counts.min() > 0.2 * counts.sum() / 4  # not every draw on one slot


def test_uniform_mode():
    shard = PrioritizedReplay(10, 5, prioritized=False, learning_starts=0)
    shard.put(transitions(range(10), priority=np.arange(10) * 100.0))
    counts = np.zeros(10)
    for _ in range(400):
        batch = shard.sample()
        np.testing.assert_array_equal(batch.weight, np.ones(5, np.float32))
        counts += np.bincount(batch.index, minlength=10)
    np.testing.assert_allclose(counts / counts.sum(), 0.1, atol=0.02)
    assert shard.update_priorities(np.arange(3), np.ones(3)) == 3
    assert shard.stats()["mean_priority"] == 0.0


def test_learning_starts_gates_sampling():
    shard = PrioritizedReplay(100, 8, learning_starts=20)
    shard.put(transitions(range(19)))
    assert not shard.can_sample()
    shard.put(transitions([19]))
    assert shard.can_sample()
    small = PrioritizedReplay(100, 8, learning_starts=0)
    small.put(transitions(range(7)))
    assert not small.can_sample()  # a batch needs batch_size rows
    with pytest.raises(RuntimeError):
        PrioritizedReplay(10, 2, learning_starts=0).sample()


@settings(max_examples=40, deadline=None)
@given(ratio=st.sampled_from([0.25, 1.0, 4.0, 8.0, 16.0]), fragment=st.integers(1, 40),
       sampler_first=st.lists(st.booleans(), min_size=300, max_size=300))
def test_rate_limiter_holds_the_replay_ratio(ratio, fragment, sampler_first):
    # Whichever side is tried first each turn, the limits keep both within one lead of the
    # ratio (or one item, for items bigger than the lead: n-step transitions flushed at an
    # episode's end), and never hold both back.
    batch, starts = 8, 32
    shard = PrioritizedReplay(10_000, batch, learning_starts=starts, replay_ratio=ratio)
    item = transitions(np.zeros(fragment, int))
    lead = 2 * batch
    for sampler in sampler_first:
        turns = [shard.has_room(item), shard.can_sample()]
        assert any(turns), "neither side may move"
        if (sampler and turns[0]) or not turns[1]:
            shard.put(item)
        else:
            shard.sample()
        learned_on = shard.inserted - starts
        assert shard.sampled <= ratio * max(learned_on, 0) + batch
        assert learned_on <= shard.sampled / ratio + max(lead, fragment)
    assert shard.batches > 0


def test_rate_limiter_moves_in_lockstep():
    # A fast sampler is held back to 32 inserts per 64-row batch (ratio 2) once learning starts.
    shard = PrioritizedReplay(10_000, 64, learning_starts=100, replay_ratio=2.0)
    item = transitions(np.zeros(8, int))
    for _ in range(500):
        while shard.has_room(item):
            shard.put(item)
        assert shard.can_sample()
        shard.sample()
    np.testing.assert_allclose(shard.sampled / (shard.inserted - 100), 2.0, rtol=0.01)


def test_unlimited_without_a_ratio():
    shard = PrioritizedReplay(64, 8, learning_starts=8)
    item = transitions(range(64))
    shard.put(item)
    assert shard.has_room(item)
    for _ in range(100):
        shard.sample()
    assert shard.can_sample() and shard.stats()["sampled"] == 800


@pytest.mark.parametrize("kwargs, name", [
    (dict(capacity=4, batch_size=8, learning_starts=0), "capacity"),
    (dict(batch_size=0), "batch_size"),
    (dict(alpha=-0.1), "alpha"),
    (dict(beta=1.5), "beta"),
    (dict(beta=-0.1), "beta"),
    (dict(beta_anneal_updates=-1), "beta_anneal_updates"),
    (dict(eps=0.0), "eps"),
    (dict(learning_starts=2000), "learning_starts"),
    (dict(replay_ratio=0.0), "replay_ratio"),
    (dict(max_lead=-1), "max_lead"),
])
def test_constructor_rejects_bad_arguments(kwargs, name):
    args = {"capacity": 1000, "batch_size": 8, **kwargs}
    with pytest.raises(ValueError, match=name):
        PrioritizedReplay(args.pop("capacity"), args.pop("batch_size"), **args)


def test_state_dict_round_trip_samples_the_same_batches():
    from walle_ray.runtime.checkpoint import arrays_to_tensors, tensors_to_arrays

    shard = PrioritizedReplay(16, 4, learning_starts=0, seed=3, beta_anneal_updates=10)
    for start in range(0, 20, 5):  # wrapped around once
        shard.put(transitions(range(start, start + 5), priority=np.arange(1, 6)))
    shard.update_priorities(shard.sample().index, np.full(4, 9.0))
    state = tensors_to_arrays(arrays_to_tensors(shard.state_dict()))  # as a checkpoint keeps it
    copy = PrioritizedReplay(16, 4, learning_starts=0, seed=3, beta_anneal_updates=10)
    copy.load_state_dict(state)
    copy.rng = np.random.default_rng(7)
    shard.rng = np.random.default_rng(7)
    assert copy.stats() == shard.stats()
    np.testing.assert_allclose(copy.sums[np.arange(16)], shard.sums[np.arange(16)])
    for _ in range(3):
        a, b = shard.sample(), copy.sample()
        np.testing.assert_array_equal(a.index, b.index)
        np.testing.assert_allclose(a.weight, b.weight)
        np.testing.assert_array_equal(a.obs, b.obs)


def test_loading_more_than_capacity_is_refused():
    shard = PrioritizedReplay(16, 4, learning_starts=0)
    shard.put(transitions(range(16)))
    with pytest.raises(ValueError, match="room for 8"):
        PrioritizedReplay(8, 4, learning_starts=0).load_state_dict(shard.state_dict())


def test_priorities_split_into_each_batchs_rows():
    """A packed learner's new priorities, back to the shards whose batches it joined."""
    from walle_ray.batch import Priorities

    joined = Priorities(index=np.arange(10, 17), priority=np.arange(7, dtype=np.float32))
    parts = joined.split([3, 4])
    assert [p.index.tolist() for p in parts] == [[10, 11, 12], [13, 14, 15, 16]]
    assert [p.priority.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5, 6]]

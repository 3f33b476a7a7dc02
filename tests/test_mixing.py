"""Replay mixing: batch composition by ratio, and bad ratios refused with a clear message."""

import numpy as np
import pytest
from omegaconf import OmegaConf

from walle_ray.algos.impala import buffer_specs, check_replay
from walle_ray.algos.impala.config import IMPALAConfig, ReplaySpec
from walle_ray.buffers.mixed import BufferSpec, MixedMemory
from walle_ray.config import ConfigError

from test_roles import make_sampler


def fragments(n, envs=4):
    s = make_sampler(T=5, envs=envs)
    out = []
    for v in range(n):
        s.set_weights(s.policy.model.get_weights(), version=v)
        out.append(s.collect()[0])
    return out


def test_half_queue_half_replay_batch_has_the_right_composition():
    memory = MixedMemory([BufferSpec("queue", 0.5, 16), BufferSpec("uniform", 0.5, 64)], batch_rows=8)
    frags = fragments(3)
    assert not memory.can_sample()
    memory.put(frags[0])
    memory.put(frags[1])
    batch = memory.sample()
    batch.check()
    assert batch.reward_t.shape == (5, 8)
    np.testing.assert_array_equal(batch.replayed_b, [False] * 4 + [True] * 4)
    np.testing.assert_array_equal(batch.version_b[:4], [0] * 4)  # queue rows, oldest first
    assert set(batch.version_b[4:]) <= {0, 1}
    assert memory.stats()["queue_size"] == 4 and memory.stats()["uniform_size"] == 8
    memory.sample()
    assert not memory.can_sample()  # the queue is empty: no batch of replay alone


def test_queue_is_bounded_and_replay_evicts_oldest():
    memory = MixedMemory([BufferSpec("queue", 0.5, 8), BufferSpec("uniform", 0.5, 8)], batch_rows=8)
    a, b, c = fragments(3)
    memory.put(a)
    memory.put(b)
    assert not memory.has_room(c)  # the on-policy queue waits for a learner
    memory.sample()
    assert memory.has_room(c)
    memory.put(c)
    assert {int(r.version_b[0]) for r in memory.buffers[1].rows} == {1, 2}


def test_memory_copies_rows_so_senders_can_reuse_buffers():
    memory = MixedMemory([BufferSpec("queue", 1.0, 8)], batch_rows=4)
    frag = fragments(1)[0]
    memory.put(frag)
    frag.reward_t[:] = -7
    assert (memory.sample().reward_t != -7).all()


def cfg(*specs, batch=8):
    return OmegaConf.structured(IMPALAConfig(batch_size=batch, replay=[ReplaySpec(**s) for s in specs]))


@pytest.mark.parametrize("specs,message", [
    ([{"type": "queue", "ratio": 0.5}, {"type": "uniform", "ratio": 0.25}], "sum to 0.75"),
    ([{"type": "queue", "ratio": 0.3}, {"type": "uniform", "ratio": 0.7}], "not a whole number"),
    ([{"type": "elites", "ratio": 1.0}], "use one of queue, uniform, elite, attentive"),
    ([{"type": "queue", "ratio": 0.5}, {"type": "queue", "ratio": 0.5}], "queue once"),
    ([{"type": "uniform", "ratio": 1.0, "capacity": 4}], "cannot serve 8"),
    ([], "at least one"),
])
def test_bad_mixes_are_refused(specs, message):
    with pytest.raises(ConfigError, match=message):
        check_replay(cfg(*specs), 8)


def test_capacities_are_the_runs_split_across_memories_and_fit_a_fragment():
    mix = cfg({"type": "queue", "ratio": 0.25}, {"type": "uniform", "ratio": 0.75, "capacity": 100,
                                                 "start_rows": 50})
    # Capacity 0: four batches of the type's rows (2 of 8), at least a fragment beside them.
    assert [s.capacity for s in buffer_specs(mix, 8, 4)] == [8, 100]
    assert [s.capacity for s in buffer_specs(mix, 8, 8)] == [10, 100]
    # Four memories (a batch of 8 over 4 learners: 2 rows each) share the 100 rows.
    specs = buffer_specs(mix, 2, 8, memories=4)
    assert [s.capacity for s in specs] == [8, 25] and specs[1].start_rows == 13


@pytest.mark.parametrize("types,whole,shards", [
    ("queue uniform", [2, 6], 4), ("queue uniform", [1, 3], 2), ("queue uniform uniform", [3, 2, 3], 4),
    ("queue uniform", [4, 4], 4), ("queue uniform elite", [2, 6, 8], 8),
    ("queue uniform uniform attentive", [1, 2, 3, 6], 3)])
def test_shards_take_the_updates_mix_in_turn(types, whole, shards):
    """Where the learners do not divide a type's rows, they take them in turn: every update's
    shards together take the mix's rows, each batch is full, no batch takes more of a type
    than its buffer keeps room for (``most_rows``), ranked types take a fixed count, and each
    shard's long-run share is the ratio."""
    from walle_ray.buffers.mixed import batch_counts, most_rows

    types, n = types.split(), sum(whole) // shards
    most = most_rows(types, whole, n, shards)
    totals = np.zeros((shards, len(whole)), int)
    for k in range(4 * shards):
        counts = np.array([batch_counts(types, whole, n, j, shards, k) for j in range(shards)])
        assert (counts >= 0).all() and (counts.sum(axis=1) == n).all() and (counts <= most).all()
        np.testing.assert_array_equal(counts.sum(axis=0), whole)
        for i, t in enumerate(types):
            if t in ("elite", "attentive"):
                assert (counts[:, i] == whole[i] // shards).all()
        totals += counts
    np.testing.assert_array_equal(totals, np.tile(np.array(whole) * 4, (shards, 1)))
    # Three unranked types dealt unevenly: the one that fills up may take more than its share.
    if types == ["queue", "uniform", "uniform"]:
        assert most == [2, 1, 1]


def test_a_shards_memory_serves_its_turns_of_the_queue():
    """Batches of 8 over 4 learners with a quarter fresh: memory 2 serves 2 rows a batch, a
    fresh one every other batch, starting with the first."""
    memory = MixedMemory([BufferSpec("queue", 0.25, 16), BufferSpec("uniform", 0.75, 64)],
                         batch_rows=2, shard=2, shards=4)
    for frag in fragments(2):
        memory.put(frag)
    fresh = [int((~memory.sample().replayed_b).sum()) for _ in range(4)]
    assert fresh == [1, 0, 1, 0]
    assert memory.stats()["queue_size"] == 8 - 2


def test_mixes_the_learners_split_unevenly():
    """A quarter of 8 rows over 4 learners is dealt in turn; a ranked type must split evenly,
    and the mix must fit each learner's batch."""
    quarter = cfg({"type": "queue", "ratio": 0.25}, {"type": "uniform", "ratio": 0.75})
    check_replay(quarter, 2, learners=4)
    with pytest.raises(ConfigError, match="not a whole number"):
        check_replay(quarter, 1, learners=2)  # a quarter of 2 rows
    elite = cfg({"type": "queue", "ratio": 0.75}, {"type": "elite", "ratio": 0.25})
    with pytest.raises(ConfigError, match="elite replay ranks a fixed number of rows"):
        check_replay(elite, 2, learners=4)
    check_replay(cfg({"type": "queue", "ratio": 0.25}, {"type": "uniform", "ratio": 0.25},
                     {"type": "attentive", "ratio": 0.5}), 4, learners=2)
    three = cfg({"type": "queue", "ratio": 0.25}, {"type": "uniform", "ratio": 0.25},
                {"type": "uniform", "ratio": 0.5})
    with pytest.raises(ConfigError, match="do not fit batches of 1 rows on each of 4 learners"):
        check_replay(three, 1, learners=4)

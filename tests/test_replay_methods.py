"""Elite and attentive replay: ranking on hand-built cases for each distance, the annealing,
batches of the right composition, snapshots, refused settings, and a run through Ray."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from walle_ray.algos.impala import IMPALA, check_replay
from walle_ray.algos.impala.config import IMPALAConfig, ReplaySpec
from walle_ray.algos.spec import actor_critic_model, fragment_sampler, role_sections
from walle_ray.batch import Rollout
from walle_ray.buffers.encoder import PolicyEncoder
from walle_ray.buffers.ranked import (RankedReplay, annealed_multiplier, reference_distances,
                                      sequence_distances)
from walle_ray.config import ConfigError

from conftest import make_cfg, run_cli

T, F = 3, 4


def row(obs, feature=None, last_obs=None, dist=None):
    """A one-env row of T steps whose observations are the vectors ``obs`` [T, F]."""
    obs = np.asarray(obs, np.float32).reshape(T, 1, -1)
    zeros = np.zeros((T, 1), np.float32)
    return Rollout(obs_t=obs, action_t=np.zeros((T, 1), np.int64), reward_t=zeros,
                   terminated_t=zeros.astype(bool), truncated_t=zeros.astype(bool),
                   logp_t=zeros, dist_t=np.zeros((T, 1, 2), np.float32) if dist is None else dist,
                   v_t=zeros, final_v_t=zeros, final_obs=np.zeros((0, obs.shape[-1]), np.float32),
                   return_t=zeros, last_obs=(obs[-1] if last_obs is None
                                             else np.asarray(last_obs, np.float32)[None]),
                   last_v=np.zeros(1, np.float32), version_b=np.zeros(1, np.int64),
                   replayed_b=np.zeros(1, bool),
                   feature_t=None if feature is None else np.asarray(feature, np.float32).reshape(T, 1, -1))


class Identity:
    """An encoder whose encoding of a state is the state itself."""

    version = 0

    def encode(self, obs_t):
        return obs_t.astype(np.float32)


def ranked(kind, rows, k, fn, multiplier=None, **kwargs):
    """A ranking buffer holding ``rows`` that draws every row as a candidate."""
    buf = RankedReplay(kind, capacity=len(rows), k=k, dist_function=fn,
                       lambda_batch_multiplier=multiplier or len(rows) / k, **kwargs)
    buf.encoder = Identity()
    for r in rows:
        buf.add(r)
    return buf


def kept(buf, rows):
    return sorted(next(i for i, r in enumerate(rows) if r is s) for s in buf.sample(buf.k))


def test_distances_match_the_formulas():
    new = np.array([[[1.0, 0.0]], [[0.0, 2.0]]])  # [T=2, N=1, F=2]
    old = np.array([[[1.0, 1.0]], [[0.0, 0.0]]])
    np.testing.assert_allclose(sequence_distances(new, old, "ln_norm"), [np.sqrt(1 + 4)])
    np.testing.assert_allclose(sequence_distances(new, old, "ln_norm", p=1), [3.0])
    cos = (1 * 1 + 0 + 0 + 0) / (np.sqrt(5) * np.sqrt(2))
    np.testing.assert_allclose(sequence_distances(new, old, "cosine"), [1 - cos])
    ref = np.array([[1.0, 0.0], [0.0, 3.0]])  # two reference states: nearest is per step
    np.testing.assert_allclose(reference_distances(new, ref, "ln_norm"), [(0.0 + 1.0) / 2])


def test_elite_keeps_the_rows_whose_encodings_moved_least_by_ln_norm_and_cosine():
    rng = np.random.default_rng(0)
    base = [rng.normal(size=(T, F)) for _ in range(6)]
    # rows 0-1: stored encoding = 3x the current one (same direction, far in norm);
    # rows 2-3: a small shift; rows 4-5: unrelated encodings
    stored = [3 * base[0], 3 * base[1], base[2] + 0.05, base[3] - 0.05,
              rng.normal(size=(T, F)), rng.normal(size=(T, F))]
    rows = [row(b, s) for b, s in zip(base, stored)]
    assert kept(ranked("elite", rows, 2, "ln_norm"), rows) == [2, 3]
    assert kept(ranked("elite", rows, 2, "cosine"), rows) == [0, 1]


def test_the_platforms_four_selections_by_hand():
    """Six candidates with distances 0..5 (in a shuffled drawing order) and serving counts:
    which positions a batch of 2 keeps under each of the platform's strategies."""
    from walle_ray.buffers.ranked import select

    distances = np.array([3.0, 0.0, 5.0, 1.0, 4.0, 2.0])  # order by distance: 1, 3, 5, 0, 4, 2
    served = np.array([0, 2, 1, 3, 0, 0])
    assert select("nearest", distances, served, 2).tolist() == [1, 3]
    assert select("spread", distances, served, 2).tolist() == [1, 0]  # groups [1,3,5], [0,4,2]
    assert select("least_served", distances, served, 2).tolist() == [5, 0]  # served 0, nearest first
    assert select("least_served_in_group", distances, served, 2).tolist() == [5, 0]
    # fewer distinct candidates than the batch: taken again, in the same order
    assert select("least_served", distances[:1], served[:1], 3).tolist() == [0, 0, 0]


def test_least_served_turns_over_the_rows_a_nearest_selection_repeats():
    """With the same ranking, ``nearest`` serves rows 2-3 every time; ``least_served``
    counts what it served and moves on to the rows served fewer times."""
    rng = np.random.default_rng(0)
    base = [rng.normal(size=(T, F)) for _ in range(6)]
    stored = [b + 0.1 * i for i, b in enumerate(base)]  # row i moved 0.1 i: row 0 nearest
    rows = [row(b, feature=s) for b, s in zip(base, stored)]
    nearest = ranked("elite", rows, 2, "ln_norm")
    assert [kept(nearest, rows) for _ in range(3)] == [[0, 1]] * 3
    turning = ranked("elite", rows, 2, "ln_norm", strategy="least_served")
    assert [kept(turning, rows) for _ in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert turning.served_count.tolist() == [1] * 6
    again = ranked("elite", rows, 2, "ln_norm", strategy="least_served", replacement=True)
    assert len(again.sample(2)) == 2  # drawn with repeats, each distinct row ranked once


def test_steps_reads_evenly_spaced_steps_of_each_row():
    stored = [np.zeros((T, F)) for _ in range(4)]
    stored[0][1] = stored[1][1] = 5.0  # rows 0-1 moved a lot, at the middle step only
    stored[2][0] = stored[3][2] = 0.1  # rows 2-3 moved a little, at the first or last step
    rows = [row(np.zeros((T, F)), s) for s in stored]
    assert kept(ranked("elite", rows, 2, "ln_norm"), rows) == [2, 3]
    assert kept(ranked("elite", rows, 2, "ln_norm", steps=2), rows) == [0, 1]  # steps 0 and 2


def test_elite_by_kl_keeps_the_rows_the_current_policy_acts_most_like(tmp_path):
    cfg = make_cfg("algo=impala", "env=cartpole", "model.hidden=[8]")
    encoder = PolicyEncoder(role_sections(cfg), actor_critic_model)
    encoder.set_weights(encoder.model.get_weights(), 0)
    rng = np.random.default_rng(1)
    rows = []
    for shift in [2.0, 0.0, 1.0, 0.1, 3.0]:  # logits moved away from the current policy's
        obs = rng.normal(size=(T, 4)).astype(np.float32)
        with torch.no_grad():
            logits = encoder.model.policy(torch.from_numpy(obs)).numpy()
        logits[:, 0] += shift
        rows.append(row(obs, dist=logits[:, None, :]))
    buf = RankedReplay("elite", capacity=5, k=2, dist_function="kl", lambda_batch_multiplier=2.5)
    buf.encoder = encoder
    for r in rows:
        buf.add(r)
    assert kept(buf, rows) == [1, 3]
    assert buf.stats()["dist_kept"] < buf.stats()["dist_drawn"]


def test_attentive_keeps_the_rows_nearest_the_states_the_policy_visits_now():
    far = [row(np.full((T, F), 10.0 + i)) for i in range(3)]
    near = [row(np.full((T, F), 0.1)), row(np.full((T, F), -0.2))]
    current = [row(np.zeros((T, F)), last_obs=np.zeros(F)) for _ in range(2)]  # newest: the reference
    rows = far + near + current
    buf = ranked("attentive", rows, 2, "ln_norm", reference_rows=2)
    kept_rows = kept(buf, rows)
    assert kept_rows == [5, 6]  # the reference rows themselves sit at distance 0
    buf = ranked("attentive", far + near, 2, "ln_norm", reference_rows=1)
    buf.add(current[0])
    chosen = kept(buf, far + near + [current[0]])
    assert chosen == [3, 5]  # the reference row itself, then the nearer of the near ones


def test_the_multiplier_anneals_to_one_over_alpha_runs():
    assert annealed_multiplier(6, 1.0, 0.0) == 6
    assert annealed_multiplier(6, 1.0, 0.5) == 3.5
    assert annealed_multiplier(6, 2.0, 1.0) == 3.5
    assert annealed_multiplier(6, 1.0, 2.0) == 1
    rows = [row(np.full((T, F), float(i)), np.full((T, F), float(i))) for i in range(12)]
    buf = ranked("elite", rows[:4], 2, "ln_norm", multiplier=3.0, anneal_rows=8,
                 alpha_annealing_factor=1.0)
    buf.sample(2)
    assert buf.stats()["candidates"] == 4  # all 4 rows held (3 x 2 = 6 wanted)
    for r in rows[4:]:
        buf.add(r)  # 12 rows stored of 8 expected: past the run's end, lambda is 1
    assert buf.multiplier_now() == 1.0
    ranked_before = buf.ranked
    buf.sample(2)
    assert buf.ranked == ranked_before  # a uniform draw, nothing ranked


def test_prepare_ranks_the_next_batch_ahead():
    rows = [row(np.full((T, F), float(i)), np.full((T, F), float(i) + i)) for i in range(8)]
    buf = ranked("elite", rows, 2, "ln_norm")
    buf.prepare()
    assert buf.ready is not None and buf.ranked == 1
    assert kept(buf, rows) == [0, 1] and buf.ranked == 1 and buf.stats()["ready_frac"] == 1.0


def sampler(cfg, encode=True):
    sections = role_sections(cfg)
    s = fragment_sampler(sections.env, sections.model, fragment_length=5, gamma=0.9, index=0,
                         seed=0, encode=encode)
    s.set_weights(s.policy.model.get_weights(), version=0)
    return s


def test_samplers_store_their_encodings_for_elite_replay():
    frag = sampler(mix_cfg()).collect()[0]
    assert frag.feature_t.shape == (5, 4, 8)  # the actor's last hidden layer
    frag.check()
    assert sampler(mix_cfg(), encode=False).collect()[0].feature_t.shape == (5, 4, 0)


def mix_cfg(*overrides):
    return make_cfg("algo=impala", "env=cartpole", "model.hidden=[8]", "algo.batch_size=8",
                    "algo.fragment_length=5", "env.envs_per_sampler=4",
                    "run.total_env_steps=4000", *overrides)


ELITE = "{type: elite, ratio: 0.5, capacity: 64, lambda_batch_multiplier: 3}"


def test_a_queue_and_elite_mix_serves_batches_of_the_right_composition():
    cfg = mix_cfg(f"algo.replay=[{{type: queue, ratio: 0.5}}, {ELITE}]")
    cls, args, kwargs = IMPALA.memory(cfg, 0)
    memory = cls(*args, **kwargs)
    assert memory.wants_weights and not memory.can_sample()
    s = sampler(cfg)
    memory.set_weights(s.policy.model.get_weights(), 0)
    for _ in range(3):
        memory.put(s.collect()[0])
    batch = memory.sample()
    assert batch.reward_t.shape == (5, 8)
    np.testing.assert_array_equal(batch.replayed_b, [False] * 4 + [True] * 4)
    stats = memory.stats()
    assert stats["elite_candidates"] == 12 and stats["elite_size"] == 12
    assert stats["elite_dist_kept"] <= stats["elite_dist_drawn"]
    # the snapshot carries the rows and the annealing
    again = cls(*args, **kwargs)
    again.load_state_dict(memory.state_dict())
    assert len(again.buffers[1].rows) == 12 and again.buffers[1].added == 12
    assert again.buffers[1].multiplier_now() == memory.buffers[1].multiplier_now()
    np.testing.assert_array_equal(again.buffers[1].rows[5].feature_t,
                                  memory.buffers[1].rows[5].feature_t)


def test_a_snapshot_goes_through_the_checkpoint_file_and_refills_the_memory(tmp_path, capsys):
    from walle_ray.runtime.checkpoint import arrays_to_tensors
    from walle_ray.runtime.start import restore_memories

    cfg = mix_cfg(f"algo.replay=[{{type: queue, ratio: 0.5}}, {ELITE}]", "memory.checkpoint=true")
    cls, args, kwargs = IMPALA.memory(cfg, 0)
    memory, fresh = cls(*args, **kwargs), cls(*args, **kwargs)
    s = sampler(cfg)
    for _ in range(2):
        memory.put(s.collect()[0])
    torch.save({"memories": arrays_to_tensors([memory.state_dict()])}, tmp_path / "last.pt")
    ckpt = torch.load(tmp_path / "last.pt", weights_only=True)
    fleet = SimpleNamespace(memories=[fresh], topo=SimpleNamespace(memories=1), load_memory_states=lambda states: fresh.load_state_dict(states[0]))
    restore_memories(cfg, fleet, ckpt)
    assert "replay restored: 8 rows in 1 memory" in capsys.readouterr().out
    assert fresh.buffers[1].added == 8 and len(fresh.buffers[1].rows) == 8
    np.testing.assert_array_equal(fresh.buffers[1].rows[3].obs_t, memory.buffers[1].rows[3].obs_t)


def test_a_snapshot_keeps_the_rows_its_buffers_share_once_and_refuses_another_mix():
    cfg = mix_cfg(f"algo.replay=[{{type: uniform, ratio: 0.5, capacity: 64}}, {ELITE}]")
    cls, args, kwargs = IMPALA.memory(cfg, 0)
    memory = cls(*args, **kwargs)
    s = sampler(cfg)
    for _ in range(2):
        memory.put(s.collect()[0])
    state = memory.state_dict()
    assert state["held"] == 8 and state["rows"]["reward_t"].shape == (5, 8)  # not 16
    again = cls(*args, **kwargs)
    again.load_state_dict(state)
    assert again.buffers[0].rows[2] is again.buffers[1].rows[2]  # shared again after a restore
    other = mix_cfg(f"algo.replay=[{{type: queue, ratio: 0.5}}, {ELITE}]")
    cls, args, kwargs = IMPALA.memory(other, 0)
    with pytest.raises(ValueError, match="the same mix"):
        cls(*args, **kwargs).load_state_dict(state)


def algo(*specs, batch=8):
    return OmegaConf.structured(IMPALAConfig(batch_size=batch, replay=[ReplaySpec(**s) for s in specs]))


@pytest.mark.parametrize("spec,message", [
    ({"type": "elite", "lambda_batch_multiplier": 0.5}, "at least 1"),
    ({"type": "elite", "dist_function": "l2"}, "ln_norm or cosine or kl"),
    ({"type": "attentive", "dist_function": "kl"}, "ln_norm or cosine"),
    ({"type": "elite", "alpha_annealing_factor": 0}, "must be positive"),
    ({"type": "attentive", "reference_rows": 0}, "at least one reference"),
])
def test_bad_ranking_settings_are_refused(spec, message):
    with pytest.raises(ConfigError, match=message):
        check_replay(algo({"type": "queue", "ratio": 0.5}, {"ratio": 0.5, **spec}), 8)


def test_user_networks_rank_by_kl_only_and_a_queue_alone_is_not_snapshotted(on_path):
    from walle_ray.algos import validate

    cfg = mix_cfg(f"algo.replay=[{{type: queue, ratio: 0.5}}, {ELITE}]", "model._target_=my_pkg.nets.MyActorCritic")
    with pytest.raises(ConfigError, match="dist_function: kl"):
        validate(cfg)
    with pytest.raises(ConfigError, match="only the on-policy queue"):
        validate(mix_cfg("memory.checkpoint=true"))


def test_elite_and_attentive_run_through_ray_with_two_memories_and_two_learners(tmp_path):
    out = run_cli("algo=impala", "env=cartpole", "topology=2a2m2l", "run.ray_num_cpus=2",
                  "~preset", "logger.progress=line", f"hydra.run.dir={tmp_path}",
                  "run.total_env_steps=12000", "run.report_every_s=1", "memory.checkpoint=true",
                  "algo.replay=[{type: queue, ratio: 0.5}, {type: elite, ratio: 0.25, capacity: 200,"
                  " lambda_batch_multiplier: 4}, {type: attentive, ratio: 0.25, capacity: 200,"
                  " lambda_batch_multiplier: 4, dist_function: cosine}]", timeout=240).stdout
    assert "stopped (budget)" in out
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    for k in (0, 1):
        for kind in ("elite", "attentive"):
            assert last[f"memory/{k}/{kind}_candidates"] > 0  # both memories ranked
            assert last[f"memory/{k}/{kind}_weights_version"] > 0
    assert any(r.get("memory/0/elite_rank_share", 0) > 0 for r in records)
    assert last["updates"] > 0 and (tmp_path / "checkpoints" / "last.pt").is_file()

"""Roles stepped by hand: sampler on a counting env, memory, parameter server, normaliser."""

import dataclasses
import os

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from walle_ray.actors.param_server import ParameterServer
from walle_ray.algos.spec import fragment_sampler, fragment_sampler_args
from walle_ray.batch import concat_rollouts
from walle_ray.buffers.fifo import FIFOQueue
from walle_ray.config import EnvConfig, ModelConfig
from walle_ray.models import RunningNorm, make_actor_critic

LENGTH = 5


def counting(truncate=False, envs=2):
    return OmegaConf.structured(EnvConfig(name="counting", id="walle/Counting-v0",
                                          envs_per_sampler=envs, normalize_reward=True,
                                          kwargs={"length": LENGTH, "truncate": truncate}))


def make_sampler(truncate=False, T=7, envs=2):
    return fragment_sampler(counting(truncate, envs), OmegaConf.structured(ModelConfig()),
                            fragment_length=T, gamma=0.5, index=0, seed=0)


def test_fragment_shapes_and_contents():
    s = make_sampler()
    s.set_weights(s.policy.model.get_weights(), version=3)
    r, stats = s.collect()
    r.check()
    T, B = 7, 2
    assert r.obs_t.shape == (T, B, 1) and r.action_t.shape == (T, B) and r.dist_t.shape == (T, B, 2)
    assert r.last_obs.shape == (B, 1) and r.last_v.shape == (B,)
    assert (r.version_b == 3).all() and stats["policy_version"] == 3
    # observations count up within an episode and start again after its last step
    np.testing.assert_array_equal(r.obs_t[:, 0, 0], [0, 1, 2, 3, 4, 0, 1])
    np.testing.assert_array_equal(r.terminated_t[:, 0], [0, 0, 0, 0, 1, 0, 0])
    assert not r.truncated_t.any() and (r.final_v_t == 0).all()
    assert (r.reward_t == 1).all()
    assert stats["episode_returns"] == [LENGTH, LENGTH] and stats["episode_lengths"] == [LENGTH] * 2
    # discounted running return restarts with each episode
    np.testing.assert_allclose(r.return_t[:, 0], [1, 1.5, 1.75, 1.875, 1.9375, 1, 1.5])
    logp = torch.log_softmax(torch.from_numpy(r.dist_t), -1).gather(
        -1, torch.from_numpy(r.action_t)[..., None])[..., 0]
    np.testing.assert_allclose(r.logp_t, logp.numpy(), rtol=1e-5)


def test_a_sampler_takes_its_weights_from_any_feed():
    """The acting loop knows no Ray: any object with ``refresh``, ``ahead`` and ``lead``
    (``contracts.WeightsFeed``) feeds it; ``ahead`` comes ``lead`` steps before the end."""
    from walle_ray.contracts import WeightsFeed

    s = make_sampler(T=7)
    weights = s.policy.model.get_weights()
    calls, steps = [], []
    env_step = s.env.step
    s.env.step = lambda *args: (steps.append(1), env_step(*args))[1]

    class Feed:
        lead = 2

        def refresh(self, sampler):
            calls.append(("refresh", sampler.version))
            if sampler.version < 7:
                sampler.set_weights(weights, 7)

        def ahead(self):
            calls.append(("ahead", len(steps)))

    assert isinstance(Feed(), WeightsFeed)
    first, _ = s.collect(Feed())
    second, stats = s.collect(Feed())
    assert (first.version_b == 7).all() and stats["policy_version"] == 7
    assert calls == [("refresh", -1), ("ahead", 5), ("refresh", 7), ("ahead", 12)]


def test_a_restarting_sampler_rebuilds_on_env_errors_but_not_on_the_feed_s():
    """An env that raises costs a rebuilt sampler and a lost fragment; an error from the
    weights feed (a parameter server gone) is not the env's and reaches the caller."""
    from walle_ray.actors.restart import RestartingSampler
    from walle_ray.algos.spec import fragment_sampler

    args = (counting(), OmegaConf.structured(ModelConfig()), 7, 0.5, 0, 0)
    sampler = RestartingSampler(fragment_sampler, args)
    weights = sampler.sampler.policy.model.get_weights()

    class Feed:
        lead, broken = 0, False

        def refresh(self, s):
            if self.broken:
                raise ConnectionError("the parameter server is gone")
            s.set_weights(weights, 1)

        def ahead(self):
            pass

    feed = Feed()
    first = sampler.sampler
    step = first.env.step
    first.env.step = lambda *a: (_ for _ in ()).throw(RuntimeError("env broke"))
    _, stats = sampler.collect(feed)
    assert sampler.sampler is not first and stats["lost_fragments"] == 1
    first.env.step = step
    feed.broken = True
    rebuilt = sampler.sampler
    with pytest.raises(ConnectionError):
        sampler.collect(feed)
    assert sampler.sampler is rebuilt and sampler.restarts == 1


def test_episodes_continue_across_fragments():
    s = make_sampler(T=3)
    first, _ = s.collect()
    second, _ = s.collect()
    np.testing.assert_array_equal(second.obs_t[0], first.last_obs)
    np.testing.assert_array_equal(second.obs_t[:, 1, 0], [3, 4, 0])


def test_truncation_records_the_value_of_the_final_observation():
    s = make_sampler(truncate=True)
    r, _ = s.collect()
    assert r.truncated_t[4].all() and not r.terminated_t.any()
    with torch.no_grad():
        v_final = s.policy.model(torch.tensor([[float(LENGTH)]]))[1].item()
    np.testing.assert_allclose(r.final_v_t[4], [v_final, v_final], rtol=1e-5)
    assert (r.final_v_t[[0, 1, 2, 3, 5, 6]] == 0).all()


def test_truncated_steps_carry_their_final_observations():
    """A learner that values truncated episodes' final observations itself (IMPALA) finds
    them in the fragment; the sampler's own value there is NaN, so it cannot be used."""
    s = fragment_sampler(counting(truncate=True), OmegaConf.structured(ModelConfig()),
                         fragment_length=7, gamma=0.5, bootstrap_value=False)
    r, _ = s.collect()
    r.check()
    assert r.truncated_t[4].all() and r.final_obs.shape == (2, 1)
    np.testing.assert_array_equal(r.final_obs[:, 0], [LENGTH, LENGTH])
    assert np.isnan(r.final_v_t[4]).all() and (r.final_v_t[[0, 1, 2, 3, 5, 6]] == 0).all()
    untruncated, _ = make_sampler().collect()
    assert untruncated.final_obs.shape == (0, 1) and untruncated.final_obs.dtype == np.float32


def labelled_rollout(truncated_t, first_label=0):
    """A rollout whose final observation of the truncated step (t, b) reads
    first_label + 10 * t + b, so where each one went can be read off."""
    from walle_ray.batch import Rollout

    T, B = truncated_t.shape
    t_idx, b_idx = np.nonzero(truncated_t)
    z = np.zeros((T, B), np.float32)
    return Rollout(obs_t=np.zeros((T, B, 1), np.float32), action_t=np.zeros((T, B), np.int64),
                   reward_t=z, terminated_t=np.zeros((T, B), bool), truncated_t=truncated_t,
                   logp_t=z, dist_t=np.zeros((T, B, 2), np.float32), v_t=z, final_v_t=z,
                   final_obs=(first_label + 10 * t_idx + b_idx).astype(np.float32)[:, None],
                   return_t=z, last_obs=np.zeros((B, 1), np.float32), last_v=np.zeros(B, np.float32),
                   version_b=np.zeros(B, np.int64), replayed_b=np.zeros(B, bool))


def test_final_observations_follow_their_rows_through_rows_and_concat():
    a = labelled_rollout(np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], bool))
    b = labelled_rollout(np.array([[1, 0], [0, 0], [0, 1]], bool), first_label=1000)
    joined = concat_rollouts([a, b])  # columns a0 a1 a2 b0 b1
    joined.check()
    labels = {(0, 1): 1, (1, 0): 10, (1, 2): 12, (2, 1): 21, (0, 3): 1000, (2, 4): 1021}
    want = [labels[tb] for tb in zip(*np.nonzero(joined.truncated_t))]
    np.testing.assert_array_equal(joined.final_obs[:, 0], want)
    for cols in ([1], [4, 0], slice(2, 4)):
        part = joined.rows(cols)
        part.check()
        picked = np.arange(5)[cols]
        want = [labels[(t, picked[c])] for t, c in zip(*np.nonzero(part.truncated_t))]
        np.testing.assert_array_equal(part.final_obs[:, 0], want)
    with pytest.raises(ValueError, match="one final observation per truncated step"):
        dataclasses.replace(a, final_obs=a.final_obs[:1]).check()


def test_values_computed_per_fragment_match_the_full_forward_pass():
    """A separate critic is run once per fragment, on all T + 1 observations; the values
    and the policy outputs it records are what one full forward pass per step gives."""
    s = make_sampler(T=7)
    assert s.policy.model.separate_critic
    r, _ = s.collect()
    with torch.no_grad():
        obs = torch.from_numpy(np.concatenate([r.obs_t, r.last_obs[None]]).reshape(-1, 1))
        params, values = s.policy.model(obs)
    np.testing.assert_allclose(r.v_t, values[:14].view(7, 2).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r.last_v, values[14:].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r.dist_t, params[:14].view(7, 2, -1).numpy(), rtol=1e-5, atol=1e-6)


def test_without_the_bootstrap_value_the_rest_is_unchanged():
    """``bootstrap_value=False`` (IMPALA's samplers) leaves ``last_v`` NaN and every other
    field as the default sampler writes it from the same seed and weights."""
    with_v = make_sampler()
    without = fragment_sampler(counting(), OmegaConf.structured(ModelConfig()), fragment_length=7,
                               gamma=0.5, bootstrap_value=False)
    without.set_weights(with_v.policy.model.get_weights(), 0)
    with_v.set_weights(with_v.policy.model.get_weights(), 0)
    torch.manual_seed(1)
    a, _ = with_v.collect()
    torch.manual_seed(1)
    b, _ = without.collect()
    assert np.isnan(b.last_v).all() and b.last_v.shape == a.last_v.shape
    for name in ("obs_t", "action_t", "reward_t", "terminated_t", "logp_t", "dist_t", "v_t",
                 "final_v_t", "last_obs"):
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("algo,bootstrap", [("ppo", True), ("ppo_kl", True), ("impala", False)])
def test_samplers_skip_the_bootstrap_value_only_where_learners_compute_it(algo, bootstrap):
    """PPO's GAE reads the sampler's ``last_v``; IMPALA's V-trace values the last
    observation with the learner's own network."""
    from conftest import make_cfg
    from walle_ray.actors.sampler import Sampler
    from walle_ray.actors.writers import FragmentWriter
    from walle_ray.algos import algorithm_for
    from walle_ray.topology import parse_topology

    cfg = make_cfg(f"algo={algo}", "topology=local")
    cls, args, kwargs = algorithm_for(cfg.algo).sampler(cfg, parse_topology("local"), 0)
    sampler = cls(*args, **kwargs)
    assert cls is Sampler and isinstance(sampler.writer, FragmentWriter)
    assert sampler.writer.bootstrap_value == bootstrap


@pytest.mark.parametrize("space", ["box", "image"])
def test_policy_and_value_alone_match_the_forward_pass(space):
    import gymnasium as gym

    if space == "box":
        obs_space, act_space = gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (2,))
        obs = torch.randn(5, 3)
    else:
        obs_space, act_space = gym.spaces.Box(0, 255, (4, 42, 42), np.uint8), gym.spaces.Discrete(6)
        obs = torch.randint(0, 256, (5, 4, 42, 42), dtype=torch.uint8)
    model = make_actor_critic(obs_space, act_space, OmegaConf.structured(ModelConfig()), normalize_obs=True)
    assert model.separate_critic == (space == "box")  # a shared torso would run twice
    with torch.no_grad():
        params, value = model(obs)
        torch.testing.assert_close(model.policy(obs), params)
        torch.testing.assert_close(model.value(obs), value)


def test_concat_joins_along_envs():
    s = make_sampler()
    a, _ = s.collect()
    b, _ = s.collect()
    joined = concat_rollouts([a, b])
    joined.check()
    assert joined.obs_t.shape == (7, 4, 1) and joined.last_v.shape == (4,)
    assert joined.version_b.shape == (4,)
    row = joined.rows([2])
    row.check()
    np.testing.assert_array_equal(row.obs_t[:, 0], b.obs_t[:, 0])


def test_fifo_queue_is_bounded_and_ordered():
    m = FIFOQueue(capacity=2)
    assert m.put("a") and m.put("b") and not m.put("c")
    assert m.stats() == {"depth": 2, "capacity": 2, "dropped": 1}
    assert m.take(1) == ["a"] and m.take() == ["b"] and m.take() == []


def test_parameter_server_serves_only_newer_weights():
    ps = ParameterServer()
    assert ps.latest() is None
    ps.publish(1, "w1")
    assert ps.latest(-1) == (1, "w1") and ps.latest(1) is None
    ps.publish(0, "stale")
    assert ps.latest(0) == (1, "w1")


def test_running_norm_matches_numpy_over_batches():
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(1000, 4))
    norm = RunningNorm((4,))
    for chunk in np.split(data, 10):
        norm.update_from_moments(norm.moments(torch.from_numpy(chunk)))
    np.testing.assert_allclose(norm.mean.numpy(), data.mean(0), rtol=1e-4)
    np.testing.assert_allclose(norm.var.numpy(), data.var(0), rtol=1e-3)


def test_gaussian_policy_has_state_independent_log_std():
    import gymnasium as gym

    model = make_actor_critic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (2,)),
                              OmegaConf.structured(ModelConfig(log_std_init=-0.5)))
    params, v = model(torch.randn(5, 3))
    assert params.shape == (5, 4) and v.shape == (5,)
    assert torch.allclose(params[:, 2:], torch.full((5, 2), -0.5))


def counting_slot(fragment_length: int, index: int = 0):
    """A sampler process's slot: PPO's sampler on the counting env."""
    from walle_ray.actors.sampler import Sampler
    from walle_ray.runtime.remote import SlotSpec

    args = fragment_sampler_args(counting(), OmegaConf.structured(ModelConfig()), fragment_length,
                                 0.99, index, 0)
    return SlotSpec(Sampler, args)


def test_sampler_worker_pulls_published_weights(ray_session):
    from walle_ray.runtime.remote import RemoteParameterServer, RemoteSampler

    ray = ray_session
    ps = RemoteParameterServer.remote()
    worker = RemoteSampler.options(num_cpus=0.1).remote(ps, [counting_slot(4)])
    weights = make_sampler().policy.model.get_weights()
    ray.get(ps.publish.remote(7, [ray.put(weights)]))
    rollout_ref, stats_ref = worker.collect.remote()
    rollout, [stats] = ray.get([rollout_ref, stats_ref], timeout=60)
    assert (rollout.version_b == 7).all() and stats["env_steps"] == 8
    ray.kill(worker)
    ray.kill(ps)


def test_memory_and_parameter_server_processes_load_neither_torch_nor_envs(ray_session):
    """Their bodies live in a light module (``runtime/memory_worker.py``), so the processes
    that only hold fragments or a weights box stay small."""
    import sys

    from walle_ray.runtime.remote import RemoteAsyncMemory, RemoteParameterServer

    ray = ray_session
    loaded = lambda worker: {m for m in ("torch", "gymnasium") if m in sys.modules}  # noqa: E731
    actors = [RemoteParameterServer.options(num_cpus=0.1).remote(),
              RemoteAsyncMemory.options(num_cpus=0.1).remote({})]
    assert ray.get([a.__ray_call__.remote(loaded) for a in actors], timeout=60) == [set(), set()]
    for actor in actors:
        ray.kill(actor)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_pinned_sampler_runs_on_one_cpu_with_the_threads_it_starts(ray_session):
    """``pin=i`` puts sampler i on CPU i mod (its usable CPUs) before its env starts any
    threads, so they inherit it; Ray's own threads, already running, stay free."""
    from walle_ray.runtime.remote import RemoteParameterServer, RemoteSampler

    def _affinities(worker) -> tuple:
        """In the sampler actor's process: the CPU it pinned to, its main thread's CPUs, a
        thread started now's CPUs, and the CPUs of each thread that was already running."""
        import threading

        out = {}
        started = threading.Thread(target=lambda: out.setdefault("cpus", os.sched_getaffinity(0)))
        started.start()
        started.join()
        others = []
        for tid in os.listdir("/proc/self/task"):
            try:
                others.append(os.sched_getaffinity(int(tid)))
            except ProcessLookupError:  # a thread (one of Ray's) ended since the listing
                pass
        return worker.cpu, os.sched_getaffinity(0), out["cpus"], others

    ray = ray_session
    ps = RemoteParameterServer.remote()
    cpus = sorted(os.sched_getaffinity(0))
    workers = [RemoteSampler.options(num_cpus=0.1).remote(ps, [counting_slot(4)], pin=pin)
               for pin in (None, len(cpus) + 1)]
    try:
        free, pinned = ray.get([w.__ray_call__.remote(_affinities) for w in workers], timeout=60)
    finally:
        for handle in (*workers, ps):
            ray.kill(handle)
    assert free[0] is None and free[1] == set(cpus)
    want = {cpus[(len(cpus) + 1) % len(cpus)]}
    assert pinned[0] == next(iter(want)) and pinned[1] == want and pinned[2] == want
    if len(cpus) > 1:  # Ray's threads were started before the pin
        assert any(cpu_set == set(cpus) for cpu_set in pinned[3])


def test_streaming_sampler_takes_weights_asked_for_before_the_fragment_ended(ray_session):
    """In ``run``, a sampler asks for newer weights a few steps before a fragment ends and
    uses the answer for the next one, without a blocking pull; what was published before it
    asked is in that answer. A rebuilt sampler (version -1) pulls again."""
    from walle_ray.runtime.remote import RemoteParameterServer
    from walle_ray.runtime.sampler_worker import SamplerWorker

    ray = ray_session
    ps = RemoteParameterServer.remote()
    box = [ray.put(make_sampler().policy.model.get_weights())]
    ray.get(ps.publish.remote(1, box))
    worker = SamplerWorker(ps, [counting_slot(8)])
    fetches = []
    blocking_fetch = worker._fetch
    worker._fetch = lambda: (fetches.append(worker.version), blocking_fetch())

    def publish_then_ask():
        ray.get(ps.publish.remote(2, box))
        worker._ask()

    class Feed:  # the process's feed, asking ahead 2 steps before the end with ``ask``
        lead = 2

        def __init__(self, ask):
            self.ahead = ask

        def refresh(self, sampler):
            worker.refresh(sampler)

    def fragment(ask):
        return worker._slot(0).collect(Feed(ask))[0].version_b[0]

    assert fragment(publish_then_ask) == 1 and fetches == [-1]  # the first fragment pulls
    assert fragment(worker._ask) == 2 and fetches == [-1]  # from the answer: no pull
    assert fragment(worker._ask) == 2 and fetches == [-1]
    worker._slot(0).rebuild()  # as after an env failure: it takes the process's weights
    assert fragment(worker._ask) == 2 and fetches == [-1]


def test_a_sampler_process_gives_each_of_its_samplers_the_weights_it_pulled_once(ray_session):
    """A packed sampler process: its samplers keep their own envs and seeds, and all act with
    the newest weights the process fetched, without a round trip each."""
    from walle_ray.runtime.remote import RemoteParameterServer
    from walle_ray.runtime.sampler_worker import SamplerWorker

    ray = ray_session
    ps = RemoteParameterServer.remote()
    ray.get(ps.publish.remote(3, [ray.put(make_sampler().policy.model.get_weights())]))
    worker = SamplerWorker(ps, [counting_slot(4, index=i) for i in (1, 5)])
    fetches = []
    blocking_fetch = worker._fetch
    worker._fetch = lambda: (fetches.append(worker.version), blocking_fetch())
    *fragments, stats = worker.collect(3, None)
    assert [s["sampler"] for s in stats] == [1, 5] and fetches == [-1]
    assert all((f.version_b == 3).all() for f in fragments)
    assert [s.sampler.index for s in worker.slots] == [1, 5]


@pytest.mark.parametrize("space", ["discrete", "box"])
def test_fast_action_path_matches_the_distribution(space):
    import gymnasium as gym

    from walle_ray.models import make_action_head

    torch.manual_seed(0)
    if space == "discrete":
        head, params = make_action_head(gym.spaces.Discrete(3)), torch.tensor([[0.0, 1.0, 2.0]]).repeat(20000, 1)
    else:
        head = make_action_head(gym.spaces.Box(-1, 1, (2,)))
        params = torch.tensor([[0.5, -0.5, -1.0, 0.2]]).repeat(20000, 1)
    action, logp = head.act(params)
    torch.testing.assert_close(logp, head.dist(params).log_prob(action), rtol=1e-5, atol=1e-5)
    if space == "discrete":
        freq = torch.bincount(action, minlength=3).float() / len(action)
        torch.testing.assert_close(freq, torch.softmax(params[0], -1), atol=0.015, rtol=0)
    else:
        torch.testing.assert_close(action.mean(0), torch.tensor([0.5, -0.5]), atol=0.02, rtol=0)
        torch.testing.assert_close(action.std(0), torch.tensor([-1.0, 0.2]).exp(), atol=0.02, rtol=0)
    greedy, _ = head.act(params[:1], deterministic=True)
    torch.testing.assert_close(greedy, head.mode(params[:1]))


def test_episode_returns_are_plain_floats_even_when_the_env_gives_numpy_rewards():
    from walle_ray.envs.gym_vector import GymVectorEnv

    env = GymVectorEnv("Pendulum-v1", 2, max_episode_steps=3)  # numpy float rewards
    obs = env.reset(seed=0)
    buffers = (np.empty_like(obs), np.empty(2, np.float32), np.empty(2, bool), np.empty(2, bool))
    ended = None
    while ended is None:
        ended = env.step(np.zeros((2, 1), np.float32), *buffers)
    assert [type(r) for r in ended.episode_returns] == [float, float]

"""Two learners joined by gloo take the same steps as one learner on both batches joined."""

import re
import socket
import subprocess
import sys

import numpy as np
import pytest
import ray as ray_module
from omegaconf import OmegaConf

from walle_ray.algos.spec import fragment_sampler
from walle_ray.batch import Rollout, concat_rollouts
from walle_ray.envs import env_spaces
from walle_ray.algos import algorithm_for

from conftest import ROOT, make_cfg, make_learner


@ray_module.remote(num_cpus=0.1)
class PlainLearner:
    """A test's own Ray wrapper around the plain Learner role."""

    def __init__(self, cfg, obs_space, action_space):
        from walle_ray.algos import algorithm_for  # a Ray worker cannot import conftest

        self.learner = algorithm_for(cfg.algo).build_learner(cfg, obs_space, action_space)

    def address(self):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return "127.0.0.1", s.getsockname()[1]

    def join(self, address, port, rank, world):
        self.learner.join_group(address, port, rank, world)

    def train(self, batches):
        for batch in batches:
            self.learner.update([batch], env_steps=0)
        return self.learner.model.get_weights()


def test_two_learners_match_one_learner_on_the_joined_batches(ray_session):
    ray = ray_session
    cfg = make_cfg("algo=impala", "algo.optimizer=adam", "algo.lr=1e-2", "algo.max_grad_norm=1.0")
    obs_space, action_space = env_spaces(cfg.env)
    sampler = fragment_sampler(OmegaConf.to_object(cfg.env), OmegaConf.to_object(cfg.model), 8, 0.99, 0, 0)
    frags = [sampler.collect()[0] for _ in range(6)]
    a, b = frags[0::2], frags[1::2]  # three steps, each on 4 rows per learner

    single = make_learner(cfg, obs_space, action_space)
    for fa, fb in zip(a, b):
        single.update([concat_rollouts([fa, fb])], env_steps=0)

    pair = [PlainLearner.remote(cfg, obs_space, action_space) for _ in range(2)]
    address, port = ray.get(pair[0].address.remote())
    ray.get([lr.join.remote(address, port, rank, 2) for rank, lr in enumerate(pair)], timeout=120)
    w0, w1 = ray.get([pair[0].train.remote(a), pair[1].train.remote(b)], timeout=120)
    want = single.model.get_weights()
    for key in want:
        np.testing.assert_array_equal(w0[key], w1[key], err_msg=key)
        np.testing.assert_allclose(w0[key], want[key], rtol=1e-4, atol=1e-6, err_msg=key)
    moved = max(np.abs(want[k] - make_learner(cfg, obs_space, action_space).model.get_weights()[k]).max()
                for k in want)
    assert moved > 1e-3  # the updates did something
    for lr in pair:
        ray.kill(lr)


@pytest.mark.parametrize("model", [[], ["model.core=lstm", "model.burn_in=3"]])
def test_learners_that_take_uneven_shares_of_replay_clone_as_one(ray_session, model):
    """Two learners of 2 rows, a quarter of 4 fresh: one takes the fresh row with a replayed
    one, the other two replayed (``batch_counts``). Their all-reduced step, CLEAR's cloning
    included, and with burn-in the V-trace terms over the steps after it, is the one
    learner's on the 4 rows."""
    ray = ray_session
    # Adam's first step is the gradient's sign unless its epsilon outweighs the gradient.
    cfg = make_cfg("algo=impala", "algo.batch_size=4", "algo.optimizer=adam", "algo.lr=1",
                   "algo.eps=1", "algo.max_grad_norm=1000",
                   "algo.replay=[{type: queue, ratio: 0.25}, {type: uniform, ratio: 0.75}]",
                   "algo.clear_policy_coef=0.5", "algo.clear_value_coef=0.5", *model)
    obs_space, action_space = env_spaces(cfg.env)
    sampler = fragment_sampler(OmegaConf.to_object(cfg.env), OmegaConf.to_object(cfg.model), 4, 0.99, 0, 0)
    rows = sampler.collect()[0]
    noise = np.random.default_rng(0).normal(size=rows.dist_t.shape).astype(np.float32)
    rows = Rollout(**{**vars(rows), "replayed_b": np.array([1, 1, 0, 1], bool),
                      "dist_t": rows.dist_t + noise, "v_t": rows.v_t + 1.0})  # an older policy's
    single = make_learner(cfg, obs_space, action_space)
    single.update([rows], env_steps=0)
    pair = [PlainLearner.remote(cfg, obs_space, action_space) for _ in range(2)]
    address, port = ray.get(pair[0].address.remote())
    ray.get([lr.join.remote(address, port, rank, 2) for rank, lr in enumerate(pair)], timeout=120)
    w0, _ = ray.get([lr.train.remote([rows.rows(slice(2 * k, 2 * k + 2))])
                     for k, lr in enumerate(pair)], timeout=120)
    want = single.model.get_weights()
    for key in want:
        np.testing.assert_allclose(w0[key], want[key], rtol=1e-4, atol=1e-6, err_msg=key)
    for lr in pair:
        ray.kill(lr)


def replay_batches(obs_space, action_space, n: int, rows: int) -> list:
    """``n`` replay batches of random CartPole-shaped transitions."""
    from walle_ray.batch import ReplayBatch

    rng = np.random.default_rng(0)
    shape = (rows, *obs_space.shape)
    return [ReplayBatch(obs=rng.normal(size=shape).astype(np.float32),
                        action=rng.integers(0, action_space.n, rows),
                        reward=rng.normal(size=rows).astype(np.float32),
                        discount=np.full(rows, 0.99, np.float32),
                        next_obs=rng.normal(size=shape).astype(np.float32),
                        priority=np.full(rows, np.nan, np.float32),
                        version_b=np.zeros(rows, np.int64), weight=np.ones(rows, np.float32),
                        index=np.arange(k * rows, (k + 1) * rows))
            for k in range(n)]


def test_a_packed_learner_takes_the_steps_of_its_shards_all_reduced(ray_session):
    """One learner process for two shards (``topology.pack``) learns from a batch of each per
    update, with the config ``packed_learner`` gives it: the same weights as two learners
    joined by gloo, for IMPALA, PPO (whose minibatches double) and DQN (replay batches).
    Both sides compute with one torch thread (a Ray actor of 0.1 CPU gets one), so that their
    sums add up in the same order: Adam turns the last bits of a near-zero gradient into
    steps of the learning rate's size."""
    import torch

    ray = ray_session
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        check_packed_against_a_pair(ray)
    finally:
        torch.set_num_threads(threads)


def check_packed_against_a_pair(ray) -> None:
    cases = {
        "impala": make_cfg("algo=impala", "algo.optimizer=adam", "algo.lr=1e-2",
                           "algo.max_grad_norm=1.0"),
        "ppo": make_cfg("algo=ppo", "algo.lr=1e-2", "algo.epochs=2", "algo.minibatch_size=16",
                        "algo.normalize_advantages=false", "~preset"),
        "dqn": make_cfg("algo=dqn", "algo.lr=1e-2", "algo.target_update_every=1", "~preset"),
    }
    for name, cfg in cases.items():
        obs_space, action_space = env_spaces(cfg.env)
        if name == "dqn":
            frags = replay_batches(obs_space, action_space, 4, rows=16)
        else:
            sampler = fragment_sampler(OmegaConf.to_object(cfg.env),
                                       OmegaConf.to_object(cfg.model), 4, 0.99, 0, 0)
            frags = [sampler.collect()[0] for _ in range(4)]  # 16 rows each
        a, b = frags[0::2], frags[1::2]

        packed = make_learner(cfg, obs_space, action_space, shards=2)
        for fa, fb in zip(a, b):
            packed.update([fa, fb], env_steps=0)

        pair = [PlainLearner.remote(cfg, obs_space, action_space) for _ in range(2)]
        address, port = ray.get(pair[0].address.remote())
        ray.get([lr.join.remote(address, port, rank, 2) for rank, lr in enumerate(pair)],
                timeout=120)
        w0, _ = ray.get([pair[0].train.remote(a), pair[1].train.remote(b)], timeout=120)
        want = packed.model.get_weights()
        for key in want:
            np.testing.assert_allclose(w0[key], want[key], rtol=1e-4, atol=1e-6,
                                       err_msg=f"{name} {key}")
        for lr in pair:
            ray.kill(lr)


def test_learners_that_share_a_gpu_are_found():
    from walle_ray.runtime.role_setup import shares_a_gpu

    assert not shares_a_gpu([[("n1", "0")], [("n1", "1")], [("n2", "0")]])
    assert shares_a_gpu([[("n1", "0")], [("n1", "0")]])  # learner.num_gpus=0.5
    assert shares_a_gpu([[("n1", "0"), ("n1", "1")], [("n1", "1"), ("n1", "2")]])
    assert not shares_a_gpu([[], []])  # CPU learners


def test_a_learners_state_is_plain_cpu_tensors():
    """What the driver gets for a checkpoint: no device of the learner's in it."""
    import torch

    from walle_ray.learners.learner import to_cpu

    cfg = make_cfg("algo=impala")
    learner = make_learner(cfg)
    state = learner.state_dict()
    tensors = []

    def walk(tree):
        if isinstance(tree, torch.Tensor):
            tensors.append(tree)
        elif isinstance(tree, dict):
            for v in tree.values():
                walk(v)
        elif isinstance(tree, (list, tuple)):
            for v in tree:
                walk(v)
    walk(state)
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    assert set(state) == {"model", "update", "version"}
    nested = to_cpu({"a": [torch.zeros(2), (torch.ones(1), 3)], "b": "x"})
    assert isinstance(nested["a"][1], tuple) and nested["a"][1][1] == 3 and nested["b"] == "x"


def test_one_update_is_the_same_however_many_learners_share_it():
    """``algo.batch_size`` (and PPO's ``algo.minibatch_size``) count the rows of a whole
    update: with L learners each memory serves its learner 1/L of them, and a learner
    process holding all L shards makes the very step one learner makes on all the rows."""
    from walle_ray.algos.dqn import APEX
    from walle_ray.algos.impala import IMPALA
    from walle_ray.algos import validate
    from walle_ray.config import ConfigError

    one = make_cfg("algo=impala", "algo.batch_size=8", "algo.optimizer=adam", "algo.lr=1e-2",
                   "topology=2a1m1l")
    four = make_cfg("algo=impala", "algo.batch_size=8", "algo.optimizer=adam", "algo.lr=1e-2",
                    "topology.spec=8a4m4l")
    assert IMPALA.memory(one, 0)[1][1] == 8 and IMPALA.memory(four, 3)[1][1] == 2
    obs_space, action_space = env_spaces(one.env)
    sampler = fragment_sampler(OmegaConf.to_object(one.env), OmegaConf.to_object(one.model),
                               8, 0.99, 0, 0)
    rows = concat_rollouts([sampler.collect()[0] for _ in range(2)])  # 8 rows
    single = make_learner(one, obs_space, action_space)
    packed = make_learner(four, obs_space, action_space, shards=4)
    single.update([rows], env_steps=0)
    packed.update([rows.rows(slice(2 * k, 2 * k + 2)) for k in range(4)], env_steps=0)
    want = single.model.get_weights()
    for key, value in packed.model.get_weights().items():
        np.testing.assert_allclose(value, want[key], rtol=1e-5, atol=1e-7, err_msg=key)

    # A quarter fresh over 4 learners of 2 rows: their memories deal the 2 fresh rows in turn.
    mix = make_cfg("algo=impala", "algo.batch_size=8", "topology.spec=8a4m4l",
                   "algo.replay=[{type: queue, ratio: 0.25}, {type: uniform, ratio: 0.75}]")
    memories = [cls(*args, **kwargs) for cls, args, kwargs in (IMPALA.memory(mix, j) for j in range(4))]
    assert [memory.counts for memory in memories] == [[0, 2], [0, 2], [1, 1], [1, 1]]

    # PPO: a learner of two takes half of each minibatch; one process for both, all of it.
    ppo = make_cfg("algo=ppo", "algo.minibatch_size=64", "topology.spec=4a2m2l")
    ppo_algo = algorithm_for(ppo.algo)
    assert ppo_algo.learner(ppo, 1)[1][0].algo.minibatch_size == 32
    assert ppo_algo.learner(ppo, 2)[1][0].algo.minibatch_size == 64
    # Replay shards serve their learner its share of the transitions.
    apex = make_cfg("algo=apex", "algo.batch_size=512", "topology.spec=8a4m4l")
    assert APEX.memory(apex, 0)[1][1] == 128
    with pytest.raises(ConfigError, match="do not split evenly across 3 learners"):
        validate(make_cfg("algo=impala", "algo.batch_size=8", "topology.spec=6a3m3l"))


# Two learners of one gloo group: rank 1 dies once the group has formed, and rank 0 reduces.
PEER_DIES = """
import os, sys, torch
from walle_ray.learners.collective import GroupLost, TorchCollective
rank, port = int(sys.argv[1]), int(sys.argv[2])
group = TorchCollective("127.0.0.1", port, rank, 2, "gloo", timeout_s=60)
if rank == 1:
    os._exit(0)
try:
    group.all_reduce_sum(torch.ones(3))
except GroupLost as exc:
    print("GroupLost:", exc, flush=True)
os._exit(0)
"""


def test_a_reduction_whose_peer_died_raises_group_lost():
    """What gloo raises when a learner of the group has died is the group's loss, for the
    driver to rebuild (``runtime/fleet.py``, ``role_failed``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", PEER_DIES, str(rank), str(port)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    try:
        out, err = procs[0].communicate(timeout=120)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert re.search(r"^GroupLost: \w+: ", out, re.MULTILINE), (out, err[-2000:])


def test_only_a_failed_transport_is_the_groups_loss():
    """A reduction's own error (a tensor on the wrong device, out of memory) is the
    learner's, raised as it was; a peer gone or a reduction never joined is ``GroupLost``."""
    from walle_ray.learners.collective import GroupLost, _group_call

    for text in ["[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:20900: Connection "
                 "reset by peer.", "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
                 "120000ms for recv operation to complete"]:
        with pytest.raises(GroupLost, match=r"^RuntimeError: \[gloo"):
            with _group_call():
                raise RuntimeError(text)
    for own in [RuntimeError("Tensors must be CUDA and dense"),
                RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")]:
        with pytest.raises(RuntimeError) as raised:
            with _group_call():
                raise own
        assert raised.value is own

"""Replay-based algorithms end to end: a priority round trip through a Ray memory actor,
and DQN, TD3 and Ape-X through the real command line."""

import re

import numpy as np
import pytest

from walle_ray.batch import Priorities, Transitions
from walle_ray.buffers.prioritized import PrioritizedReplay

from conftest import run_cli
from test_impala import records


def transitions(n: int, start: int = 0) -> Transitions:
    obs = np.arange(start, start + n, dtype=np.float32)[:, None]
    return Transitions(obs=obs, action=np.zeros(n, np.int64), reward=np.ones(n, np.float32),
                       discount=np.full(n, 0.99, np.float32), next_obs=obs + 1,
                       priority=np.ones(n, np.float32), version_b=np.zeros(n, np.int64))


def test_priorities_round_trip_through_a_ray_memory_actor(ray_session):
    from walle_ray.runtime.remote import RemoteAsyncMemory

    ray = ray_session
    memory = RemoteAsyncMemory.options(num_cpus=0.1).remote(
        {3: (PrioritizedReplay, (64, 16), dict(learning_starts=16, alpha=1.0, seed=0))})
    ray.get(memory.put.remote(transitions(32), 3))
    batch = ray.get(memory.sample.remote(3))
    assert batch.obs.shape == (16, 1) and np.allclose(batch.weight, 1.0)  # equal priorities
    # One transition gets almost all the priority; the shard serves mostly it afterwards.
    favourite = int(batch.index[0])
    new = np.where(batch.index == favourite, 1000.0, 1e-3).astype(np.float32)
    assert ray.get(memory.feedback.remote(Priorities(batch.index, new), 3)) == 16
    again = ray.get(memory.sample.remote(3))
    assert (again.index == favourite).mean() > 0.8
    assert again.weight[again.index == favourite].max() < 0.1  # importance weights correct for it
    stats = ray.get(memory.stats.remote())[3]
    assert stats["inserted"] == 32 and stats["sampled"] == 32 and stats["priority_updates"] == 16
    ray.kill(memory)


def test_apex_smoke_run_through_ray_with_two_shards(tmp_path):
    # Long enough that the learner's feedback reaches both shards before the last record,
    # also where learner 0 serves the weights on 2 CPUs and its first updates come later.
    out = run_cli("algo=apex", "env=cartpole", "topology=2a2m1l", "algo.learning_starts=200",
                  "algo.capacity=2000", "algo.batch_size=32", "run.total_env_steps=6000",
                  "memory.checkpoint=true", "logger.progress=line",
                  f"hydra.run.dir={tmp_path}").stdout
    last = records(tmp_path)[-1]
    assert "stopped (budget)" in out and last["env_steps"] >= 6000
    assert last["updates"] > 0 and last["dropped_fragments"] == 0
    for k in (0, 1):
        assert last[f"memory/{k}/size"] > 0 and last[f"memory/{k}/mean_priority"] > 0
        assert last[f"memory/{k}/priority_updates"] > 0
    assert (tmp_path / "checkpoints" / "last.pt").exists()
    ev = run_cli("mode=eval", f"run.checkpoint={tmp_path}/checkpoints/last.pt", "eval.episodes=2",
                 f"hydra.run.dir={tmp_path}/eval").stdout
    assert "eval CartPole-v1: 2 episodes" in ev
    # The shards were snapshotted with the checkpoint; a resumed run starts with them full.
    held = sum(last[f"memory/{k}/size"] for k in (0, 1))  # samplers may add a little after it
    out = run_cli(f"run.resume={tmp_path}", "run.total_env_steps=7000").stdout
    restored = re.search(r"replay restored: (\d+) transitions in 2 memories", out)
    assert restored and held <= int(restored.group(1)) <= 4000, out  # 2 shards of 2000
    assert records(tmp_path)[-1]["env_steps"] >= 7000


def test_apex_on_pong_keeps_frames_once_through_a_checkpoint(tmp_path):
    pong = ["algo=apex", "env=pong", "topology=1a1m1l", "env.envs_per_sampler=2",
            "algo.fragment_length=16", "algo.learning_starts=64", "algo.capacity=1024",
            "algo.batch_size=16", "memory.checkpoint=true", "logger.progress=line",
            "run.report_every_s=2"]
    out = run_cli(*pong, "run.total_env_steps=1200", f"hydra.run.dir={tmp_path}").stdout
    assert re.search(r"image torso in (bfloat16|float32) \(model\.bf16=auto; this CPU: ", out), out
    last = records(tmp_path)[-1]
    assert "stopped (budget)" in out and last["updates"] > 0
    held, frames = last["memory/0/size"], last["memory/0/frames"]
    # Two envs' streams: about one new frame per transition, not the 8 of two 4-frame stacks.
    assert 0 < frames <= 1.5 * held
    assert last["memory/0/obs_bytes"] < 2 * held * 4 * 42 * 42 / 4
    out = run_cli(f"run.resume={tmp_path}", "run.total_env_steps=1600").stdout
    assert re.search(r"replay restored: \d+ transitions in 1 memory", out), out
    assert records(tmp_path)[-1]["env_steps"] >= 1600


@pytest.mark.slow
@pytest.mark.parametrize("algo,env,target", [("dqn", "cartpole", 475), ("td3", "pendulum", -200)])
def test_learns_to_the_target_return(tmp_path, algo, env, target):
    # Each stops once the windowed mean return reaches the target, or at its preset's budget
    # (TD3: 20k steps; it reaches -200 near 10k).
    out = run_cli(f"algo={algo}", f"env={env}", "topology=local", "logger.progress=line",
                  f"run.stop_at_return={target}", f"hydra.run.dir={tmp_path}", timeout=600).stdout
    assert records(tmp_path)[-1]["return"] >= target, out[-2000:]

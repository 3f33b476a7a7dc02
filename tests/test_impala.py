"""IMPALA end to end: the async CLI through memories to two learners, a sampler killed and
restarted, and CartPole learned to 475."""

import json
import time

import pytest

from walle_ray.algos.impala import IMPALA
from walle_ray.envs import env_spaces
from walle_ray.runtime.ray_fleet import RayFleet
from walle_ray.topology import parse_topology, plan_resources

from conftest import make_cfg, run_cli

COUNTING = ["algo=impala", "env.id=walle/Counting-v0", "env.name=counting", "+env.kwargs.length=10",
            "env.envs_per_sampler=2", "algo.batch_size=4", "algo.fragment_length=5",
            "run.report_every_s=1", "logger.progress=line"]


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_async_cli_runs_through_memories_to_two_learners(tmp_path):
    out = run_cli(*COUNTING, "topology=2a2m2l", "run.total_env_steps=3000", "run.max_wall_s=60",
                  f"hydra.run.dir={tmp_path}").stdout
    assert "stopped (budget)" in out
    recs = records(tmp_path)
    last = recs[-1]
    assert last["updates"] > 0 and last["env_steps_consumed"] > 0
    assert all(r["dropped_fragments"] == 0 for r in recs)
    assert any("learn/policy_loss" in r for r in recs) and "memory/1/queue_size" in last
    assert last["return"] == pytest.approx(10.0)  # every counting episode pays 1 for 10 steps
    assert (tmp_path / "checkpoints" / "last.pt").is_file()


def test_async_run_without_a_parameter_server_gets_weights_from_the_training_learner(tmp_path):
    # Learner 0 serves the weights (0p) on a thread of its own while it trains; the samplers
    # once waited for each long train call to end, and the run crawled.
    out = run_cli(*COUNTING, "topology=2a1m1l0p", "run.total_env_steps=3000", "run.max_wall_s=60",
                  f"hydra.run.dir={tmp_path}").stdout
    assert "stopped (budget)" in out
    recs = records(tmp_path)
    assert recs[-1]["updates"] > 0
    assert max(r["policy_lag_max"] for r in recs) < 40  # the samplers kept getting new weights


def test_killed_sampler_is_restarted_and_the_run_goes_on(ray_session):
    ray = ray_session
    cfg = make_cfg("algo=impala", "algo.batch_size=8", "algo.updates_per_call=2")
    topo = parse_topology("2a1m1l")
    obs_space, action_space = env_spaces(cfg.env)
    fleet = RayFleet(cfg, IMPALA, topo, obs_space, action_space, plan_resources(topo, 2), 120)
    try:
        fleet.start()
        seen_after_kill = set()
        killed = False
        deadline = time.monotonic() + 120
        updates = 0
        while time.monotonic() < deadline:
            step = fleet.step(0)
            reports, learned = step.reports, step.learned
            updates += sum(m["updates"] for m in learned)
            if not killed and updates >= 4:
                ray.kill(fleet.samplers[0], no_restart=False)
                killed = True
            elif killed:
                seen_after_kill |= {r["sampler"] for r in reports}
                if 0 in seen_after_kill and fleet.faults["sampler_restarts"] == 1:
                    break
        assert killed and fleet.faults["sampler_restarts"] == 1
        assert 0 in seen_after_kill  # the restarted sampler delivers fragments again
        assert fleet.faults["lost_fragments"] == cfg.algo.fragments_per_call
    finally:
        fleet.shutdown()


@pytest.mark.slow
def test_impala_learns_cartpole_to_475(tmp_path):
    # Asynchronous timing makes the step count vary (about 160k to 370k over seeds), so the
    # budget leaves room; the run stops as soon as the mean return reaches 475.
    out = run_cli("algo=impala", "env=cartpole", "topology=4a1m1l", "logger.progress=line",
                  "run.total_env_steps=1500000", f"hydra.run.dir={tmp_path}", timeout=600).stdout
    assert records(tmp_path)[-1]["return"] >= 475, out[-2000:]
    assert "stopped (return)" in out

"""The Ray fleet against the in-process one, and two learners kept identical by all-reduce."""

import numpy as np
import pytest

from walle_ray.algos import algorithm_for
from walle_ray.algos.ppo import fragment_length
from walle_ray.envs import env_spaces
from walle_ray.runtime.fleet import LocalFleet
from walle_ray.runtime.ray_fleet import RayFleet
from walle_ray.topology import parse_topology, plan_resources

from conftest import make_cfg

TINY = ["algo.batch_size=128", "algo.minibatch_size=32", "algo.epochs=2"]


def build(cfg, spec, ray_session=None):
    topo = parse_topology(spec)
    obs_space, action_space = env_spaces(cfg.env)
    algo = algorithm_for(cfg.algo)
    if topo.local:
        return LocalFleet(cfg, algo, topo, obs_space, action_space)
    plan = plan_resources(topo, cluster_cpus=2)
    return RayFleet(cfg, algo, topo, obs_space, action_space, plan, timeout_s=120)


def test_fragment_length_fills_the_batch():
    cfg = make_cfg("algo.batch_size=1000", "env.envs_per_sampler=4")
    assert fragment_length(cfg, parse_topology("4a1m1l")) == 63  # ceil(1000 / 16)


@pytest.mark.parametrize("spec", ["local", "3a2m1l"])
def test_iterations_move_versions_and_steps(ray_session, spec):
    cfg = make_cfg(*TINY)
    fleet = build(cfg, spec)
    try:
        fleet.start()
        for it in range(2):
            step = fleet.step(0)
            stats, (learn,) = step.reports, step.learned
            assert all(s["policy_version"] == it for s in stats)
            assert learn["version"] == it + 1 and learn["policy_lag_max"] == 0
        assert sum(s["env_steps"] for s in stats) >= 128
    finally:
        fleet.shutdown()


@pytest.mark.parametrize("spec", ["local", "3a2m1l"])
def test_overlap_learns_one_version_behind(ray_session, spec):
    """algo.overlap: the batch learned in iteration k+1 was collected while iteration k
    learned, with the weights before that update, so from the second iteration on the
    policy lag is exactly 1; on Ray, the samplers are at work as each update returns."""
    cfg = make_cfg(*TINY, "algo.overlap=true")
    fleet = build(cfg, spec)
    try:
        fleet.start()
        behaviour, lags = [], []
        for _ in range(4):
            step = fleet.step(0)
            (learn,) = step.learned
            behaviour.append({s["policy_version"] for s in step.reports})
            lags.append((learn["policy_lag_mean"], learn["policy_lag_max"]))
            if spec != "local":
                assert len(fleet.calls.pending) == len(fleet.samplers)  # the next batch, under way
        assert behaviour == [{0}, {0}, {1}, {2}]
        assert lags == [(0, 0), (1, 1), (1, 1), (1, 1)]
    finally:
        fleet.shutdown()


@pytest.mark.parametrize("core", [[], ["model.core=lstm", "model.core_size=8"]], ids=["mlp", "lstm"])
def test_two_learners_hold_identical_weights(ray_session, core):
    ray = ray_session
    cfg = make_cfg(*TINY, "env=halfcheetah", "model.hidden=[16]", *core)  # obs norm and reward scale too
    fleet = build(cfg, "3a2m2l")  # learner 0 reads two samplers' data, learner 1 one
    try:
        fleet.start()
        for _ in range(3):
            fleet.step(0)
        states = ray.get([lr.state_dict.remote() for lr in fleet.learners])
        a, b = states[0]["model"], states[1]["model"]
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(a[key].numpy(), b[key].numpy(), rtol=1e-6, atol=1e-7,
                                       err_msg=key)
        assert not np.allclose(a["obs_norm.mean"].numpy(), 0)  # statistics were updated
        opt_a = states[0]["update"]["optimizer"]["state"][0]["exp_avg"]
        opt_b = states[1]["update"]["optimizer"]["state"][0]["exp_avg"]
        np.testing.assert_allclose(opt_a.numpy(), opt_b.numpy(), rtol=1e-6, atol=1e-8)
    finally:
        fleet.shutdown()


def torch_before_ray():
    """A function for ``__ray_call__`` (local, so it is sent by value: workers cannot import
    this test module): whether the actor's process imported torch before ray."""
    def probe(_actor) -> bool:
        import sys

        names = list(sys.modules)
        return names.index("torch") < names.index("ray")
    return probe


@pytest.mark.parametrize("preload", [True, False])
def test_samplers_and_learners_import_torch_before_joining_ray(ray_session, preload):
    """With run.ray_preload (the default) sampler and learner processes import torch before
    Ray's worker script connects (their loops ran 10-15% faster that way); without it, after."""
    ray = ray_session
    fleet = build(make_cfg(*TINY, f"run.ray_preload={preload}"), "1a1m1l")
    try:
        roles = [*fleet.samplers, *fleet.learners]
        assert ray.get([r.__ray_call__.remote(torch_before_ray()) for r in roles]) == [preload] * 2
    finally:
        fleet.shutdown()


def test_preload_falls_back_to_the_nodes_python(ray_session):
    """A node that keeps Python elsewhere than the driver still starts the actor."""
    from walle_ray.runtime.preload import worker_runtime_env

    ray = ray_session

    @ray.remote(num_cpus=0.1)
    class Probe:
        pass

    probe = Probe.options(runtime_env=worker_runtime_env(executable="/nonexistent/bin/python")).remote()
    try:
        assert ray.get(probe.__ray_call__.remote(torch_before_ray()), timeout=120)
    finally:
        ray.kill(probe)


def test_preload_leaves_jobs_that_choose_their_interpreter_alone():
    from walle_ray.runtime.preload import worker_runtime_env

    assert worker_runtime_env(False) is None
    for field in ({"pip": ["gymnasium"]}, {"conda": "rl"}, {"py_executable": "python3"}):
        assert worker_runtime_env(job_env=field) is None
    assert "-c" in worker_runtime_env(job_env={"working_dir": ".", "env_vars": {"A": "1"}})["py_executable"]


class Recorded:
    """A memory serving fragments recorded beforehand, as a dataset memory would."""

    free_running = True

    def __init__(self, fragments):
        self.fragments = fragments

    def has_room(self, item):
        return False

    def can_sample(self):
        return True

    def sample(self):
        return self.fragments[0]

    def stats(self):
        return {}


def test_a_fleet_without_samplers_learns_from_its_memories(monkeypatch):
    """``0a1m1l`` for an algorithm whose memories read a dataset: no sampler is built, and
    the learner updates on what the memory serves."""
    import dataclasses

    from walle_ray.algos.spec import fragment_sampler
    from walle_ray.runtime import fleet as fleet_module

    cfg = make_cfg("algo=impala", "algo.fragment_length=8", "algo.batch_size=2", "topology=local")
    sampler = fragment_sampler(cfg.env, cfg.model, 8, 0.99)
    recorded = [sampler.collect()[0].rows([0, 1])]
    sampler.close()
    reader = dataclasses.replace(algorithm_for(cfg.algo), reads_dataset=True,
                                 memory_spec=lambda algo, cfg, k: (Recorded, (recorded,), {}))
    fleet = fleet_module.LocalFleet(cfg, reader, parse_topology("0a1m1l"), *env_spaces(cfg.env))
    try:
        fleet.start()
        step = fleet.step(0)
        assert fleet.samplers == [] and step.reports == []
        assert len(step.learned) == cfg.algo.updates_per_call
        assert fleet.learner.version == cfg.algo.updates_per_call
    finally:
        fleet.shutdown()


def test_learner_processes_are_called_again_together():
    """An asynchronous fleet calls a learner process again only once every learner process's
    call has ended: one called alone would wait in its first all-reduce for the others, and
    a checkpoint's state request queued behind it would wait for a call the driver has not
    made (a deadlock until the group's timeout)."""
    from types import SimpleNamespace

    fleet = RayFleet.__new__(RayFleet)  # the step's bookkeeping alone, no Ray
    fleet.sync, fleet.learners, fleet.idle_learners = False, [object(), object()], set()
    fleet.packing = SimpleNamespace(learners=[[0, 1], [2, 3]])
    called, ended = [], []
    fleet._call_learner = lambda j, env_steps: called.append(j)
    fleet._call_sampler = lambda p: None
    fleet._finished = lambda timeout_s: [ended.pop(0)] if ended else []
    ended.append(("learner", 0, {"updates": 8}, None))
    assert len(fleet.step(0).learned) == 1 and called == []  # learner 1's call is still on
    assert fleet.step(0).learned == [] and called == []
    ended.append(("learner", 1, {"updates": 8}, None))
    step = fleet.step(0)
    assert step.learned[0]["learner"] == "2,3" and called == [0, 1]
    ended.append(("sampler", 0, [{"env_steps": 20}], None))
    assert len(fleet.step(0).reports) == 1 and called == [0, 1]


def test_the_stall_watch_looks_once_every_role_is_built():
    """A role still in its constructor cannot answer the stall watch: ``start`` waits until
    every learner, memory and the parameter server answers before the watch may look."""
    from types import SimpleNamespace

    class Handle:
        def __init__(self, name):
            self.where = SimpleNamespace(remote=lambda: name)

    fleet = RayFleet.__new__(RayFleet)
    fleet.sync, fleet.running, fleet.algo = True, False, SimpleNamespace(reads_dataset=False)
    fleet.learners, fleet.memories, fleet.ps = [Handle("l0"), Handle("l1")], [Handle("m0")], Handle("ps")
    waited = []
    fleet.calls = SimpleNamespace(get=lambda refs, role: waited.append((refs, fleet.running)))
    fleet.publish = lambda: waited.append(("publish", fleet.running))
    fleet.start()
    assert waited == [(["l0", "l1", "m0", "ps"], False), ("publish", True)]


def test_a_fleet_whose_role_stalled_waits_on_it_no_more():
    """Once a learner or memory was found stalled, the final checkpoint's request fails at
    once (the run keeps its last checkpoint) instead of finding the same stall again."""
    from types import SimpleNamespace

    from walle_ray.runtime.fleet import RoleDied
    from walle_ray.runtime.ray_calls import Calls

    fleet = RayFleet.__new__(RayFleet)
    fleet.calls = Calls(None, 60.0, None, lambda: None)
    fleet.calls.stalled = "learner-0"
    fleet.learners = [SimpleNamespace(state_dict=SimpleNamespace(remote=lambda: "ref"))]
    with pytest.raises(RoleDied, match="learner-0 stalled"):
        fleet.learner_state()


@pytest.mark.parametrize("algo, spec", [("impala", "6a2m2l"), ("ppo", "4a2m2l")])
def test_a_packed_topology_runs_its_logical_roles_in_fewer_processes(tmp_path, algo, spec):
    """On 2 CPUs, PPO's 4a2m2l runs as 2 sampler processes of 2 samplers each and one learner
    process for both shards (its learners take the fragments directly); IMPALA's 6a2m2l as 2
    sampler processes whose 3 samplers step 4 envs together (one sampler's), one memory
    process and one learner process. Every logical sampler reports, none is
    silent, and the run learns."""
    import json

    from conftest import run_cli

    extra = (["run.report_every_s=1", "run.total_env_steps=30000"] if algo == "impala"
             else ["algo.batch_size=256", "algo.minibatch_size=32", "run.total_env_steps=2048"])
    out = run_cli(f"algo={algo}", f"topology={spec}", "run.ray_num_cpus=2", "~preset",
                  "logger.progress=line", f"hydra.run.dir={tmp_path}", *extra, timeout=240).stdout
    if algo == "impala":
        assert ("6 samplers in 2 processes (3 each), 2 memories in 1 process (2 each), "
                "2 learners in 1 process (2 each), the parameter server in learner process 0 "
                "(topology.pack=auto)") in out
        assert "the 3 samplers of a sampler process step 4 envs together: 8 envs in all" in out
    else:
        assert ("4 samplers in 2 processes (2 each), 2 learners in 1 process (2 each), "
                "the parameter server in learner process 0 (topology.pack=auto)") in out
        assert "step together" not in out
    assert "stopped (budget)" in out
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["env_steps"] >= 2048 and records[-1]["faults/sampler_restarts"] == 0
    assert any(r.get("updates", r.get("learn/policy_loss")) for r in records)
    assert (tmp_path / "checkpoints" / "last.pt").is_file()
    if algo == "impala":
        report = json.loads((tmp_path / "report.json").read_text())
        samplers = report["samplers"]["per_sampler"]
        assert [s["index"] for s in samplers] == list(range(6))
        # each fragment of a process: 4 envs' steps shared by its 3 samplers (in turn: 4 each)
        steps = make_cfg("algo=impala", "~preset").algo.fragment_length
        assert all(s["fragments"] > 0 and abs(s["env_steps"] / s["fragments"] - 4 * steps / 3) < 1
                   for s in samplers), samplers
        assert sum(s["env_steps"] for s in samplers) == report["run"]["env_steps"]
        assert not report["silent_samplers"] and report["run"]["envs"] == 8  # 4 a process
        assert {int(k) for k in report["totals"]["memories"]} == {0, 1}


@pytest.mark.parametrize("overrides, spec, threads", [
    (["algo=ppo"], "8a1m1l", 2),  # the samplers wait while it learns: their CPU too
    (["algo=ppo", "algo.overlap=true"], "8a1m1l", 1),  # they collect while it learns
    (["algo=ppo"], "8a2m2l", 1),  # two learner processes share the samplers' CPU
    (["algo=impala"], "8a1m1l", 1),  # asynchronous: samplers never wait for it
])
def test_a_learner_takes_the_idle_samplers_cpus_in_a_synchronous_loop(overrides, spec, threads):
    from walle_ray.runtime.role_setup import learner_threads
    from walle_ray.topology import plan_packing

    topo = parse_topology(spec)
    plan = plan_resources(topo, cluster_cpus=2)
    cfg = make_cfg(*overrides)
    assert learner_threads(cfg, algorithm_for(cfg.algo), plan_packing(topo, 2, "off"), plan) == threads


@pytest.mark.parametrize("spec, cpus, learner_cpus, threads", [
    ("32a4m4l", 2, None, 1),  # 4 shards in one process: one update's rows, one learner's CPU
    ("32a4m4l", 8, None, 1),  # 2 processes of 2 shards
    ("8a2m2l", 2, None, 1),
    ("2a1m1l", 2, None, 1),  # one shard: its own CPU
    ("32a4m4l", 64, None, 1),  # a CPU for every role: one process per shard
    ("32a4m4l", 8, 3.0, 3),  # more CPUs asked for (topology.learner_cpus)
])
def test_an_asynchronous_learner_runs_the_threads_of_its_cpus(spec, cpus, learner_cpus, threads):
    """A packed process's update takes the rows one learner's would (``algo.batch_size`` is
    the whole update's), so it runs the threads of the CPUs it asked for, not one per shard."""
    from walle_ray.runtime.role_setup import learner_threads
    from walle_ray.topology import plan_packing

    topo = parse_topology(spec)
    packing = plan_packing(topo, cpus, "auto")
    plan = plan_resources(packing.processes(topo), cluster_cpus=cpus, learner_cpus=learner_cpus)
    cfg = make_cfg("algo=impala")
    assert learner_threads(cfg, algorithm_for(cfg.algo), packing, plan) == threads


def test_envs_that_crowd_the_cpus_get_a_note_at_start():
    """32a4m4l's 256 Pong envs on 2 CPUs each play a game in minutes: the run says its return
    reports late; the same topology on a cluster of 32 CPUs, or 2a1m1l on 2, says nothing."""
    from walle_ray.runtime.start import crowded_envs

    note = crowded_envs(32, 8, 2)
    assert note.startswith("256 envs (32 samplers x 8) share 2 CPUs") and "report late" in note
    assert note.endswith("8 samplers or fewer report sooner")
    assert crowded_envs(32, 8, 32) is None and crowded_envs(2, 8, 2) is None
    assert crowded_envs(0, 8, 2) is None  # no samplers (offline learning)


def test_samplers_that_step_together_say_so_at_start():
    """32a4m4l's IMPALA on 2 CPUs steps 16 envs, not 256 (``topology.lanes``): the run says
    how many each sampler process steps; 2a1m1l, each of whose processes runs one sampler,
    PPO, and IMPALA with topology.lanes=false say nothing of it."""
    from walle_ray.runtime.start import lanes_note
    from walle_ray.topology import plan_packing

    def note(spec: str, cpus: int, *overrides: str):
        cfg = make_cfg("algo=impala", "env=pong", f"topology={spec}", *overrides)
        topo = parse_topology(spec)
        return lanes_note(cfg, algorithm_for(cfg.algo), topo, plan_packing(topo, cpus))

    assert note("32a4m4l", 2) == (
        "the 16 samplers of a sampler process step 8 envs together: 16 envs in all, so their "
        "episodes end as often as fewer samplers' would (env.envs_per_sampler=8 holds where a "
        "process runs one sampler; topology.lanes=false keeps it everywhere)")
    assert note("32a4m4l", 64) is None  # a process per sampler
    assert note("2a1m1l", 2) is None and note("32a4m4l", 2, "topology.lanes=false") is None
    assert note("32a4m4l", 2, "algo=ppo") is None
    assert "the 7 samplers of a sampler process step 8 envs together: 40 envs" in note(
        "32a4m4l", 5)  # processes of 7, 7, 6, 6 and 6 samplers, 8 envs each


def test_a_learner_of_several_threads_prefers_the_node_with_the_most_cpus(monkeypatch):
    """topology=auto plans a learner's threads for the biggest node: learners ask for the
    nodes with the most CPUs, in order; not where they run one thread, hold GPUs, or the
    user placed them with topology.resources."""
    from walle_ray.runtime import ray_init
    from walle_ray.runtime.role_setup import learner_nodes, node_preference

    nodes = {"small": {"Resources": {"CPU": 1.0}}, "big": {"Resources": {"CPU": 16.0}},
             "head": {"Resources": {}}, "mid": {"Resources": {"CPU": 4.0}}}
    monkeypatch.setattr(ray_init, "live_nodes", lambda: nodes)
    cfg = make_cfg("algo=impala", "env=cartpole")
    assert learner_nodes(cfg, threads=6, count=2, gpus=0) == ["big", "mid"]
    assert learner_nodes(cfg, threads=6, count=4, gpus=0) == ["big", "mid", "small", None]
    assert learner_nodes(cfg, threads=1, count=2, gpus=0) == [None, None]
    assert learner_nodes(cfg, threads=6, count=1, gpus=1) == [None]
    cfg.topology.resources = {"learner": {"walle_learner": 1}}
    assert learner_nodes(cfg, threads=6, count=1, gpus=0) == [None]
    monkeypatch.setattr(ray_init, "live_nodes", lambda: {"one": {"Resources": {"CPU": 2.0}}})
    assert learner_nodes(make_cfg("algo=impala", "env=cartpole"), 6, 1, 0) == [None]
    # Soft, and placed elsewhere when the node has no room now (not waiting for it).
    node = "ab" * 28  # a node id as Ray writes them
    preference = node_preference(node)
    assert preference.node_id == node and preference.soft and preference._spill_on_unavailable
    assert node_preference(None) == "DEFAULT"


def test_a_learner_told_the_loop_is_over_stops_waiting_for_batches(monkeypatch):
    """At the end of a run the samplers stop, and a learner's ``train`` call waits for
    batches that will not come. ``stop_waiting`` (``Run._close``, on the learner's watch
    thread) ends that wait within one slice, so the final checkpoint's ``state_dict`` is not
    held up by the wait's timeout; without it the wait runs to its deadline."""
    from types import SimpleNamespace

    from walle_ray.runtime import learner_worker

    clock = {"now": 0.0, "waits": []}
    worker = learner_worker.LearnerWorker.__new__(learner_worker.LearnerWorker)
    asks = []
    source = SimpleNamespace(shards=[0], keys=[0], ask=lambda: asks.append(1) or "ref")
    worker.sources, worker.inflight, worker.held, worker.prefetch = [source], [], [[]], 1
    worker.stopping = False

    def wait(refs, num_returns, timeout):  # nothing is ever served
        clock["waits"].append(timeout)
        clock["now"] += timeout
        if len(clock["waits"]) == stop_after:
            worker.stopping = True  # as the watch thread sets it
        return [], refs

    # the module's own names, not the global modules other threads use
    monkeypatch.setattr(learner_worker, "ray", SimpleNamespace(wait=wait))
    monkeypatch.setattr(learner_worker, "time", SimpleNamespace(perf_counter=lambda: clock["now"]))
    stop_after = 3
    assert worker._next_batches(timeout_s=2.0) == [None]
    assert len(clock["waits"]) == 3 and max(clock["waits"]) <= 0.1 and clock["now"] < 0.5
    assert worker._next_batches(timeout_s=2.0) == [None]  # told: no wait, and nothing asked
    assert len(clock["waits"]) == 3 and len(asks) == 1
    clock["waits"].clear()
    worker.stopping, stop_after = False, None  # never told: it waits out its 2 s
    assert worker._next_batches(timeout_s=2.0) == [None]
    assert clock["now"] > 2.29 and len(clock["waits"]) >= 20

"""Faults survived: envs that raise or kill their sampler process, under PPO and IMPALA;
non-finite losses skipped or stopped."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli

FAULTS = [[0, 100], [1, 300], [0, 500]]  # (sampler, step within its process)


def last_record(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


class EndedCalls:
    """Ray, as far as ``Calls`` asks it: the calls named in ``ended`` have ended with their
    value (an exception: raised), and every other call never ends."""

    def __init__(self, ended: dict):
        import ray

        self.exceptions = ray.exceptions
        self.ended = ended

    def wait(self, refs, num_returns, timeout):
        ready = [r for r in refs if r in self.ended]
        return ready, [r for r in refs if r not in ready]

    def get(self, ref):
        if isinstance(ref, list):
            return [self.get(r) for r in ref]
        if ref not in self.ended:
            raise AssertionError(f"{ref} is not ready")
        if isinstance(self.ended[ref], BaseException):
            raise self.ended[ref]
        return self.ended[ref]


# Each kind of fault and each kind of loop once: a synchronous and an asynchronous run share
# the sampler-death path (SamplerRestarts.died) and the env-fault path (RestartingSampler).
@pytest.mark.parametrize("algo,how", [("ppo", "raise"), ("impala", "exit")])
def test_injected_sampler_faults_cost_a_fragment_each_and_the_run_finishes(tmp_path, algo, how):
    run_dir = tmp_path / "run"
    # Long enough that the last fault (in a restarted process) is seen before the budget ends.
    extra = (["algo.batch_size=512", "algo.epochs=1", "run.total_env_steps=12000"] if algo == "ppo"
             else ["run.report_every_s=1", "run.total_env_steps=60000"])
    out = run_cli(f"algo={algo}", "topology=2a1m1l", "env=cartpole", "env.id=walle/Faulty-v0",
                  f"+env.kwargs={{faults: {FAULTS}, how: {how}}}",
                  "run.stop_at_return=null", "logger.progress=line", f"hydra.run.dir={run_dir}",
                  *extra, timeout=240).stdout
    assert "stopped (budget)" in out
    record = last_record(run_dir)
    assert record["env_steps"] >= int(extra[-1].split("=")[1])
    assert record["faults/sampler_restarts"] == len(FAULTS)
    assert len(FAULTS) <= record["faults/lost_fragments"] <= 4 * len(FAULTS)


def test_a_sampler_that_always_fails_stops_the_run_with_a_message(tmp_path):
    faults = [[0, step] for step in range(1, 400)]  # every step of sampler 0, even after restarts
    proc = run_cli("topology=local", "env=cartpole", "env.id=walle/Faulty-v0",
                   f"+env.kwargs={{faults: {faults}}}", "run.total_env_steps=4096",
                   f"hydra.run.dir={tmp_path / 'run'}", check=False, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "env failed 3 times in a row" in proc.stderr and "Traceback" not in proc.stderr
    assert (tmp_path / "run" / "checkpoints" / "last.pt").is_file()


@pytest.mark.parametrize("algo,victim", [("impala", "walle/learner-0"), ("impala", "walle/memory-0"),
                                         ("ppo", "walle/learner-0")])
def test_a_dead_learner_or_memory_is_rebuilt_from_the_last_checkpoint(ray_session, tmp_path,
                                                                      algo, victim):
    import threading
    import time

    from conftest import make_cfg
    from walle_ray.runtime.train import train

    run_dir = tmp_path / "run"
    budget = 40_000 if algo == "impala" else 8192
    cfg = make_cfg(f"algo={algo}", "topology=2a1m1l", f"run.total_env_steps={budget}",
                   "run.stop_at_return=null", "run.report_every_s=0.5", "run.checkpoint_every=2",
                   "logger.progress=off", "logger.ray_metrics=false",
                   *(["algo.batch_size=512", "algo.epochs=1"] if algo == "ppo" else []))
    killed = []

    def kill_after_first_checkpoint():
        deadline = time.monotonic() + 60
        while not (run_dir / "checkpoints" / "last.pt").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        ray_session.kill(ray_session.get_actor(victim))
        killed.append(time.monotonic())

    threading.Thread(target=kill_after_first_checkpoint, daemon=True).start()
    result = train(cfg, run_dir)
    assert killed and result.stopped_by == "budget"
    assert result.counters["restarts"] == 1 and result.counters["env_steps"] >= budget
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["env_steps"] for r in records]
    assert steps == sorted(steps)
    assert records[-1]["faults/role_restarts"] == 1


def test_a_rebuilt_fleet_counts_its_sampler_deaths_on_from_the_last_fleets():
    """After a rebuild the new fleet's counters go on from the last fleet's, and a sampler
    that dies in the new fleet is counted there (its restarts count into the fleet's own
    dict, which the carried counts must join rather than replace)."""
    from walle_ray.runtime.fleet import carry_faults, new_faults
    from walle_ray.runtime.ray_fleet import RayFleet
    from walle_ray.runtime.sampler_restarts import SamplerRestarts

    fleet = RayFleet.__new__(RayFleet)
    fleet.faults = new_faults()
    fleet.restarts = SamplerRestarts(["walle/sampler-0"], [(1, 4)], fleet.faults)
    carry_faults(fleet, {"sampler_restarts": 2, "lost_fragments": 8, "stalls": 1}, 1)
    fleet.restarts.died(0, OSError("Broken pipe"))
    assert fleet.faults == {"sampler_restarts": 3, "lost_fragments": 12, "stalls": 1,
                            "role_restarts": 1}


def test_an_object_lost_with_a_node_rebuilds_the_roles():
    """A role whose call failed because an object it read was lost with a process or node is
    a RoleDied, which the driver answers by rebuilding; an error of its own fails the run."""
    import ray

    from walle_ray.runtime.fleet import RoleDied, lost_an_object, role_failed

    lost = ray.exceptions.RayTaskError("run", "tb", ray.exceptions.OwnerDiedError("ab" * 20, "x", ""))
    own = ray.exceptions.RayTaskError("run", "tb", ValueError("bad obs"))
    assert lost_an_object(lost) and lost_an_object(ray.exceptions.ObjectLostError("ab" * 20, "x", ""))
    assert not lost_an_object(own)
    assert isinstance(role_failed("sampler-0", lost), RoleDied)
    assert not isinstance(role_failed("sampler-0", own), RoleDied)


def test_a_sampler_that_loses_its_node_is_a_death_and_one_that_keeps_dying_fails_the_run():
    """A sampler call that fails with Ray's bare OSError (its node's raylet gone, the process
    about to go with it) is a death: counted, the process asked again once Ray restarted it.
    A sampler's own error fails the run, and so do more than MAX_DEATHS deaths in a row."""
    import errno
    from types import SimpleNamespace

    import ray

    from walle_ray.actors.restart import SamplerFailed
    from walle_ray.runtime.fleet import RoleDied, RoleFailed, lost_its_node, new_faults, role_failed
    from walle_ray.runtime.ray_calls import Calls
    from walle_ray.runtime.ray_fleet import RayFleet
    from walle_ray.runtime.sampler_restarts import SamplerRestarts

    def raised(where: str, error: BaseException, method: str = "run"):
        """Ray's wrapper of ``error``, raised in ``where`` (the traceback's last frame)."""
        trace = ("Traceback (most recent call last):\n"
                 '  File "python/ray/_raylet.pyx", line 1897, in ray._raylet.execute_task\n'
                 '  File "/home/ray/lib/python3.11/site-packages/walle_ray/runtime/'
                 'sampler_worker.py", line 235, in run\n    ray.get(ref)\n'
                 f'  File "{where}", line 571, in call\n{type(error).__name__}: {error}')
        return ray.exceptions.RayTaskError(method, trace, error)

    node_gone = raised("python/ray/_raylet.pyx", OSError("Broken pipe"))  # a frame Ray hides
    assert lost_its_node(node_gone)
    assert lost_its_node(raised("/usr/lib/python3/dist-packages/ray/actor.py", OSError("Broken pipe")))
    own = raised("/usr/lib/python3.11/ctypes/__init__.py", OSError(
        "libGL.so.1: cannot open shared object file: No such file or directory"))
    for error in (own, raised("/site-packages/walle_ray/actors/restart.py", SamplerFailed("env")),
                  raised("/home/ray/my_envs/arm.py", OSError("the arm does not answer")),
                  raised("/site-packages/ray/_private/worker.py", OSError(errno.ENOSPC, "full")),
                  raised("/site-packages/h5py/_hl/files.py", FileNotFoundError(2, "no file"))):
        assert not lost_its_node(error) and not isinstance(role_failed("memory-0", error), RoleDied)
    # a learner or sampler whose memory lost its node: the memory's error, in Ray's wrapper
    wrapped = raised("python/ray/_raylet.pyx", node_gone.as_instanceof_cause(), "train")
    assert isinstance(role_failed("learner-0", wrapped), RoleDied)
    assert "learner-0 lost its node: OSError" in str(role_failed("learner-0", node_gone))
    assert lost_its_node(wrapped) and not lost_its_node(wrapped, nested=False)

    forgot, called = [], []
    fleet = RayFleet.__new__(RayFleet)  # the bookkeeping of ended calls alone
    fleet.watch, fleet.faults = None, new_faults()
    fleet.restarts = SamplerRestarts(["walle/sampler-0", "walle/sampler-1,3"], [(1, 4), (2, 4)],
                                     fleet.faults, forgot.append)
    fleet.restarts.ASK_AFTER_S = 0.0
    fleet.samplers = [None, SimpleNamespace(ready=SimpleNamespace(remote=lambda: "ready-1"))]
    fleet._call_sampler = called.append
    ended = EndedCalls({"run-0": [{"sampler": 0}], "run-1": node_gone, "ready-1": True})
    fleet.calls = Calls(ended, 60.0, fleet.restarts, lambda: None)
    fleet.calls.pending = {"run-0": ("sampler", 0, None), "run-1": ("sampler", 1, None)}
    done = fleet._finished(0.1)
    assert [d[:2] for d in done] == [("sampler", 0)]
    assert fleet.faults["sampler_restarts"] == 2 and fleet.faults["lost_fragments"] == 4
    assert forgot == ["walle/sampler-1,3"] and fleet.restarts.restarting() == {"walle/sampler-1,3"}
    assert fleet._finished(0.1) == [] and called == [1] and not fleet.restarts  # back, called

    fleet.calls.ray.ended["run-1"] = own  # the library that would not load
    fleet.calls.pending = {"run-1": ("sampler", 1, None)}
    with pytest.raises(RoleFailed, match="sampler-1 failed: OSError: libGL") as failed:
        fleet._finished(0.1)
    assert not isinstance(failed.value, RoleDied)
    fleet.calls.ray.ended["run-1"] = wrapped  # the memory's node went: a rebuild, not this death
    fleet.calls.pending = {"run-1": ("sampler", 1, None)}
    with pytest.raises(RoleDied, match="sampler-1 lost a role it was using, with its node"):
        fleet._finished(0.1)
    for _ in range(SamplerRestarts.MAX_DEATHS - 1):  # one death was counted above
        fleet.restarts.died(1, node_gone)
    with pytest.raises(RoleFailed, match=r"sampler-1,3 keeps dying \(OSError: Broken pipe\)"):
        fleet.restarts.died(1, node_gone)


def test_a_learner_whose_group_broke_is_a_death_and_no_wait_outlasts_a_failed_learner():
    """A reduction that failed (``GroupLost``: another learner died or did not join) is a
    RoleDied, which the driver answers by rebuilding. A wait on one learner (its state for a
    checkpoint, behind a call held in the group's reduction) ends as soon as another
    learner's call in flight has failed, with that failure, not at run.role_timeout_s; and a
    role that lost another role is named as alive, however Ray's error is also the cause's
    class."""
    import time

    import ray

    from walle_ray.learners.collective import GroupLost
    from walle_ray.runtime.fleet import RoleDied, new_faults, role_failed
    from walle_ray.runtime.ray_calls import Calls
    from walle_ray.runtime.sampler_restarts import SamplerRestarts

    broke = ray.exceptions.RayTaskError("train", "tb", GroupLost("RuntimeError: Timed out"))
    assert isinstance(role_failed("learner-0", broke), RoleDied)
    assert "learner-0 lost its learner group: RuntimeError: Timed out" in str(
        role_failed("learner-0", broke))

    # what ray.get raises for a call whose role lost its memory: RayTaskError(ActorDiedError)
    lost_memory = ray.exceptions.RayTaskError("run", "tb", ray.exceptions.ActorDiedError())
    lost_memory = lost_memory.as_instanceof_cause()
    assert isinstance(lost_memory, ray.exceptions.RayActorError)

    # learner 0's state ("state-0") never comes; learner 1's call has failed
    faults = new_faults()
    restarts = SamplerRestarts(["walle/sampler-0"], [(1, 4)], faults, lambda _: None)
    calls = Calls(EndedCalls({"train-1": lost_memory}), 2.0, restarts, lambda: None)
    calls.pending = {"train-0": ("learner", 0, None), "train-1": ("learner", 1, None),
                     "run-0": ("sampler", 0, None)}
    t0 = time.monotonic()
    with pytest.raises(RoleDied, match="learner-1 lost a role it was using: ActorDiedError"):
        calls.get("state-0", "learner-0 (state for checkpoint)")
    assert time.monotonic() - t0 < 1.5
    assert "train-1" not in calls.pending  # raised once: the call is done with

    # a sampler whose memory died is not a sampler death to restart, but a rebuild
    calls.ray = EndedCalls({"run-0": lost_memory})
    calls.pending = {"run-0": ("sampler", 0, None)}
    with pytest.raises(RoleDied, match="sampler-0 lost a role it was using: ActorDiedError"):
        list(calls.ended(0.1))
    assert faults["sampler_restarts"] == 0
    named = ray.exceptions.RayActorError(None, "The actor died unexpectedly before finishing "
                                         "this task.\n\tclass_name: X\n\tname: walle/memory-0")
    assert "sampler-0 lost a role it was using (walle/memory-0): " in str(
        role_failed("sampler-0", ray.exceptions.RayTaskError("run", "tb", named)))

    # one it cannot reach for now: called again, as after a death
    unreachable = ray.exceptions.RayTaskError("run", "tb", ray.exceptions.ActorUnavailableError(
        "The actor is temporarily unavailable: RpcError", None)).as_instanceof_cause()
    calls.ray = EndedCalls({"run-0": unreachable})
    calls.pending = {"run-0": ("sampler", 0, None)}
    assert list(calls.ended(0.1)) == [] and faults["sampler_restarts"] == 1
    # one that Ray will not start again (its constructor failed): a rebuild
    init_failed = ray.exceptions.ActorDiedError(
        ray.exceptions.RayTaskError("__init__", "tb", ValueError("no weights source")))
    calls.ray = EndedCalls({"ready-0": init_failed})
    calls.pending = {"ready-0": ("restarted", 0, None)}
    with pytest.raises(RoleDied, match="sampler-0 could not start again"):
        list(calls.ended(0.1))

"""Stalled roles: a process whose own work makes no progress for ``run.stall_s`` is named,
its threads' stacks are written to ``<run dir>/stalls/``, and it is restarted like a dead
one; the run completes."""

from __future__ import annotations

import json
import threading
import time

import pytest

from conftest import run_cli


def test_the_pulse_counts_own_work_and_not_waits_for_other_roles():
    from walle_ray.pulse import Pulse

    pulse = Pulse()
    assert pulse.progress()["stuck_s"] == 0.0 and not pulse.progress()["started"]
    with pulse.working(), pulse.waiting("memories"):  # a call that found nothing to learn from
        pass
    assert not pulse.progress()["started"]  # still starting: its first update is ahead
    with pulse.working():
        time.sleep(0.05)
        assert pulse.progress()["stuck_s"] >= 0.05  # no step of progress since the call began
        pulse.beat()
        assert pulse.progress()["stuck_s"] < 0.05
        with pulse.waiting("a memory"):
            time.sleep(0.05)
            assert pulse.progress() | {"host": 0, "pid": 0} == {
                "stuck_s": 0.0, "started": False, "waiting_on": "a memory", "host": 0, "pid": 0}
        assert pulse.progress()["stuck_s"] < 0.05  # the wait ended: the clock starts again
    assert pulse.progress()["stuck_s"] == 0.0 and pulse.progress()["started"]  # idle
    pulse.begin_again()  # envs made again
    assert not pulse.progress()["started"]


def test_the_stacks_name_the_line_a_thread_hangs_on():
    from walle_ray.pulse import thread_stacks

    stop = threading.Event()

    def stuck_in_user_code():
        stop.wait(30)

    thread = threading.Thread(target=stuck_in_user_code, name="env-thread")
    thread.start()
    try:
        text = thread_stacks()
    finally:
        stop.set()
        thread.join()
    assert "Thread env-thread" in text and "in stuck_in_user_code" in text
    assert "stop.wait(30)" in text


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def stall_files(run_dir, role: str) -> list:
    return sorted((run_dir / "stalls").glob(f"{role}-*.txt"))


STALL = ["run.stall_s=4", "run.stall_start_s=60", "run.stop_at_return=null",
         "logger.progress=line"]


@pytest.mark.parametrize("algo,topology,role", [
    ("ppo", ["topology=2a1m1l", "topology.pack=off", "algo.batch_size=512", "algo.epochs=1",
             "run.total_env_steps=8192"], "sampler-0"),
    # The other process goes on sampling, each env step 2 ms long however fast the CPU: at
    # about 500 steps/s it reaches the budget some 12 s after the hang, whose stall is found
    # 5-7 s after it. The hang comes after the process's first call has ended, so its limit
    # is run.stall_s, not run.stall_start_s.
    ("impala", ["topology=4a1m1l", "topology.pack=2", "run.report_every_s=1",
                "run.total_env_steps=10000"], "sampler-1,3")])
def test_a_sampler_whose_env_hangs_is_restarted_and_the_run_completes(tmp_path, algo, topology,
                                                                      role):
    """In a sampler process of its own (synchronous PPO) and in a packed one (IMPALA,
    two samplers a process, dealt 0,2 and 1,3): an env step of the role's first sampler
    never returns."""
    run_dir = tmp_path / "run"
    victim = role.split("-")[1].split(",")[0]
    fault = (f"faults: [[{victim}, 600]]" if algo == "ppo" else
             f"faults: [[{victim}, 1200]], base_id: walle/Sleep-v0, step_s: 0.002")
    proc = run_cli(f"algo={algo}", "env=cartpole", "env.id=walle/Faulty-v0",
                   f"+env.kwargs={{{fault}, how: hang}}", *topology, *STALL,
                   f"hydra.run.dir={run_dir}", timeout=300)
    assert "stopped (budget)" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"walle_ray: {role} stalled: its own work made no progress" in proc.stderr
    (stack,) = stall_files(run_dir, role)
    text = stack.read_text()
    assert "in hang_forever" in text and "time.sleep(1.0)" in text, text
    last = records(run_dir)[-1]
    assert last["faults/stalls"] == 1 and last["faults/sampler_restarts"] >= 1
    report = json.loads((run_dir / "report.json").read_text())
    assert report["faults"]["stalls"] == 1 and "1 stalled role found" in proc.stdout


def test_a_learner_whose_network_hangs_is_rebuilt_and_the_run_completes(tmp_path, on_path):
    run_dir = tmp_path / "run"
    proc = run_cli("algo=impala", "env=cartpole", "topology=2a1m1l",
                   "model._target_=my_pkg.nets:HangingActorCritic", "+model.kwargs={hang_at: 30}",
                   "run.total_env_steps=30000", "run.report_every_s=1", "run.checkpoint_every=5",
                   *STALL, f"hydra.run.dir={run_dir}", env=on_path, timeout=300)
    assert "stopped (budget)" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "walle_ray: learner-0 stalled" in proc.stderr
    assert "rebuilding the roles from the last checkpoint" in proc.stderr
    (stack,) = stall_files(run_dir, "learner-0")
    text = stack.read_text()
    assert "in hang_forever" in text and "HangingActorCritic" not in stack.name, text
    assert "nets.py" in text  # the user's forward that called it
    last = records(run_dir)[-1]
    assert last["faults/stalls"] == 1 and last["faults/role_restarts"] == 1


def test_without_the_watch_samplers_step_on_their_main_thread(tmp_path, on_path):
    run_dir = tmp_path / "run"
    proc = run_cli("algo=impala", "topology=2a1m1l", "env.entry_point=my_pkg.envs:MainThreadCorridor",
                   "run.stall_s=null", "run.total_env_steps=4000", "run.stop_at_return=null",
                   f"hydra.run.dir={run_dir}", env=on_path, timeout=240)
    assert "stopped (budget)" in proc.stdout and "env failed" not in proc.stderr, proc.stderr[-2000:]


def test_a_memory_snapshot_leaves_the_event_loop_free_and_holds_its_puts():
    """A large replay takes a while to copy for a checkpoint: the memory process's event
    loop, which answers the stall watch, goes on meanwhile; a fragment put during the copy
    goes in after it, so the snapshot is of one moment."""
    import asyncio
    import time

    from walle_ray.runtime.memory_worker import AsyncMemoryWorker

    class SlowToCopy:
        def __init__(self):
            self.rows, self.copying = [], False

        def has_room(self, item):
            return True

        def put(self, item):
            assert not self.copying, "put while the snapshot was being copied"
            self.rows.append(item)

        def state_dict(self):
            self.copying = True
            time.sleep(0.6)
            self.copying = False
            return {"rows": list(self.rows)}

    async def main():
        worker = AsyncMemoryWorker({0: (SlowToCopy, (), {})})
        await worker.put("a", 0)
        ticks = []

        async def tick():
            for _ in range(40):
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.02)

        ticking = asyncio.create_task(tick())
        await asyncio.sleep(0.05)
        snapshot = asyncio.create_task(worker.state_dict())
        await asyncio.sleep(0.1)
        await worker.put("b", 0)  # waits for the copy
        await ticking
        return await snapshot, worker.memories[0].rows, max(b - a for a, b in zip(ticks, ticks[1:]))

    states, rows, longest_gap = asyncio.run(main())
    assert states == {0: {"rows": ["a"]}} and rows == ["a", "b"]
    assert longest_gap < 0.3

"""Time and cost to a score (``run.milestones``): on a constructed metrics stream, and in one
short run; the progress line's rate and ETA without start-up."""

from __future__ import annotations

import io
import json

import pytest

from walle_ray.logging.metrics import Progress, ReturnWindow
from walle_ray.bottleneck import build_report, new_totals
from walle_ray.report import cost_line
from walle_ray.runtime import milestones as ms
from walle_ray.runtime.milestones import CostMeter, Milestones, milestone_targets


class FakeFleet:
    """Two role processes whose CPU seconds grow by ``step`` at each usage call; process
    ``b`` dies after ``dies_after`` calls (it answers nothing more)."""

    def __init__(self, step: float = 36.0, dies_after: int = 10**9):
        self.calls, self.step, self.dies_after = 0, step, dies_after

    def ask_usage(self) -> list:
        self.calls += 1
        answers = [{"process": "n:1", "cpu_s": self.step * self.calls, "gpu_s": 0.0}]
        if self.calls <= self.dies_after:
            answers.append({"process": "n:2", "cpu_s": 2 * self.step * self.calls, "gpu_s": 0.0})
        return answers

    def usage_answers(self, asked: list, timeout_s: float) -> tuple[list, list]:
        return asked, []


@pytest.fixture
def clock(monkeypatch):
    """The driver's own CPU seconds and the seconds since the command started, set by hand."""
    now = {"cpu": 0.0, "since": 0.0}
    monkeypatch.setattr(ms.time, "process_time", lambda: now["cpu"])
    monkeypatch.setattr(ms, "since_start", lambda: now["since"])
    return now


def stream(hook, window, returns_per_record, steps_per_record=1000, clock=None):
    """Feed the hook one record per entry: that record's new episode returns."""
    out = []
    for i, returns in enumerate(returns_per_record, 1):
        window.add(returns, [100] * len(returns))
        if clock is not None:
            clock["since"] = 60.0 * i
        out.append(hook({"env_steps": steps_per_record * i, "return": window.mean}))
    return out


def test_each_milestone_is_recorded_once_when_the_full_window_first_reaches_it(clock):
    counters: dict = {}
    window = ReturnWindow(4)
    fleet = FakeFleet()
    hook = Milestones([0.0, 10.0, 17.0], counters, lambda: fleet, window)
    # Record 1: a lucky 20 in a window not yet full counts for nothing; record 2 fills the
    # window with a mean of 5; record 4's mean is 12.75; none reaches 17.
    records = stream(hook, window, [[20], [0, 0, 0], [10, 10], [21, 20], [-21, 0]], clock=clock)
    assert [k for k in records[0] if k.startswith("milestones/")] == []
    assert records[1]["milestones/0/agent_steps"] == 2000
    assert records[1]["milestones/0/minutes"] == pytest.approx(2.0)
    assert "milestones/10/minutes" not in records[2]  # mean 5: below 10
    assert records[3]["milestones/10/agent_steps"] == 4000
    assert not any(k.startswith("milestones/0/") for k in records[3])  # once only
    assert set(counters["milestones"]) == {"0", "10"}
    assert counters["milestones"]["10"]["minutes"] == pytest.approx(4.0)


def test_core_hours_add_every_process_and_the_driver_and_keep_a_dead_ones(clock):
    counters: dict = {}
    window = ReturnWindow(1)
    fleet = FakeFleet(step=360.0, dies_after=1)
    hook = Milestones([1.0], counters, lambda: fleet, window)
    clock["cpu"] = 720.0  # the driver's own CPU time
    record = stream(hook, window, [[5]])[0]
    # measure(): one usage round at the crossing (the first call): 360 + 720 + the driver's 720
    assert record["milestones/1/core_hours"] == pytest.approx((360 + 720 + 720) / 3600)
    hook.meter.measure(fleet)  # the second process died: its last answer still counts
    assert hook.meter.core_s == pytest.approx(720 + 720 + 720)
    hook.keep_totals()
    assert counters["core_s"] == pytest.approx(2160)


def test_a_resumed_run_adds_the_minutes_and_hours_of_the_runs_before_it(clock):
    counters = {"milestones": {"0": {"minutes": 3.0, "agent_steps": 10, "core_hours": 0.1,
                                     "gpu_hours": 0.0}},
                "command_s": 600.0, "core_s": 3600.0}
    window = ReturnWindow(1)
    hook = Milestones([0.0, 10.0], counters, lambda: FakeFleet(step=0.0), window)
    record = stream(hook, window, [[15]], clock=clock)[0]
    assert "milestones/0/minutes" not in record  # reached in the run before
    assert record["milestones/10/minutes"] == pytest.approx(11.0)  # 600 s before + 60 s now
    assert record["milestones/10/core_hours"] == pytest.approx(1.0)


def test_a_resume_that_stops_at_once_still_adds_its_minutes(tmp_path):
    """A run that reached its return, resumed, stops before any iteration; the minutes and
    core-hours it spent starting are the run's too, so its checkpoint keeps them."""
    import torch

    import walle_ray

    common = dict(topology="local", env={"id": "walle/Counting-v0", "envs_per_sampler": 4},
                  algo={"batch_size": 64, "minibatch_size": 32, "epochs": 1},
                  logger={"progress": "off"},
                  run={"stop_at_return": 10, "return_window": 4, "total_env_steps": 640})
    walle_ray.train(run_dir=tmp_path, **common)

    def totals():
        counters = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["counters"]
        return counters["iterations"], counters["command_s"], counters["core_s"]

    iterations, command_s, core_s = totals()
    result = walle_ray.train(run_dir=tmp_path, **{**common, "run": {**common["run"],
                                                                   "resume": str(tmp_path)}})
    assert result.stopped_by == "return"
    after = totals()
    assert after[0] == iterations and after[1] > command_s and after[2] > core_s


def test_stop_at_return_is_always_a_milestone():
    class Run:
        milestones = [17, 0, 10]
        stop_at_return = 19.5
    assert milestone_targets(Run) == [0.0, 10.0, 17.0, 19.5]


def test_the_meter_asks_without_waiting_and_at_most_one_call_in_flight():
    class Slow(FakeFleet):
        def usage_answers(self, asked, timeout_s):
            return [], asked  # nothing ever answers
    fleet = Slow()
    meter = CostMeter()
    meter.ask(fleet, every_s=0.0)
    meter.ask(fleet, every_s=0.0)
    assert fleet.calls == 1


def test_the_report_and_its_line_show_the_milestones_and_the_cost():
    counters = {"env_steps": 2_410_000, "command_s": 840.0, "core_s": 1584.0,
                "milestones": {"17": {"minutes": 13.2, "agent_steps": 2_410_000,
                                      "core_hours": 0.44, "gpu_hours": 0.0},
                               "0": {"minutes": 8.0, "agent_steps": 1_500_000,
                                     "core_hours": 0.3, "gpu_hours": 0.0}}}
    meta = {"algo": "impala", "env": "pong", "topology": "2a1m1l", "loop": "async",
            "learners": 1, "feeders": [2]}
    report = build_report(new_totals(), meta, counters)
    assert report["cost"] == {"minutes": 14.0, "core_hours": 0.44, "gpu_hours": 0.0}
    line = report["summary"].splitlines()[-1]
    assert line == ("walle_ray: time and cost: reached 0 after 8.0 min, 1.50M agent steps, "
                    "0.30 core-hours; reached 17 after 13.2 min, 2.41M agent steps, 0.44 "
                    "core-hours; the run: 14.0 min, 0.44 core-hours")
    assert cost_line({}, {"minutes": 0.5, "core_hours": 0.0123}) == (
        "no milestone reached; the run: 0.5 min, 0.012 core-hours")


def test_the_progress_rate_and_eta_leave_start_up_out():
    out = io.StringIO()
    progress = Progress("x", 100_000, mode="line", every_s=0.0, stream=out)
    # 30 s of start-up bring the first 1000 steps; then 4000 steps/s.
    progress.update({"iteration": 1, "env_steps": 1000, "wall_s": 30.0, "env_steps_per_s": 33.3,
                     "return": 10.0, "collect_share": 0.5, "learn_share": 0.5})
    progress.update({"iteration": 2, "env_steps": 41_000, "wall_s": 40.0, "env_steps_per_s": 4000,
                     "return": 20.0, "collect_share": 0.5, "learn_share": 0.5,
                     "milestones/10/minutes": 0.7})
    first, second = out.getvalue().splitlines()
    assert "— steps/s" in first and "ETA ?" in first
    assert "4.0k steps/s" in second and "ETA 0:14" in second  # 59k steps at 4000/s
    assert second.endswith("| reached 10 at 0.7 min")


@pytest.mark.slow
def test_a_short_run_records_its_milestone_in_every_place(tmp_path):
    """CartPole with a milestone it passes early: the metrics record, report.json, the
    closing line and the counters of the checkpoint all carry it."""
    import subprocess
    import sys

    import torch

    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "walle_ray", "topology=local", "run.milestones=[30]",
         "run.total_env_steps=20000", "run.stop_at_return=null", f"hydra.run.dir={run_dir}"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "walle_ray: reached 30 after " in proc.stdout
    assert "walle_ray: time and cost: reached 30 after" in proc.stdout
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    crossed = [r for r in records if "milestones/30/agent_steps" in r]
    assert len(crossed) == 1 and crossed[0]["return"] >= 30
    assert all(r["core_hours"] > 0 for r in records)
    report = json.loads((run_dir / "report.json").read_text())
    assert report["milestones"]["30"]["agent_steps"] == crossed[0]["milestones/30/agent_steps"]
    assert report["cost"]["core_hours"] >= crossed[0]["core_hours"]
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert "30" in ckpt["counters"]["milestones"] and ckpt["counters"]["core_s"] > 0


def test_the_window_says_whether_returns_would_reach_a_target():
    window = ReturnWindow(3, [1.0, 1.0])
    assert not window.reaches(1.0, [])  # not full
    assert window.reaches(1.0, [1.0]) and not window.reaches(1.0, [0.0])
    assert window.reaches(2.0, [4.0, 2.0, 0.0]) and not window.reaches(2.0, [4.0, 0.0, 1.0])
    assert list(window.returns) == [1.0, 1.0]  # asking adds nothing


@pytest.mark.parametrize("topology", ["local", "1a1m1l"])
def test_an_overlapped_run_stopped_at_its_return_rewinds_to_the_weights_that_played(
        tmp_path, topology):
    """With ``algo.overlap`` each batch was played by the weights a version before the
    learner's: the fourth batch, whose episodes reach the target, by version 2 while the
    learner holds 3. The learner goes back one update, optimizer included, so the checkpoint
    holds version 2 after its 2 x 2 gradient steps."""
    import torch

    import walle_ray

    result = walle_ray.train(run_dir=tmp_path, topology=topology,
                             env={"id": "walle/Counting-v0", "envs_per_sampler": 4},
                             algo={"batch_size": 64, "minibatch_size": 32, "epochs": 1,
                                   "overlap": True},
                             logger={"progress": "off"},
                             run={"stop_at_return": 10, "return_window": 20,
                                  "total_env_steps": 640})
    assert result.stopped_by == "return" and result.counters["iterations"] == 4
    ckpt = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["learner"]["version"] == 2
    steps = {int(s["step"]) for s in ckpt["learner"]["update"]["optimizer"]["state"].values()}
    assert steps == {4}


@pytest.mark.parametrize("topology", ["local", "1a1m1l"])
def test_a_synchronous_run_stopped_at_its_return_keeps_the_weights_that_reached_it(
        tmp_path, topology):
    """PPO on Counting (every episode returns 10): the window of 20 fills at 10 in the fourth
    iteration, so the run stops without the update after it, and its checkpoint holds the
    weights that played its episodes (version 3), not an update no episode has scored. An
    iteration whose episodes do not reach the target is learned from as before."""
    import torch

    import walle_ray

    common = dict(topology=topology, env={"id": "walle/Counting-v0", "envs_per_sampler": 4},
                  algo={"batch_size": 64, "minibatch_size": 32, "epochs": 1},
                  logger={"progress": "off"})
    result = walle_ray.train(run_dir=tmp_path / "stop", **common,
                             run={"stop_at_return": 10, "return_window": 20,
                                  "total_env_steps": 640})
    # 4 envs, 16 steps each an iteration: episodes of 10 steps end 4 at a time at each env's
    # steps 10, 20, ..., so the window holds 4, 12, 16, then 24 episodes
    assert result.stopped_by == "return" and result.counters["iterations"] == 4
    ckpt = torch.load(tmp_path / "stop" / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["learner"]["version"] == 3 and ckpt["counters"]["env_steps"] == 256
    last = json.loads((tmp_path / "stop" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["return"] == 10 and last["learn_s"] == 0

    result = walle_ray.train(run_dir=tmp_path / "budget", **common,
                             run={"stop_at_return": 11, "return_window": 4,
                                  "total_env_steps": 128})
    assert result.stopped_by == "budget"
    ckpt = torch.load(tmp_path / "budget" / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["learner"]["version"] == 2


def test_a_role_process_tells_its_cost_while_a_call_of_its_own_runs(ray_session):
    """Samplers and learners answer ``usage`` on their watch thread: the run's cost is read
    while a fragment or an update is under way, not after it (``Run._close`` reads it once
    the loop ends, when a learner may still be waiting for batches)."""
    import time

    from walle_ray.runtime.role_process import Placed, Watched

    class Busy(Watched, Placed):
        def work(self, seconds: float) -> None:
            time.sleep(seconds)

    busy = ray_session.remote(concurrency_groups={"watch": 1})(Busy).options(num_cpus=0).remote()
    ray_session.get(busy.where.remote())  # started
    busy.work.remote(30.0)
    t0 = time.monotonic()
    answer = ray_session.get(busy.usage.remote(), timeout=20)
    assert time.monotonic() - t0 < 20 and answer["cpu_s"] >= 0 and answer["gpu_s"] == 0.0
    ray_session.kill(busy)

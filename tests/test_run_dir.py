"""Run directories of their own, metrics cut back to the checkpoint on resume, and files
replaced whole rather than written in place."""

import json
import os
import threading
from datetime import datetime
from pathlib import Path

import pytest

from walle_ray.config import ConfigError
from walle_ray.logging.metrics import keep_records_until, read_metrics
from walle_ray.runtime import files
from walle_ray.runtime.args import check_named_run_dir
from walle_ray.runtime.run_dir import check_run_dir, new_dir


def test_callers_racing_for_one_name_each_get_a_directory_of_their_own(tmp_path):
    base = str(tmp_path / "runs" / "2030-01-01_00-00-00_ppo_cartpole")
    got, start = [], threading.Barrier(8)

    def claim():
        start.wait()
        got.append(new_dir(base))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted([base] + [f"{base}-{n}" for n in range(2, 9)])
    assert all(Path(d).is_dir() for d in got)


def test_two_runs_started_in_the_same_second_get_different_directories(tmp_path, monkeypatch):
    """The default hydra.run.dir, composed twice within one second (the clock stopped)."""
    import hydra.core.utils

    from walle_ray.api import _compose

    class Stopped(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2030, 1, 1, 12, 0, 0)

    monkeypatch.setattr(hydra.core.utils, "datetime", Stopped)
    monkeypatch.setenv("WALLE_RUNS_DIR", str(tmp_path))
    _, first, _ = _compose(["topology=local"], None, None)
    _, second, _ = _compose(["topology=local"], None, None)
    assert first == tmp_path / "2030-01-01_12-00-00_ppo_cartpole"
    assert second == tmp_path / "2030-01-01_12-00-00_ppo_cartpole-2"
    assert first.is_dir() and second.is_dir()
    _, none, _ = _compose(["mode=collect"], None, None)  # only a training run gets one
    assert none is None and sorted(p.name for p in tmp_path.iterdir()) == [first.name, second.name]


def test_a_directory_holding_a_run_is_refused_unless_the_run_resumes_it(tmp_path):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "__main__.log").write_text("")
    check_run_dir(run, None)  # only Hydra's own files: a new run may start here
    check_run_dir(tmp_path / "new", None)
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(ConfigError, match=rf"^run directory {run} already holds a run "
                                          rf"\(metrics.jsonl\); continue it with run.resume={run}"):
        check_run_dir(run, None)
    check_run_dir(run, str(run))  # resuming it
    with pytest.raises(ConfigError, match="already holds a run"):
        check_run_dir(run, str(tmp_path / "other"))  # resuming another run into it


def test_the_command_line_refuses_a_named_run_directory_before_hydra_writes_there(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(ConfigError, match="already holds a run"):
        check_named_run_dir(["topology=local", f"hydra.run.dir={run}"])
    for args in ([f"run.resume={run}", f"hydra.run.dir={run}"],  # resuming it
                 ["mode=eval", f"hydra.run.dir={run}"],  # not a training run
                 ["--cfg", "job", f"hydra.run.dir={run}"],  # prints the config
                 ["--multirun", "run.seed=0,1", f"hydra.run.dir={run}"]):  # sweeps elsewhere
        check_named_run_dir(args)


def record(iteration: int) -> str:
    return json.dumps({"iteration": iteration, "env_steps": 2048 * iteration}) + "\n"


def test_resuming_keeps_the_records_up_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    """Killed at iteration 8, the run's last checkpoint was at iteration 5: records 6 to 8
    and the half-written ninth go; what is appended next starts on a line of its own."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(record(i) for i in range(1, 9)) + '{"iteration": 9, "env_st')
    assert keep_records_until(path, 5) == 4
    assert [r["iteration"] for r in read_metrics(path)] == [1, 2, 3, 4, 5]
    with open(path, "a") as f:
        f.write(record(6))
    assert [r["env_steps"] for r in read_metrics(path)] == [2048 * i for i in range(1, 7)]
    assert keep_records_until(tmp_path / "missing.jsonl", 5) == 0
    assert not (tmp_path / "missing.jsonl").exists()


def test_a_file_is_replaced_whole_not_written_in_place(tmp_path):
    """A reader holding the old file (here a hard link to it) keeps it unchanged."""
    path = tmp_path / "config.yaml"
    path.write_text("old: 1\n")
    held = tmp_path / "held.yaml"
    os.link(path, held)
    files.write_text_atomic(path, "new: 2\n")
    assert path.read_text() == "new: 2\n" and held.read_text() == "old: 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "held.yaml"]


def test_report_json_is_replaced_whole(tmp_path):
    from walle_ray.runtime.times import RunTimes

    held = tmp_path / "held.json"
    held.write_text('{"old": true}\n')
    os.link(held, tmp_path / "report.json")
    times = RunTimes({"algo": "ppo", "env": "cartpole", "topology": "local", "loop": "sync",
                      "local": True, "learners": 1, "feeders": [1]})
    times.add_record(2.0, {"collect_s": 1.0, "learn_s": 1.0}, [])
    assert times.finish(tmp_path, {"env_steps": 100})
    assert held.read_text() == '{"old": true}\n'
    assert "summary" in json.loads((tmp_path / "report.json").read_text())

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


@pytest.mark.parametrize("algo,how", [("ppo", "raise"), ("ppo", "exit"), ("impala", "raise"),
                                      ("impala", "exit")])
def test_injected_sampler_faults_cost_a_fragment_each_and_the_run_finishes(tmp_path, algo, how):
    run_dir = tmp_path / "run"
    # Long enough that the last fault (in a restarted process) is seen before the budget ends.
    extra = (["algo.batch_size=512", "algo.epochs=1", "run.total_env_steps=12000"] if algo == "ppo"
             else ["run.report_every_s=1", "run.total_env_steps=60000"])
    out = run_cli(f"algo={algo}", "topology=2a1m1l", "env.id=walle/Faulty-v0",
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
    proc = run_cli("topology=local", "env.id=walle/Faulty-v0", f"+env.kwargs={{faults: {faults}}}",
                   "run.total_env_steps=4096", f"hydra.run.dir={tmp_path / 'run'}", check=False,
                   timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "env failed 3 times in a row" in proc.stderr and "Traceback" not in proc.stderr
    assert (tmp_path / "run" / "checkpoints" / "last.pt").is_file()

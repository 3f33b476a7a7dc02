"""Learning targets reached from the real command line (slow, but run in CI)."""

import json

import pytest

from conftest import run_cli


@pytest.mark.slow
def test_ppo_learns_cartpole_to_475(tmp_path):
    out = run_cli("algo=ppo", "env=cartpole", "topology=4a1m1l", "run.total_env_steps=300000",
                  f"hydra.run.dir={tmp_path}", timeout=600).stdout
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["return"] >= 475, out[-2000:]
    assert "stopped (return)" in out

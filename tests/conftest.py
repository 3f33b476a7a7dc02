"""Shared fixtures: composed configs, one Ray instance for the session, CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from walle_ray.algos import algorithm_for, register_configs
from walle_ray.config import CONF_DIR

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = str(ROOT / "tests" / "fixtures")  # a user's package, my_pkg, outside walle_ray/


def make_cfg(*overrides: str):
    """The config ``python -m walle_ray <overrides>`` would run with."""
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        return compose("config", overrides=list(overrides))


def make_learner(cfg, obs_space=None, action_space=None, shards: int = 1):
    """The learner the config's algorithm builds (``Algorithm.build_learner``), in this
    process; the spaces default to the config's env's."""
    if obs_space is None:
        from walle_ray.envs import env_spaces

        obs_space, action_space = env_spaces(cfg.env)
    return algorithm_for(cfg.algo).build_learner(cfg, obs_space, action_space, shards=shards)


@pytest.fixture
def on_path(monkeypatch):
    """my_pkg importable in this process and in the processes a test starts; returns the
    environment for ``run_cli``'s ``env``."""
    monkeypatch.syspath_prepend(FIXTURES)
    path = os.pathsep.join([FIXTURES, os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    return {"PYTHONPATH": path}


@pytest.fixture(scope="session")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, namespace="walle_ray_tests",
             logging_level="ERROR")
    yield ray
    ray.shutdown()


def run_cli(*args: str, timeout: float = 300, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real command line (with ``env`` added to the environment); returns the
    finished process with its output."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "walle_ray", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                             f"stderr:\n{proc.stderr[-3000:]}")
    return proc

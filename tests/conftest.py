"""Shared fixtures: composed configs, one Ray instance for the session, CLI runner."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
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


class SharedCluster:
    """One Ray instance on loopback (``ray start --head``) that the runs of ``run_cli`` join,
    as runs join a cluster a user started, instead of each starting and stopping its own:
    that is most of a short run's time on 2 cores. Its own temp dir and ports, so a run that
    starts its own instance (``Popen`` in the tests of signals, start-up and the dashboard;
    a run with user code on its PYTHONPATH) neither finds nor disturbs it."""

    def __init__(self) -> None:
        self.env: dict | None = None
        self.head: subprocess.Popen | None = None
        self.temp_dir = ""
        self.pythonpath = os.environ.get("PYTHONPATH")  # as the session began

    def joins(self, args: tuple, env: dict | None) -> bool:
        """Whether a run joins it: not one that brings its own environment or user code
        (a worker of the instance has the instance's environment, not the run's), names its
        own cluster, or plants faults (their log is a detached actor that would outlive the
        run in the shared instance)."""
        return (env is None and os.environ.get("PYTHONPATH") == self.pythonpath
                and not any(a.startswith(("run.ray_address=", "env.id=walle/Faulty"))
                            for a in args))

    def address_env(self) -> dict:
        if self.env is None:
            self._start()
        return self.env

    def _start(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
               "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS", None)
        self.temp_dir = tempfile.mkdtemp(prefix="wr-", dir="/tmp")  # socket paths stay short
        ray = str(Path(sys.executable).with_name("ray"))
        self.head = subprocess.Popen(
            [ray, "start", "--head", "--block", "--num-cpus=2", "--node-ip-address=127.0.0.1",
             f"--port={port}", "--include-dashboard=false", f"--temp-dir={self.temp_dir}"],
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        probe = "import ray; ray.init(); ray.shutdown()"
        deadline = time.monotonic() + 90
        env["RAY_ADDRESS"] = f"127.0.0.1:{port}"
        while subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                             timeout=90).returncode != 0:
            assert self.head.poll() is None, self.head.stdout.read()
            assert time.monotonic() < deadline, "the shared Ray instance did not come up"
            time.sleep(1)
        self.env = {k: env[k] for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}

    def stop(self) -> None:
        if self.head is None:
            return
        # ``ray start --block`` takes half a minute to end after SIGTERM: its group is
        # killed after 5 s, as nothing is left to save.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.head.pid, signal.SIGTERM)
        try:
            self.head.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.head.pid, signal.SIGKILL)
            self.head.wait(timeout=30)
        import shutil

        shutil.rmtree(self.temp_dir, ignore_errors=True)


SHARED = SharedCluster()


@pytest.fixture(scope="session", autouse=True)
def shared_cluster():
    yield SHARED
    SHARED.stop()


def run_cli(*args: str, timeout: float = 300, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real command line (with ``env`` added to the environment); returns the
    finished process with its output. It joins the session's shared Ray instance where
    ``SharedCluster.joins`` says it may."""
    joined = SHARED.address_env() if SHARED.joins(args, env) else {}
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **joined, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "walle_ray", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                             f"stderr:\n{proc.stderr[-3000:]}")
    return proc

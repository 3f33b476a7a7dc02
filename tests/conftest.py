"""Shared fixtures: composed configs, one Ray instance for the session, CLI runner."""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
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
    that is most of a short run's time on 2 cores. Its own temp dir and every port of its
    own, so a run that starts its own instance (``Popen`` in the tests of signals, start-up
    and the dashboard; a run with user code on its PYTHONPATH) neither finds nor disturbs
    it. It dies with the test session, even a killed one."""

    PORTS = ("port", "dashboard-port", "metrics-export-port", "dashboard-agent-listen-port",
             "dashboard-agent-grpc-port", "runtime-env-agent-port", "ray-client-server-port")

    def __init__(self) -> None:
        self.env: dict | None = None
        self.head: subprocess.Popen | None = None
        self.temp_dir = ""
        self.failed = False
        self.base = self._environ()  # the environment as the session began
        self.runs = {"joined": 0, "own": 0}  # run_cli's runs, for the session's summary
        self.changes: set[str] = set()  # variables that kept a run from joining, for it too

    # what this process sets for itself: pytest for each test, an in-process ``ray.init``
    # (RAY_USAGE_STATS_ENABLED, RAY_AUTH_MODE, RAY_CLIENT_MODE, PYTHONBREAKPOINT), torch's
    # compiler (TORCHINDUCTOR_CACHE_DIR, and _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR once it
    # loads a kernel: a name with a leading underscore is a library's own); RAY_ADDRESS,
    # which a test may set, counts
    OWN = ("PYTEST_", "RAY_", "TORCHINDUCTOR_", "PYTHONBREAKPOINT", "_")

    @classmethod
    def _environ(cls) -> dict:
        return {k: v for k, v in os.environ.items()
                if not k.startswith(cls.OWN) or k == "RAY_ADDRESS"}

    def changed(self) -> list[str]:
        """The variables that differ from the session's start."""
        now = self._environ()
        return sorted(k for k in {*now, *self.base} if now.get(k) != self.base.get(k))

    def differs(self, env: dict | None) -> set[str]:
        """The variables by which a run's environment may differ from the session's start:
        those it is given (``env``, whatever their values) and those the test set, changed
        or removed."""
        return set(env or ()) | set(self.changed())

    # variables that only the driver reads: where new runs go, topology=auto's cache
    DRIVER_ONLY = {"WALLE_RUNS_DIR", "WALLE_CACHE_DIR"}

    @functools.cached_property
    def cpus(self) -> int:
        """The instance's CPUs, given to it: those Ray finds here (a container's CPU quota
        counts), as a run's own instance would have."""
        try:
            from ray._private.utils import get_num_cpus
            return int(get_num_cpus())
        except (ImportError, AttributeError):
            return len(os.sched_getaffinity(0))

    def joins(self, args: tuple, env: dict | None) -> bool:
        """Whether a run joins it: not one that brings an environment of its own beyond the
        driver's (``DRIVER_ONLY``) or user code (a worker of the instance has the instance's
        environment, not the run's), names its own cluster or CPUs other than the
        instance's, or plants faults (their log is a detached actor that would outlive the
        run in the shared instance)."""
        return (not self.failed and self.differs(env) <= self.DRIVER_ONLY
                and not any(a.startswith(("run.ray_address=", "env.id=walle/Faulty"))
                            or (a.startswith("run.ray_num_cpus=")
                                and a != f"run.ray_num_cpus={self.cpus}") for a in args))

    def address_env(self) -> dict:
        """The variables that make a run join it (started on first use); none if it could
        not start, and the runs then start their own."""
        if self.env is None and not self.failed:
            try:
                self._start()
            except Exception as exc:  # noqa: BLE001 - any failure: the runs start their own
                self.failed = True
                self.stop()
                warnings.warn(f"no shared Ray instance ({exc}); each run starts its own")
                return {}
        return self.env or {}

    def _start(self) -> None:
        ports = {}
        for name in self.PORTS:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports[name] = s.getsockname()[1]
        env = {**self.base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
               "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS", None)
        self.temp_dir = tempfile.mkdtemp(prefix="wr-", dir="/tmp")  # socket paths stay short
        ray = str(Path(sys.executable).with_name("ray"))
        with open(Path(self.temp_dir) / "head.log", "w") as log:
            self.head = subprocess.Popen(
                [ray, "start", "--head", "--block", "--node-ip-address=127.0.0.1",
                 "--include-dashboard=false", f"--temp-dir={self.temp_dir}",
                 f"--num-cpus={self.cpus}",
                 *(f"--{name}={port}" for name, port in ports.items())],
                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent)
        env["RAY_ADDRESS"] = f"127.0.0.1:{ports['port']}"
        probe = "import ray; ray.init(); ray.shutdown()"
        deadline = time.monotonic() + 90
        while subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                             timeout=90).returncode != 0:
            if self.head.poll() is not None:
                raise RuntimeError((Path(self.temp_dir) / "head.log").read_text()[-2000:])
            if time.monotonic() > deadline:
                raise RuntimeError("it did not come up within 90 s")
            time.sleep(1)
        self.env = {k: env[k] for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}

    def stop(self) -> None:
        head, self.head = self.head, None
        if head is not None:
            stop_ray_head(head)
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def stop_ray_head(head: subprocess.Popen) -> None:
    """End a ``ray start --head --block`` started in a process group of its own. It outlives
    its processes by half a minute after SIGTERM, and nothing is left to save once the tests
    are over: after 5 s the group is killed. The group may empty itself between the wait and
    the kill: nothing left to kill."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.pid, signal.SIGTERM)
    try:
        head.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=30)


def _die_with_parent() -> None:
    """In the child: the kernel kills it when the test session's process dies (Linux), and
    ``ray start --block``'s reaper then ends the instance's processes."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


SHARED = SharedCluster()
atexit.register(SHARED.stop)


@pytest.fixture(scope="session", autouse=True)
def shared_cluster():
    yield SHARED
    FORKED.stop()
    SHARED.stop()


def pytest_terminal_summary(terminalreporter):
    runs = SHARED.runs
    if runs["joined"] or runs["own"]:
        terminalreporter.write_line(
            f"run_cli: {runs['joined']} runs joined the shared Ray instance, {runs['own']} "
            "started their own or none" + (" (it could not start)" if SHARED.failed else "")
            + f"; {FORKED.runs} forked from a process that had imported walle_ray"
            + (f"; the environment had changed: {', '.join(sorted(SHARED.changes))}"
               if SHARED.changes else ""))


class ForkedCli:
    """``tests/forked_cli.py``, started on first use with the session's environment: each
    command line it is sent runs in a child forked from a process that has already imported
    what ``python -m walle_ray`` imports first (``WALLE_TEST_SPAWN=1`` spawns every run
    instead). A run whose environment differs from the session's in more than the variables
    read once the run has begun (``RUN_TIME``), or whose arguments are Hydra's flags
    (``--help``, ``--cfg``, ...), is spawned as ``python -m walle_ray``: a variable read at
    import, or a flag Hydra handles before the task, is then the process's own."""

    # the imports of user code, and what only the driver reads
    RUN_TIME = {"PYTHONPATH", *SharedCluster.DRIVER_ONLY}

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.spawn = bool(os.environ.get("WALLE_TEST_SPAWN"))  # every run spawned
        self.dir = ""
        self.runs = 0  # forked so far: the session's summary, and each run's file names

    def takes(self, args: tuple, env: dict | None) -> bool:
        return (not self.spawn and SHARED.differs(env) <= self.RUN_TIME
                and not any(a.startswith("-") for a in args))

    def _start(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="wr-fork-")
        self.buffer = b""
        with open(Path(self.dir) / "server.log", "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "forked_cli.py")],
                env={**SHARED.base, "PYTHONUNBUFFERED": "1"}, cwd=ROOT, bufsize=0,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                preexec_fn=_die_with_parent)

    def _answer(self, deadline: float) -> dict | None:
        """The server's next line, or None at ``deadline``. The pipe is read here, into a
        buffer of this object's own, so that a line already read is never waited for."""
        import select

        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError("forked_cli ended: "
                                   + (Path(self.dir) / "server.log").read_text()[-2000:])
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def run(self, args: tuple, env: dict, timeout: float) -> subprocess.CompletedProcess:
        """As ``subprocess.run`` would: on its timeout, or on anything that interrupts the
        wait (a test's own timeout), the run is killed; then the server is stopped too, and
        the next run starts another."""
        if self.proc is None:
            self._start()
        self.runs += 1
        out, err = (Path(self.dir) / f"{self.runs}.{name}" for name in ("out", "err"))
        command = [sys.executable, "-m", "walle_ray", *args]
        pid = None
        try:
            self.proc.stdin.write((json.dumps({"args": list(args), "env": env, "cwd": str(ROOT),
                                               "out": str(out), "err": str(err)}) + "\n").encode())
            started = self._answer(time.monotonic() + 120)
            if started is None:
                raise RuntimeError("forked_cli did not fork within 120 s")
            pid = started["pid"]
            answer = self._answer(time.monotonic() + timeout)
            if answer is None:
                raise subprocess.TimeoutExpired(command, timeout,
                                                out.read_text(errors="replace"),
                                                err.read_text(errors="replace"))
        except BaseException:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.stop()
            raise
        texts = [path.read_text(errors="replace") for path in (out, err)]
        for path in (out, err):
            path.unlink()
        return subprocess.CompletedProcess(command, answer["code"], *texts)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""


FORKED = ForkedCli()
atexit.register(FORKED.stop)


def run_cli(*args: str, timeout: float = 300, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real command line (with ``env`` added to the environment); returns the
    finished process with its output. It joins the session's shared Ray instance where
    ``SharedCluster.joins`` says it may, and is forked where ``ForkedCli`` takes it."""
    joined = SHARED.address_env() if SHARED.joins(args, env) else {}
    if not set(env or ()) - SHARED.DRIVER_ONLY:
        SHARED.changes.update(set(SHARED.changed()) - SHARED.DRIVER_ONLY)
    SHARED.runs["joined" if joined else "own"] += 1
    forked = FORKED.takes(args, env)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **joined, **(env or {})}
    if forked:
        proc = FORKED.run(args, env, timeout)
    else:
        proc = subprocess.run([sys.executable, "-m", "walle_ray", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                             f"stderr:\n{proc.stderr[-3000:]}")
    return proc

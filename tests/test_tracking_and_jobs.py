"""Tracking and jobs: W&B offline logging, the shipped sweeps, and a real Ray cluster with
`ray job submit` (named role actors, walle_* metrics on the Prometheus endpoint, SUCCEEDED)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, make_cfg, run_cli, stop_ray_head
from walle_ray.algos import validate
from walle_ray.runtime.args import rewrite_args
from walle_ray.config import CONF_DIR

SWEEPS = sorted((CONF_DIR / "sweep").glob("*.yaml"))


def wandb_history_keys(run_file: Path) -> tuple[int, set[str]]:
    """(history rows, keys) of an offline ``run-<id>.wandb`` file: a LevelDB-style log of
    protobuf records in 32 KiB blocks after a 7-byte header."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", "not a W&B run file"
    pos, block, parts, rows, keys = 7, 32768, b"", 0, set()
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the rest of a block too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        parts = chunk if kind in (1, 2) else parts + chunk  # full/first start, middle/last extend
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            if record.WhichOneof("record_type") == "history":
                rows += 1
                keys |= {item.key or "/".join(item.nested_key) for item in record.history.item}
    return rows, keys


def test_wandb_offline_run_holds_the_metrics(tmp_path):
    run_dir = tmp_path / "run"
    env = {"WANDB_MODE": "offline", "WANDB_API_KEY": "", "WANDB_SILENT": "true"}
    out = run_cli("topology=local", "logger=wandb", "run.total_env_steps=1536",
                  "algo.batch_size=512", "algo.epochs=2", f"hydra.run.dir={run_dir}",
                  "logger.progress=line", env=env).stdout
    assert "wandb sync" in out
    run_files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1
    rows, keys = wandb_history_keys(run_files[0])
    assert rows == 4  # three records, then the timing figure at the end
    assert {"return", "env_steps_per_s", "env_steps", "learn/policy_loss", "timing/path"} <= keys


def test_wandb_mode_follows_the_key(monkeypatch, tmp_path):
    from walle_ray.logging.wandb_sink import wandb_mode

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # no such file: no key
    assert wandb_mode("auto") == "offline"
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    assert wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode("auto") == "disabled"


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.stem)
def test_sweep_params_are_config_keys_and_the_command_composes(sweep):
    from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

    spec = yaml.safe_load(sweep.read_text())
    command = spec["command"]
    assert command[:4] == ["${env}", "python", "-m", "walle_ray"] and "${args_no_hyphens}" in command
    assert spec["metric"]["name"] in ("return", "eval/return")
    for pick in (0, -1):  # the lowest and the highest value of every parameter
        values = {}
        for key, param in spec["parameters"].items():
            choices = param.get("values") or [param["min"], param["max"]]
            values[key] = {"value": choices[pick]}
        swept = create_sweep_command_args({"args": values})["args_no_hyphens"]
        fixed = [a for a in command[4:] if not a.startswith("${")]
        args = rewrite_args([*fixed, *swept], CONF_DIR)
        cfg = make_cfg(*args)  # an unknown key or a wrong type fails here
        validate(cfg)
        for key, value in values.items():
            node = cfg
            for part in key.split("."):
                node = node[part]
            assert node == value["value"], key


def test_local_multirun_sweeps_comma_values(tmp_path):
    out = run_cli("--multirun", "topology=local", "algo.lr=1e-4,3e-4", "run.total_env_steps=512",
                  "algo.batch_size=256", "algo.epochs=1", "logger.progress=off",
                  f"hydra.sweep.dir={tmp_path}").stdout
    assert out.count("stopped (budget)") == 2
    lrs = sorted(yaml.safe_load((tmp_path / str(i) / "config.yaml").read_text())["algo"]["lr"]
                 for i in (0, 1))
    assert lrs == [1e-4, 3e-4]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_cli(*args: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    ray = Path(sys.executable).with_name("ray")
    return subprocess.run([str(ray), *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def ray_cluster():
    """A real one-node cluster on loopback (``ray start --head --block``) in its own process
    group, so stopping it leaves any other Ray instance on the machine alone; the jobs of
    this module share it."""
    # Every port given, so a Ray instance the test session already runs keeps its defaults.
    ports = {name: _free_port() for name in ("port", "dashboard", "metrics", "agent_http",
                                             "agent_grpc", "runtime_env_agent", "client")}
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "RAY_metrics_report_interval_ms": "1000", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    temp_dir = tempfile.mkdtemp(prefix="wr-", dir="/tmp")  # socket paths must stay short
    head = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
         "--num-cpus=2", "--node-ip-address=127.0.0.1", f"--port={ports['port']}",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={ports['dashboard']}",
         f"--metrics-export-port={ports['metrics']}",
         f"--dashboard-agent-listen-port={ports['agent_http']}",
         f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
         f"--runtime-env-agent-port={ports['runtime_env_agent']}",
         f"--ray-client-server-port={ports['client']}", f"--temp-dir={temp_dir}"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while _ray_cli("job", "list", "--address", f"http://127.0.0.1:{ports['dashboard']}",
                       env=env, timeout=60).returncode != 0:
            assert head.poll() is None, head.stdout.read()
            assert time.monotonic() < deadline, "the Ray head did not come up within 60 s"
            time.sleep(1)
        yield env, ports
    finally:
        stop_ray_head(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


# On the cluster's 2 CPUs, learner 0 keeps the weights: no parameter server process.
ROLES = {"walle/sampler-0", "walle/sampler-1", "walle/memory-0", "walle/learner-0"}


def test_job_submit_runs_on_the_existing_cluster(ray_cluster, tmp_path):
    env, ports = ray_cluster
    dashboard = f"http://127.0.0.1:{ports['dashboard']}"
    runs = tmp_path / "runs"
    job_id = f"walle-test-{secrets.token_hex(4)}"
    runtime_env = json.dumps({"env_vars": {"WALLE_RUNS_DIR": str(runs)}})
    deadline = time.monotonic() + 90
    while True:  # the node's job agent can come up a little after the head's dashboard
        submit = _ray_cli("job", "submit", "--address", dashboard, "--no-wait",
                          "--submission-id", job_id, "--working-dir", ".",
                          "--runtime-env-json", runtime_env, "--",
                          "python", "-m", "walle_ray", "algo=impala", "env=cartpole",
                          "topology=2a1m1l", "run.max_wall_s=45", "run.report_every_s=1",
                          "logger.progress=line", env=env)
        if submit.returncode == 0 or "No available agent" not in submit.stderr + submit.stdout:
            break
        assert time.monotonic() < deadline, submit.stderr[-2000:]
        time.sleep(2)
    assert submit.returncode == 0, submit.stdout[-2000:] + submit.stderr[-2000:]

    actors, metrics, status = set(), "", ""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        status = _ray_cli("job", "status", "--address", dashboard, job_id, env=env).stdout.lower()
        if any(f"' {word}" in status for word in ("succeeded", "failed", "stopped")):
            break
        # Each CLI call starts a Python process, seconds on a busy 2-core machine: the run
        # lasts long enough for a few listings, and listing stops once every role was seen.
        if not ROLES <= actors:
            listed = _ray_cli("list", "actors", "--address", dashboard, "--format", "json",
                              "--filter", "state=ALIVE", env=env, timeout=60)
            if listed.returncode == 0 and listed.stdout.strip().startswith("["):
                actors |= {a.get("name") for a in json.loads(listed.stdout)}
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics']}/metrics",
                                        timeout=10) as page:
                text = page.read().decode()
            if "ray_walle_" in text:
                metrics = text
        except OSError:
            pass
        time.sleep(2)
    logs = _ray_cli("job", "logs", "--address", dashboard, job_id, env=env).stdout
    assert "' succeeded" in status, status + logs[-3000:]
    assert ROLES <= actors and "walle/ps" not in actors, actors
    for name in ("ray_walle_env_steps_per_s", "ray_walle_learner_updates_per_s",
                 "ray_walle_policy_lag", "ray_walle_queue_depth", "ray_walle_return"):
        assert name in metrics, name
    assert "stopped (" in logs and "results in" in logs, logs[-3000:]
    [run_dir] = list(runs.iterdir())
    assert (run_dir / "metrics.jsonl").is_file() and (run_dir / "checkpoints" / "last.pt").is_file()


def _wait_for_job(dashboard: str, job_id: str, env: dict, timeout: float = 240) -> str:
    """The job's final status line, lower-cased."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = _ray_cli("job", "status", "--address", dashboard, job_id, env=env).stdout.lower()
        if any(f"' {word}" in status for word in ("succeeded", "failed", "stopped")):
            return status
        time.sleep(2)
    return status


def test_a_users_env_and_network_travel_with_the_working_dir(ray_cluster, tmp_path):
    """A user's project (its own package, not on any PYTHONPATH of the cluster) submitted with
    ``--working-dir .``: every sampler and learner imports the env and the network from it."""
    env, ports = ray_cluster
    dashboard = f"http://127.0.0.1:{ports['dashboard']}"
    project = tmp_path / "project"
    shutil.copytree(ROOT / "tests" / "fixtures" / "my_pkg", project / "my_pkg",
                    ignore=shutil.ignore_patterns("__pycache__"))
    runs = tmp_path / "runs"
    job_id = f"walle-user-{secrets.token_hex(4)}"
    runtime_env = json.dumps({"env_vars": {"WALLE_RUNS_DIR": str(runs)}})
    submit = subprocess.run(
        [str(Path(sys.executable).with_name("ray")), "job", "submit", "--address", dashboard,
         "--no-wait", "--submission-id", job_id, "--working-dir", ".", "--runtime-env-json",
         runtime_env, "--", "python", "-m", "walle_ray", "env.id=my_pkg.envs:Corridor-v0",
         "model._target_=my_pkg.nets:MyActorCritic", "topology=2a1m1l",
         "algo.batch_size=256", "algo.minibatch_size=64", "run.total_env_steps=1500"],
        env={k: v for k, v in env.items() if k != "PYTHONPATH"}, cwd=project,
        capture_output=True, text=True, timeout=120)
    assert submit.returncode == 0, submit.stdout[-2000:] + submit.stderr[-2000:]
    status = _wait_for_job(dashboard, job_id, env)
    logs = _ray_cli("job", "logs", "--address", dashboard, job_id, env=env).stdout
    assert "' succeeded" in status, status + logs[-3000:]
    assert "ppo corridor 2a1m1l" in logs and "stopped (budget)" in logs, logs[-3000:]
    [run_dir] = list(runs.iterdir())
    assert (run_dir / "checkpoints" / "last.pt").is_file()


def test_training_evaluates_greedily_every_n_env_steps(tmp_path):
    run_dir = tmp_path / "run"
    run_cli("topology=local", "run.total_env_steps=3072", "algo.batch_size=512", "algo.epochs=1",
            "eval.every_env_steps=1000", "eval.episodes=2", "run.stop_at_return=null",
            "logger.progress=off", f"hydra.run.dir={run_dir}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r["env_steps"] for r in records if "eval/return" in r]
    assert evaluated == [1024, 2048, 3072]
    assert all(r["eval/return"] > 0 for r in records if "eval/return" in r)


def test_wandb_offline_run_holds_eval_videos_and_the_timing_figure(tmp_path):
    run_dir = tmp_path / "run"
    env = {"WANDB_MODE": "offline", "WANDB_API_KEY": "", "WANDB_SILENT": "true"}
    run_cli("topology=local", "logger=wandb", "run.total_env_steps=2048", "algo.batch_size=512",
            "algo.epochs=1", "eval.every_env_steps=1024", "eval.episodes=1", "eval.video=true",
            "run.stop_at_return=null", "logger.progress=off", f"hydra.run.dir={run_dir}", env=env)
    kept = sorted(p.relative_to(run_dir).as_posix() for p in (run_dir / "videos").rglob("*.mp4"))
    assert kept == ["videos/1024/episode-000.mp4", "videos/2048/episode-000.mp4"]
    assert (run_dir / "timing.png").stat().st_size > 0
    [offline] = list((run_dir / "wandb").glob("offline-run-*"))
    media = offline / "files" / "media"
    logged = sorted(p.read_bytes() for p in (media / "videos" / "eval").glob("video_*.mp4"))
    assert logged == sorted((run_dir / p).read_bytes() for p in kept)
    [image] = list((media / "images").glob("timing_*.png"))
    assert image.read_bytes() == (run_dir / "timing.png").read_bytes()
    _, keys = wandb_history_keys(next(offline.glob("run-*.wandb")))
    assert {"eval/video/videos", "timing/path", "eval/return", "return"} <= keys  # media: nested

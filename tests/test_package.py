"""The package installs like one: a wheel built from the checkout carries its configs, and
installed in a fresh virtual environment it runs from any directory."""

import os
import subprocess
import sys
import zipfile

from conftest import ROOT


def _run(*args, cwd, env=None, timeout=300):
    proc = subprocess.run(list(map(str, args)), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"{args}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_a_wheel_in_a_fresh_venv_runs_from_any_directory(tmp_path):
    # The installed dependencies are reused (--system-site-packages, --no-deps): what is
    # under test is the package itself, and the machine may have no index to download from.
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", tmp_path / "dist", ROOT, cwd=tmp_path)
    [wheel] = list((tmp_path / "dist").glob("walle_ray-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"walle_ray/conf/config.yaml", "walle_ray/conf/algo/impala.yaml",
            "walle_ray/conf/preset/ppo_cartpole.yaml", "walle_ray/conf/env/custom.yaml",
            "walle_ray/conf/topology/32a4m4l.yaml"} <= names

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--system-site-packages", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel, cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    found = _run(python, "-c", "import walle_ray.config as c; print(c.CONF_DIR)",
                 cwd=elsewhere).stdout.strip()
    assert found.startswith(str(venv)), found  # the wheel's copy, not the checkout's

    env = {"WALLE_RUNS_DIR": str(elsewhere / "runs"), "PYTHONPATH": ""}
    out = _run(python, "-m", "walle_ray", "run.total_env_steps=2000", cwd=elsewhere,
               env=env).stdout
    assert "stopped (budget)" in out
    [run_dir] = list((elsewhere / "runs").iterdir())
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert "ppo_cartpole" in run_dir.name

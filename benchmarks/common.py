"""Helpers shared by the benchmarks: run the CLI, read its metrics, write JSON results."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def machine() -> dict:
    import ray
    import torch

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
    except OSError:  # no git (e.g. inside the Docker image)
        commit = "unknown"
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "ray": ray.__version__, "commit": commit,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def write_result(name: str, result: dict, dry_run: bool = False) -> Path | None:
    """Write benchmarks/results/<name>.json with the machine; with ``dry_run`` only print it."""
    if dry_run:
        print(json.dumps(result, indent=2))
        return None
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **result}, indent=2) + "\n")
    print(f"wrote {path}")
    return path


def run_cli(args: list[str], run_dir: Path, timeout_s: float) -> tuple[list[dict], float]:
    """Run ``python -m walle_ray`` into ``run_dir``; returns its metrics and wall seconds."""
    from walle_ray.logging.metrics import read_metrics

    cmd = [sys.executable, "-m", "walle_ray", *args, f"hydra.run.dir={run_dir}",
           "logger.progress=line", "logger.print_every_s=30"]
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=timeout_s)
    return read_metrics(run_dir / "metrics.jsonl"), time.perf_counter() - t0

"""Helpers shared by the benchmarks: run the CLI, read its metrics, write JSON results."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def machine() -> dict:
    """Where a result was measured: figures from different CPUs are not comparable."""
    import ray
    import torch

    from walle_ray.models.precision import cpu_features
    from walle_ray.runtime.calibrate import cpu_model

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
    except OSError:  # no git (e.g. inside the Docker image)
        commit = "unknown"
    return {"cpus": os.cpu_count(), "cpu_model": cpu_model(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": cpu_features(), "platform": platform.platform(),
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


def steady_consumed_rate(records: list[dict], warmup: float) -> float | None:
    """Agent steps/s the learners consumed over the records after ``warmup`` seconds of the
    loop (an asynchronous run's ``env_steps_consumed``); None when the run was shorter."""
    steady = [r for r in records if r["wall_s"] >= warmup]
    base = next((r for r in reversed(records) if r["wall_s"] < warmup), None)
    if not steady or base is None:
        return None
    span = steady[-1]["wall_s"] - base["wall_s"]
    return (steady[-1]["env_steps_consumed"] - base["env_steps_consumed"]) / span


def first_reaching(records: list[dict], target: float) -> dict | None:
    """The first record whose ``return`` (the mean of the last 20 episodes) reaches ``target``."""
    return next((r for r in records if r["return"] is not None and r["return"] >= target), None)


def learning_run(name: str, overrides: list[str], target: float, minutes: float,
                 title: str, from_run: Path | None = None) -> dict:
    """Train until the mean of the last 20 episodes reaches ``target`` or ``minutes`` pass;
    writes benchmarks/results/<name>.json (the curve, minutes and agent steps to the target
    or the best return reached) and <name>.png (return over wall-clock minutes).
    ``from_run``: make the result from that run directory (one stopped by hand) instead."""
    run_dir = from_run or ROOT / "runs" / f"bench_{name}"
    overrides = [*overrides, f"run.max_wall_s={minutes * 60}", f"run.stop_at_return={target}",
                 "run.report_every_s=15"]
    if from_run is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        records, wall = run_cli(overrides, run_dir, timeout_s=minutes * 60 + 600)
    else:
        from walle_ray.logging.metrics import read_metrics

        records, wall = read_metrics(run_dir / "metrics.jsonl"), None
    reached = first_reaching(records, target)
    best = max((r["return"] for r in records if r["return"] is not None), default=None)
    RESULTS.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "walle_ray.plot", str(run_dir), "--x", "wall_s",
                    "--title", title, "-o", str(RESULTS / f"{name}.png")], cwd=ROOT, check=True)
    last = records[-1]
    result = {
        "command": "python -m walle_ray " + " ".join(overrides),
        "target": {"return": target, "minutes": minutes},
        "reached_target": reached is not None,
        "minutes_to_target": reached["wall_s"] / 60 if reached else None,
        "agent_steps_to_target": reached["env_steps"] if reached else None,
        "best_return": best, "final_return": last["return"],
        "agent_steps": last["env_steps"], "wall_s_training": last["wall_s"],
        "wall_s_total_process": wall, "updates": last.get("updates", last["iteration"]),
        "agent_steps_per_s": last["env_steps"] / last["wall_s"],
        "curve": [{"wall_s": r["wall_s"], "env_steps": r["env_steps"], "return": r["return"]}
                  for r in records],
        "met_target": reached is not None and reached["wall_s"] <= minutes * 60,
    }
    if (run_dir / "report.json").exists():  # where the time went (walle_ray.report)
        result["report"] = json.loads((run_dir / "report.json").read_text())
    write_result(name, result)
    return result


def score_run(run_dir: Path, overrides: list[str], target: float, minutes: float,
              reuse: bool = False) -> dict:
    """One run of ``python -m walle_ray <overrides>`` until its mean return reaches ``target``
    (``run.stop_at_return``, which only stops it) or ``minutes`` pass; with ``reuse``, the run
    already in ``run_dir`` is read instead. Returns its curve and the run's own record of
    when it first reached each milestone (``report.json``: wall minutes since the command
    started, agent steps, core-hours)."""
    from walle_ray.logging.metrics import read_metrics

    command = [*overrides, f"run.stop_at_return={target}", f"run.max_wall_s={minutes * 60}",
               "run.report_every_s=15"]
    if not (reuse and (run_dir / "metrics.jsonl").is_file()):
        shutil.rmtree(run_dir, ignore_errors=True)
        run_cli(command, run_dir, timeout_s=minutes * 60 + 600)
    records = read_metrics(run_dir / "metrics.jsonl")
    report = json.loads((run_dir / "report.json").read_text())
    reached = report.get("milestones", {}).get(f"{target:g}")
    if reached is None and "milestones" not in report:  # a run from before run.milestones
        first = first_reaching(records, target)
        if first is not None:
            reached = {"minutes": first["wall_s"] / 60, "agent_steps": first["env_steps"],
                       "core_hours": None, "note": "the loop's minutes (no milestones recorded)"}
    steady = [r for r in records if r.get("env_steps_per_s") and r["wall_s"] >= 60]
    if (run_dir / "overrides.yaml").is_file():  # what the run was given, however it was made
        import yaml

        command = yaml.safe_load((run_dir / "overrides.yaml").read_text())
    return {
        "command": "python -m walle_ray " + " ".join(command), "run_dir": str(run_dir),
        "reached": reached is not None, "milestones": report.get("milestones", {}),
        "cost": report.get("cost"),
        "minutes_to_target": reached["minutes"] if reached else None,
        "agent_steps_to_target": reached["agent_steps"] if reached else None,
        "core_hours_to_target": reached["core_hours"] if reached else None,
        "best_return": max((r["return"] for r in records if r["return"] is not None), default=None),
        "agent_steps": records[-1]["env_steps"],
        "agent_steps_per_s": (sum(r["env_steps_per_s"] for r in steady) / len(steady)
                              if steady else None),
        "policy_lag_mean": (sum(r.get("policy_lag_mean") or 0 for r in steady) / len(steady)
                            if steady else None),
        "summary": report["summary"],
        "envs": envs_of(run_dir),
        "curve": [{"wall_s": r["wall_s"], "env_steps": r["env_steps"], "return": r["return"],
                   "episode_length": r.get("episode_length")} for r in records],
    }


def envs_of(run_dir: Path) -> int | None:
    """How many envs a run stepped in all: its report's (``run.envs``: samplers that step
    together step fewer), else samplers x env.envs_per_sampler from its config."""
    import json

    import yaml

    from walle_ray.topology import parse_topology

    report = run_dir / "report.json"
    if report.is_file():
        envs = json.loads(report.read_text()).get("run", {}).get("envs")
        if envs:
            return int(envs)
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    cfg = yaml.safe_load(path.read_text())
    return parse_topology(cfg["topology"]["spec"]).samplers * cfg["env"]["envs_per_sampler"]


def midpoint_curve(result: dict) -> list[dict]:
    """The run's returns placed at the agent steps halfway through the episodes they average:
    an episode of L steps on one of E envs that share the samplers' pace ends about L x E
    agent steps after it began. With many envs on few cores that is a large shift (256 envs
    and 3000-step games: 0.38M agent steps), which the plain curve hides in its lag."""
    envs = result.get("envs") or 1
    return [{**p, "env_steps": p["env_steps"] - p["episode_length"] * envs / 2}
            for p in result["curve"] if p["return"] is not None and p.get("episode_length")]


def plot_curves(runs: dict[str, list[dict]], target: float, title: str, path: Path,
                midpoints: bool = False) -> None:
    """Return against agent steps (left) and against wall minutes (right), one colour per
    label, one line per run under it; with ``midpoints`` a third panel places each return at
    the agent steps halfway through the episodes it averages (``midpoint_curve``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 3 if midpoints else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5), sharey=True)
    by_steps, by_time = axes[0], axes[-1]
    for k, (label, results) in enumerate(runs.items()):
        colour = f"C{k}"
        for i, res in enumerate(results):
            pts = [p for p in res["curve"] if p["return"] is not None]
            kwargs = {"color": colour, "alpha": 0.9, "lw": 1.3,
                      "label": f"{label} ({len(results)} run{'s' if len(results) > 1 else ''})"
                      if i == 0 else None}
            by_steps.plot([p["env_steps"] / 1e6 for p in pts], [p["return"] for p in pts], **kwargs)
            by_time.plot([p["wall_s"] / 60 for p in pts], [p["return"] for p in pts], **kwargs)
            if midpoints:
                mid = midpoint_curve(res)
                axes[1].plot([p["env_steps"] / 1e6 for p in mid], [p["return"] for p in mid],
                             **{**kwargs, "label": None})
    labels = [(by_steps, "agent steps (millions), at the episodes' ends")]
    if midpoints:
        labels.append((axes[1], "agent steps (millions), halfway through the episodes"))
    labels.append((by_time, "wall minutes of training"))
    for ax, xlabel in labels:
        ax.axhline(target, ls="--", c="gray", lw=0.8)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    by_steps.set_ylabel("mean return of the last 20 games")
    by_steps.legend(fontsize=8, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)

"""Soak: IMPALA on Pong for a long run with a sampler killed every few minutes.

    python benchmarks/soak.py [--minutes 30] [--kill-every-s 120] [--baseline-minutes 10]

Runs ``python -m walle_ray algo=impala env=pong`` (42x42, 4 samplers) and, from this
process, joins its Ray instance to kill one sampler actor every ``--kill-every-s`` seconds
and to sample, every 15 s: resident memory of the driver and of each role (from
/proc/<pid>/status), the object store's use and spilling (Ray's memory summary), and the
run's own metrics (steps/s, restarts, lost fragments). A second run of
``--baseline-minutes`` without faults gives the steps/s to compare with. Writes
benchmarks/results/soak.json and soak.png.

Targets: memory flat within 10% (the last sample against the one at the end of minute 5),
no spilling, steps/s within 10% of the run without faults.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS, ROOT, write_result

ARGS = ["algo=impala", "env=pong", "env.obs_size=42", "topology=4a1m1l", "run.report_every_s=10",
        "run.total_env_steps=1000000000", "logger.progress=line", "logger.print_every_s=60"]


def rss_mb(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(match.group(1)) / 1024 if match else None


def object_store() -> dict:
    """Plasma use and spilled bytes from Ray's memory summary (MiB)."""
    from ray._private.internal_api import memory_summary

    text = memory_summary(stats_only=True)
    used = re.search(r"Plasma memory usage (\d+) MiB", text)
    spilled = re.search(r"Spilled (\d+) MiB", text)
    return {"plasma_mib": int(used.group(1)) if used else 0,
            "spilled_mib": int(spilled.group(1)) if spilled else 0}


def connect(namespace: str, timeout_s: float = 120) -> None:
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.init(address="auto", namespace=namespace, logging_level="ERROR")
            return
        except Exception:  # the run's Ray instance is still starting
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def roles() -> dict[str, int]:
    """name -> pid of the run's live named actors."""
    from ray.util.state import list_actors

    return {a.name: a.pid for a in list_actors(filters=[("state", "=", "ALIVE")], limit=1000)
            if a.name and a.name.startswith("walle/") and a.pid}


def run(minutes: float, kill_every_s: float | None, name: str) -> dict:
    import ray

    from walle_ray.logging.metrics import read_metrics

    run_dir = ROOT / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "walle_ray", *ARGS, f"run.max_wall_s={minutes * 60}",
           f"hydra.run.dir={run_dir}"]
    print("$", " ".join(cmd), flush=True)
    driver = subprocess.Popen(cmd, cwd=ROOT)
    connect(f"walle_ray-{name}")
    t0 = time.monotonic()
    samples, kills = [], []
    next_kill = kill_every_s
    rng = random.Random(0)
    while driver.poll() is None:
        time.sleep(15)
        now = time.monotonic() - t0
        try:
            pids = roles()
            store = object_store()
        except Exception as exc:  # the run is ending
            print("sample skipped:", exc, flush=True)
            continue
        sample = {"t_s": round(now, 1), "driver_rss_mb": rss_mb(driver.pid), **store,
                  "roles_rss_mb": {n: rss_mb(p) for n, p in sorted(pids.items())}}
        samples.append(sample)
        if kill_every_s and next_kill <= now < minutes * 60 - 30:  # none as the run ends
            samplers = sorted(n for n in pids if n.startswith("walle/sampler-"))
            victim = rng.choice(samplers)
            ray.kill(ray.get_actor(victim), no_restart=False)
            kills.append({"t_s": round(now, 1), "sampler": victim})
            print(f"killed {victim} at {now:.0f} s", flush=True)
            next_kill += kill_every_s
    ray.shutdown()
    records = read_metrics(run_dir / "metrics.jsonl")
    started = max(0.0, samples[0]["t_s"] - 15) if samples else 0.0
    return {"command": " ".join(cmd[1:]), "exit_code": driver.returncode, "samples": samples,
            "kills": kills, "records": records, "run_dir": str(run_dir),
            # the training loop's end on this clock: its wall time after the process start
            "ended_s": records[-1]["wall_s"] + started}


def summary(result: dict, warmup_s: float = 300) -> dict:
    records, samples = result["records"], result["samples"]
    steady = [r for r in records if r["wall_s"] >= 60]
    span = steady[-1]["wall_s"] - steady[0]["wall_s"]
    rate = (steady[-1]["env_steps"] - steady[0]["env_steps"]) / span
    # Resident memory moves by several percent from one 15-s sample to the next (allocator
    # arenas, torch's caches), so growth compares the mean of the window that follows the
    # warm-up with the mean of the last window of the same length.
    after = [s for s in samples if s["t_s"] >= warmup_s] or samples
    window = max(1, min(20, len(after) // 3))
    head, tail = after[:window], after[-window:]

    def mean(rows: list[dict], pick) -> float | None:
        values = [v for v in map(pick, rows) if v is not None]
        return sum(values) / len(values) if values else None

    def growth(pick) -> float | None:
        a, b = mean(head, pick), mean(tail, pick)
        return None if not a or b is None else b / a - 1

    last = after[-1]
    roles = {n: growth(lambda s, n=n: s["roles_rss_mb"].get(n))
             for n in last["roles_rss_mb"] if not n.startswith("walle/sampler-")}
    samplers = [v for n, v in last["roles_rss_mb"].items() if n.startswith("walle/sampler-")]
    end_s = result.get("ended_s", float("inf"))
    return {"steps_per_s": rate, "env_steps": records[-1]["env_steps"],
            "kills_during_run": sum(k["t_s"] < end_s for k in result["kills"]),
            "sampler_restarts": records[-1].get("faults/sampler_restarts", 0),
            "lost_fragments": records[-1].get("faults/lost_fragments", 0),
            "dropped_fragments": records[-1].get("dropped_fragments", 0),
            "return_last": records[-1].get("return"),
            "driver_rss_growth": growth(lambda s: s["driver_rss_mb"]),
            "driver_rss_mb": [mean(head, lambda s: s["driver_rss_mb"]),
                              mean(tail, lambda s: s["driver_rss_mb"])],
            "role_rss_growth": roles, "sampler_rss_mb_last": samplers,
            "plasma_mib_max": max(s["plasma_mib"] for s in samples),
            "spilled_mib_max": max(s["spilled_mib"] for s in samples),
            "memory_windows_s": [[head[0]["t_s"], head[-1]["t_s"]], [tail[0]["t_s"], tail[-1]["t_s"]]]}


def plot(faulty: dict, baseline: dict | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for result, label in ((faulty, "sampler killed every 2 min"), (baseline, "no faults")):
        if result is None:
            continue
        recs = [r for r in result["records"] if r.get("env_steps_per_s") is not None]
        a.plot([r["wall_s"] / 60 for r in recs], [r["env_steps_per_s"] for r in recs], label=label)
    for kill in faulty["kills"]:
        a.axvline(kill["t_s"] / 60, c="gray", lw=0.5)
    a.set_xlabel("minutes")
    a.set_ylabel("env steps/s")
    a.legend()
    samples = faulty["samples"]
    t = [s["t_s"] / 60 for s in samples]
    b.plot(t, [s["driver_rss_mb"] for s in samples], label="driver")
    names = sorted({n for s in samples for n in s["roles_rss_mb"] if not n.startswith("walle/sampler-")})
    for n in names:
        b.plot(t, [s["roles_rss_mb"].get(n) for s in samples], label=n)
    b.plot(t, [s["plasma_mib"] for s in samples], "--", label="object store")
    b.set_xlabel("minutes")
    b.set_ylabel("MiB")
    b.legend(fontsize=7)
    fig.suptitle("IMPALA Pong soak, 2 CPU cores")
    fig.tight_layout()
    fig.savefig(RESULTS / "soak.png", dpi=100)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--kill-every-s", type=float, default=120)
    p.add_argument("--baseline-minutes", type=float, default=10)
    p.add_argument("--summarize", action="store_true",
                   help="recompute the summary from the last soak.json and its run directories")
    args = p.parse_args()
    if args.summarize:
        faulty, baseline = reload()
    else:
        faulty = run(args.minutes, args.kill_every_s, "bench_soak_faults")
        baseline = (run(args.baseline_minutes, None, "bench_soak_baseline")
                    if args.baseline_minutes else None)
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(faulty, baseline)
    s = summary(faulty)
    base = summary(baseline, warmup_s=60) if baseline else None
    mem_growth = [g for g in [s["driver_rss_growth"], *s["role_rss_growth"].values()] if g is not None]
    checks = {
        "memory_flat_10pct": all(abs(g) <= 0.10 for g in mem_growth),
        "no_spilling": s["spilled_mib_max"] == 0,
        "steps_per_s_within_10pct": base is not None and s["steps_per_s"] >= 0.9 * base["steps_per_s"],
        "restarts_match_kills": s["sampler_restarts"] == s["kills_during_run"],
    }
    write_result("soak", {
        "command": "python benchmarks/soak.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "summarize"),
        "target": {"memory_growth_max": 0.10, "spilled_mib": 0, "steps_per_s_vs_baseline": 0.9},
        "faults": s, "baseline": base, "checks": checks, "met_target": all(checks.values()),
        "kills": faulty["kills"], "ended_s": faulty["ended_s"], "samples": faulty["samples"],
        "baseline_samples": baseline["samples"] if baseline else None,
    })


def reload() -> tuple[dict, dict | None]:
    """The two runs of the last soak, from soak.json and the metrics of their run directories."""
    import json

    from walle_ray.logging.metrics import read_metrics

    saved = json.loads((RESULTS / "soak.json").read_text())
    faulty = {"samples": saved["samples"], "kills": saved["kills"],
              "records": read_metrics(ROOT / "runs" / "bench_soak_faults" / "metrics.jsonl")}
    started = max(0.0, faulty["samples"][0]["t_s"] - 15)
    faulty["ended_s"] = saved.get("ended_s", faulty["records"][-1]["wall_s"] + started)
    base_dir = ROOT / "runs" / "bench_soak_baseline"
    baseline = None
    if (base_dir / "metrics.jsonl").is_file():
        samples = saved.get("baseline_samples") or faulty["samples"][:1]  # memory: see faults
        baseline = {"samples": samples, "kills": [],
                    "records": read_metrics(base_dir / "metrics.jsonl")}
    return faulty, baseline


if __name__ == "__main__":
    main()

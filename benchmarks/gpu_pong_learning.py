"""IMPALA on Pong with its learner on a GPU, to a score: the preset as shipped.

    python benchmarks/gpu_pong_learning.py [--topology 8a2m1l] [--target 17] [--seconds 480]

One ``python -m walle_ray algo=impala env=pong topology=<t> learner.num_gpus=1`` run (on a GPU
machine) until its mean return reaches ``--target`` or ``--seconds`` pass, with ``nvidia-smi``
asked every two seconds which processes hold GPU memory. The result keeps the run's own
milestones (minutes, agent steps, core-hours and GPU-hours to each score), its cost, the
end-of-run verdict and the curve. Writes benchmarks/results/<--name>.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time

from common import ROOT, steady_consumed_rate, write_result
from gpu_check import GpuWatch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topology", default="8a2m1l")
    p.add_argument("--target", type=float, default=17.0)
    p.add_argument("--seconds", type=float, default=480.0, help="the run's run.max_wall_s")
    p.add_argument("--name", default="gpu_pong_learning")
    p.add_argument("--note", default="")
    args = p.parse_args()
    from walle_ray.logging.metrics import read_metrics

    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    run_dir = ROOT / "runs" / args.name
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = ["algo=impala", "env=pong", f"topology={args.topology}", "learner.num_gpus=1",
                 f"run.stop_at_return={args.target}", f"run.max_wall_s={args.seconds}"]
    cmd = [sys.executable, "-m", "walle_ray", *overrides, f"hydra.run.dir={run_dir}",
           "logger.progress=line", "logger.print_every_s=30"]
    print("$", " ".join(cmd), flush=True)
    watch = GpuWatch()
    watch.start()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          timeout=args.seconds + 240)
    wall = time.perf_counter() - t0
    watch.stop.set()
    watch.join()
    print(proc.stdout[-4000:], proc.stderr[-3000:], sep="\n", flush=True)
    records = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    report = json.loads((run_dir / "report.json").read_text()) if (run_dir / "report.json").exists() else {}
    last = records[-1] if records else {}
    keep = ("wall_s", "env_steps", "env_steps_consumed", "return", "updates", "policy_lag_mean")
    write_result(args.name, {
        "gpu": gpu, "command": "python -m walle_ray " + " ".join(overrides),
        "note": args.note, "exit_code": proc.returncode, "wall_s_process": wall,
        "target": args.target, "milestones": report.get("milestones"), "cost": report.get("cost"),
        "steady_consumed_per_s": steady_consumed_rate(records, warmup=30.0),
        "final": {k: last.get(k) for k in ("env_steps", "updates", "return", "wall_s")},
        "verdict": report.get("verdict"), "advice": report.get("advice"),
        "gpu_processes": watch.apps,
        "gpu_util_mean": sum(watch.util) / len(watch.util) if watch.util else None,
        "log": [line for line in proc.stdout.splitlines() if line.startswith("walle_ray:")][:40],
        "curve": [{k: r.get(k) for k in keep} for r in records],
    })


if __name__ == "__main__":
    main()

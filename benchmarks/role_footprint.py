"""What one role process holds in memory: the figure the start-up check of a run's plan
multiplies by the processes it would start (``walle_ray/memory_plan.py``).

    python benchmarks/role_footprint.py [--settle-s 10] [--wall-s 120]

Runs a few small ``python -m walle_ray`` commands with one process per role
(``topology.pack=off``) and, once the first learner update is reported and ``--settle-s``
seconds have passed, measures every process the command started: each role process (by the
title Ray gives it, ``ray::SamplerWorker`` and the like), Ray's own processes and the
driver. Per process it records the proportional set size (PSS: shared pages split among
the processes sharing them, so the sum over processes counts them once), the unique set
size (USS) and the resident set size (RSS). Then it stops the run with SIGTERM. Writes
benchmarks/results/role_footprint.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

import psutil

from common import ROOT, write_result

MIB = 2 ** 20
CASES = {
    "ppo_cartpole_8a1m1l": ["algo=ppo", "env=cartpole", "topology=8a1m1l"],
    "impala_cartpole_4a2m1l": ["algo=impala", "env=cartpole", "topology=4a2m1l"],
    "impala_pong_4a2m1l": ["algo=impala", "env=pong", "env.obs_size=42", "topology=4a2m1l"],
}


ROLES = ("SamplerWorker", "LearnerWorker", "AsyncMemoryWorker", "ParameterServerWorker")


def role_of(process: psutil.Process) -> str | None:
    """The class of a role process (``SamplerWorker``, ...) from the title Ray gives it
    (``ray::SamplerWorker.run``), else None."""
    try:
        title = " ".join(process.cmdline())
    except psutil.Error:
        return None
    name = title.removeprefix("ray::").split(".")[0].split()[0] if title.startswith("ray::") else ""
    return name if name in ROLES else None


def sizes(process: psutil.Process) -> dict | None:
    try:
        info = process.memory_full_info()
    except psutil.Error:
        return None
    return {"pss_mib": info.pss / MIB, "uss_mib": info.uss / MIB, "rss_mib": info.rss / MIB}


def measure(name: str, args: list[str], settle_s: float, wall_s: float) -> dict:
    run_dir = ROOT / "runs" / f"bench_role_footprint_{name}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "walle_ray", *args, "topology.pack=off",
           f"run.max_wall_s={wall_s}", "run.total_env_steps=1000000000",
           "run.stop_at_return=null", "logger.progress=off", f"hydra.run.dir={run_dir}"]
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        if "first learner update" in line:
            break
    time.sleep(settle_s)
    driver = psutil.Process(proc.pid)
    roles, others = [], []
    for process in driver.children(recursive=True):
        measured = sizes(process)
        if measured is None:
            continue
        role = role_of(process)
        if role is None:
            others.append({"name": process.name(), **measured})
        else:
            roles.append({"role": role, **measured})
    own = sizes(driver)
    proc.terminate()  # a clean stop: the run leaves its checkpoint and ends
    lines.extend(line.rstrip() for line in proc.stdout)
    proc.wait()
    if not roles:
        raise SystemExit(f"{name}: no role process was alive to measure; raise --wall-s")
    pss = [r["pss_mib"] for r in roles]
    return {"command": " ".join(cmd[1:]), "roles": roles, "others": others, "driver": own,
            "role_processes": len(roles), "role_pss_mib_median": statistics.median(pss),
            "role_pss_mib_max": max(pss),
            "others_pss_mib": sum(o["pss_mib"] for o in others),
            "lines": [line for line in lines if line.startswith("walle_ray:")][:12]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settle-s", type=float, default=10.0,
                        help="seconds after the first learner update before measuring")
    parser.add_argument("--wall-s", type=float, default=120.0, help="wall budget of each run")
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    runs = {name: measure(name, CASES[name], args.settle_s, args.wall_s) for name in args.cases}
    for name, run in runs.items():
        print(f"{name}: {run['role_processes']} role processes, PSS median "
              f"{run['role_pss_mib_median']:.0f} MiB, max {run['role_pss_mib_max']:.0f} MiB; "
              f"Ray's own processes {run['others_pss_mib']:.0f} MiB", flush=True)
    write_result("role_footprint", {"runs": runs}, args.dry_run)


if __name__ == "__main__":
    main()

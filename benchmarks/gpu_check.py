"""The GPU learner path, checked on a machine with a GPU: real runs with ``learner.num_gpus``.

    python benchmarks/gpu_check.py [--seconds 90] [--name gpu_check]

Each case is a short
``python -m walle_ray`` run (IMPALA on Pong, with an LSTM core too, Ape-X on Pong, PPO on
CartPole and on HalfCheetah with its preset, IMPALA and DQN on Taxi with its action mask)
with its learners on the GPU; samplers stepped together in lanes processes; two learners
share the GPU; the first run's
checkpoint is resumed on the GPU and on the CPU. While it runs, ``nvidia-smi`` is asked every two
seconds which processes hold GPU memory. A case passes when the run ends by its wall-clock
budget (or its return target) with learner updates made, its learner processes and no
other process on the GPU, and a final checkpoint written. Last, the learners' NCCL
reductions in a group of one. Writes benchmarks/results/<--name>.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import ROOT, write_result

CASES = {
    "impala_pong_1gpu": ["algo=impala", "env=pong", "topology=8a2m1l", "learner.num_gpus=1"],
    "apex_pong_1gpu": ["algo=apex", "env=pong", "topology=8a2m1l", "learner.num_gpus=1"],
    "ppo_cartpole_1gpu": ["algo=ppo", "env=cartpole", "topology=4a1m1l", "learner.num_gpus=1"],
    # The HalfCheetah preset: an observation normaliser on the GPU, and algo.compile (inductor
    # for CUDA).
    "ppo_halfcheetah_1gpu": ["algo=ppo", "env=halfcheetah", "topology=4a1m1l", "learner.num_gpus=1"],
    # Two learners share the one GPU: NCCL refuses two ranks on one device, so they reduce
    # with gloo through the CPU.
    "impala_pong_2learners_1gpu": ["algo=impala", "env=pong", "topology=8a2m2l",
                                   "learner.num_gpus=0.5"],
    # A recurrent core on the GPU: its state, burn-in and replayed sequences on CUDA tensors.
    "impala_pong_lstm_1gpu": ["algo=impala", "env=pong", "topology=8a2m1l", "model.core=lstm",
                              "learner.num_gpus=1"],
    # Samplers stepped together in lanes processes (32 logical samplers in 4 processes), their
    # fragments dealt across 4 memories, for a learner on the GPU.
    "impala_pong_lanes_1gpu": ["algo=impala", "env=pong", "topology=32a4m1l", "topology.pack=4",
                               "learner.num_gpus=1"],
    # Action masks on the GPU: IMPALA's masked policy, DQN's masked greedy targets.
    "impala_taxi_mask_1gpu": ["algo=impala", "env=taxi", "topology=4a1m1l", "learner.num_gpus=1"],
    "dqn_taxi_mask_1gpu": ["algo=dqn", "env=taxi", "topology=4a1m1l", "learner.num_gpus=1"],
    # The first run's checkpoint, resumed with its learner on the GPU, then on the CPU.
    "impala_pong_resumed_on_gpu": ["run.resume=runs/gpu_impala_pong_1gpu"],
    "impala_pong_resumed_on_cpu": ["run.resume=runs/gpu_impala_pong_1gpu", "learner.num_gpus=0"],
}
RESUMES = {"impala_pong_resumed_on_gpu": "impala_pong_1gpu",
           "impala_pong_resumed_on_cpu": "impala_pong_1gpu"}


def process_title(pid: str) -> str | None:
    """A process's title as ps shows it (Ray's workers set theirs to ``ray::<Class>...``)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip() or None
    except OSError:
        return None


class GpuWatch(threading.Thread):
    """Polls nvidia-smi for the processes holding GPU memory, and the GPU's utilization."""

    def __init__(self, every_s: float = 2.0):
        super().__init__(daemon=True)
        self.every_s, self.stop, self.apps, self.util = every_s, threading.Event(), {}, []

    def _query(self, what: str) -> list[str]:
        out = subprocess.run(["nvidia-smi", f"--query-{what}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            for line in self._query("compute-apps=pid,process_name,used_memory"):
                pid, name, mib = [s.strip() for s in line.split(",")]
                seen = self.apps.get(pid, {})
                # nvidia-smi may say "[No data]", and a process that is exiting has no title:
                # the last title read while it ran stands
                title = process_title(pid)
                name = title if title and "IDLE" not in title else seen.get("name") or title or name
                self.apps[pid] = {"name": name, "max_mib": max(int(mib), seen.get("max_mib", 0))}
            for line in self._query("gpu=utilization.gpu"):
                self.util.append(int(line))


def run_case(name: str, overrides: list[str], seconds: float, resumed_at: int | None) -> dict:
    """One run; ``resumed_at``: the env steps of the checkpoint it resumes from."""
    from walle_ray.logging.metrics import read_metrics

    run_dir = ROOT / "runs" / f"gpu_{name}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a run directory is never reused
    cmd = [sys.executable, "-m", "walle_ray", *overrides, f"run.max_wall_s={seconds}",
           f"hydra.run.dir={run_dir}", "logger.progress=line", "logger.print_every_s=15"]
    print("$", " ".join(cmd), flush=True)
    watch = GpuWatch()
    watch.start()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 240)
    wall = time.perf_counter() - t0
    watch.stop.set()
    watch.join()
    print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", flush=True)
    metrics_path = run_dir / "metrics.jsonl"
    records = read_metrics(metrics_path) if metrics_path.exists() else []
    last = records[-1] if records else {}
    err_lines = [line for line in proc.stderr.splitlines() if line.strip()]
    result = {
        "command": "python -m walle_ray " + " ".join(overrides + [f"run.max_wall_s={seconds}"]),
        "exit_code": proc.returncode, "wall_s_process": wall,
        "startup_lines": [line for line in proc.stdout.splitlines() if line.startswith("walle_ray:")][:12],
        "last_error_line": err_lines[-1] if err_lines else None,
        # asynchronous runs count updates; synchronous ones (PPO) carry the learner's version
        "updates": last.get("updates") or last.get("learn/version"),
        "env_steps": last.get("env_steps"),
        "consumed_per_s": last.get("consumed_per_s"), "learner_busy": last.get("learner_busy"),
        "return": last.get("return"),
        "gpu_processes": watch.apps,
        "gpu_util_mean": sum(watch.util) / len(watch.util) if watch.util else None,
        "checkpoint": (run_dir / "checkpoints" / "last.pt").exists(),
    }
    if (run_dir / "report.json").exists():
        result["advice"] = json.loads((run_dir / "report.json").read_text())["advice"]
    learners_on_gpu = [a for a in watch.apps.values() if "LearnerWorker" in a["name"]]
    # Only learners hold the GPU: not the driver (which may run on a node without one), nor
    # samplers or memories.
    result["only_learners_on_gpu"] = len(learners_on_gpu) == len(watch.apps)
    on_gpu = "learner.num_gpus=0" not in overrides
    result["passed"] = (proc.returncode == 0 and bool(result["updates"])
                        and bool(learners_on_gpu) == on_gpu and result["only_learners_on_gpu"]
                        and result["checkpoint"])
    if resumed_at is not None:  # the counters went on from the checkpoint's
        result["resumed_at_env_steps"] = resumed_at
        result["passed"] = result["passed"] and (result["env_steps"] or 0) > resumed_at
    return result


def nccl_check() -> dict:
    """The learners' NCCL reductions in one process, a group of one on the one GPU (NCCL
    refuses two ranks on one device): sums, minimums, averaged gradients and a broadcast on
    CUDA tensors come back as they went, and the time in them is counted."""
    import socket

    import torch

    from walle_ray.learners.collective import TorchCollective

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    group = TorchCollective("127.0.0.1", port, rank=0, world_size=1, backend="nccl", timeout_s=60)
    try:
        x = torch.arange(6.0, device="cuda")
        net = torch.nn.Linear(4, 3).cuda()
        net(torch.ones(5, 4, device="cuda")).sum().backward()
        grads = [p.grad.clone() for p in net.parameters()]
        group.all_reduce_grads(net.parameters())
        weights = [p.detach().clone() for p in net.parameters()]
        group.broadcast_([p.data for p in net.parameters()])
        checks = {
            "sum": torch.equal(group.all_reduce_sum(x), x),
            "min": torch.equal(group.all_reduce_min(x), x),
            "mean": torch.equal(group.all_reduce_mean(x), x),
            "grads": all(torch.equal(g, p.grad) for g, p in zip(grads, net.parameters())),
            "broadcast": all(torch.equal(w, p) for w, p in zip(weights, net.parameters())),
            "device_kept": group.all_reduce_sum(x).is_cuda,
            "wait_counted": group.take_wait_s() > 0,
        }
    finally:
        group.close()
    return {"checks": checks, "passed": all(checks.values())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=90.0, help="each run's run.max_wall_s")
    p.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    p.add_argument("--name", default="gpu_check", help="result file name")
    args = p.parse_args()
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    cases, nccl = {}, {"passed": None, "checks": "not yet run"}
    for name in args.cases:
        source = RESUMES.get(name)
        resumed_at = cases[source]["env_steps"] if source in cases else None
        if source and resumed_at is None:
            raise SystemExit(f"{name} resumes {source}: run that case first (--cases {source} {name})")
        cases[name] = run_case(name, CASES[name], args.seconds, resumed_at)
        print(name, "passed" if cases[name]["passed"] else "FAILED", flush=True)
        so_far = all(c["passed"] for c in cases.values()) and nccl["passed"]
        write_result(args.name, {"gpu": gpu, "nccl_one_rank": nccl, "cases": cases, "passed": so_far})
    # Last: this process holds GPU memory from here, which the cases' watch would count.
    try:
        nccl = nccl_check()
    except Exception as exc:  # recorded as failed, with the cases' results kept
        nccl = {"passed": False, "error": f"{type(exc).__name__}: {exc}"}
    print("nccl", nccl, flush=True)
    passed = all(c["passed"] for c in cases.values()) and nccl["passed"]
    write_result(args.name, {"gpu": gpu, "nccl_one_rank": nccl, "cases": cases, "passed": passed})
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()

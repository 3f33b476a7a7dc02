"""A learner lost in the middle of learning, with two learners sharing the GPU.

    python benchmarks/gpu_learner_loss.py [--seconds 110] [--name gpu_learner_loss]

On a machine with a GPU: ``algo=impala env=pong topology=8a2m2l learner.num_gpus=0.5`` (two
learners on the one GPU, reducing with gloo) runs in this process's Ray instance; once the
learners have made 200 updates and a checkpoint, ``walle/learner-1`` is killed. It passes
when the run rebuilt every role from that checkpoint once and went on learning to its
wall-clock budget. Writes benchmarks/results/<--name>.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time

from common import ROOT, write_result

OVERRIDES = ["algo=impala", "env=pong", "topology=8a2m2l", "learner.num_gpus=0.5",
             "run.total_env_steps=100000000", "run.stop_at_return=null", "run.report_every_s=1",
             "run.checkpoint_every=3", "logger.progress=line", "logger.ray_metrics=false"]


def records(run_dir) -> list[dict]:
    """The run's metrics so far (a torn last line skipped); none before its first record."""
    from walle_ray.logging.metrics import read_metrics

    path = run_dir / "metrics.jsonl"
    return read_metrics(path) if path.exists() else []


def main() -> None:
    import ray
    from hydra import compose, initialize_config_dir

    from walle_ray.algos import register_configs
    from walle_ray.config import CONF_DIR
    from walle_ray.runtime.train import train

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=110.0, help="the run's run.max_wall_s")
    p.add_argument("--name", default="gpu_learner_loss", help="result file name")
    args = p.parse_args()
    overrides = [*OVERRIDES, f"run.max_wall_s={args.seconds}"]
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=overrides)
    run_dir = ROOT / "runs" / args.name
    shutil.rmtree(run_dir, ignore_errors=True)
    ray.init(namespace=args.name, include_dashboard=False)
    killed = []

    def kill_once_learning() -> None:
        """After a checkpoint made once the learners have 200 updates."""
        while not ((run_dir / "checkpoints" / "last.pt").exists() and any(
                r["updates"] > 200 and r["iteration"] % 3 == 0 for r in records(run_dir))):
            time.sleep(0.2)
        time.sleep(0.5)
        ray.kill(ray.get_actor("walle/learner-1"))
        killed.append(time.time())

    threading.Thread(target=kill_once_learning, daemon=True).start()
    result = train(cfg, run_dir)
    rows = records(run_dir)
    before = [r for r in rows if not r.get("faults/role_restarts")]
    out = {"command": "python -m walle_ray " + " ".join(overrides) + " (learner-1 killed)",
           "stopped_by": result.stopped_by, "restarts": result.counters.get("restarts"),
           "killed": bool(killed), "updates_at_kill": before[-1]["updates"] if before else None,
           "updates_last": rows[-1]["updates"], "env_steps_last": rows[-1]["env_steps"],
           "records_after_rebuild": len(rows) - len(before)}
    out["passed"] = bool(killed and out["restarts"] == 1 and len(rows) > len(before)
                         and out["updates_last"] > (out["updates_at_kill"] or 0))
    print("RESULT", json.dumps(out), flush=True)
    write_result(args.name, out)
    raise SystemExit(0 if out["passed"] else 1)


if __name__ == "__main__":
    main()

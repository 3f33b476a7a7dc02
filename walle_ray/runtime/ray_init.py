"""Start a local Ray instance or join a cluster; turn role classes into Ray actors."""

from __future__ import annotations

import logging
import os

from walle_ray.config import ConfigError


def start_ray(address: str | None, num_cpus: int | None, namespace: str) -> None:
    """Join ``address`` (or RAY_ADDRESS, or the job's cluster) if given, else start locally.

    A local instance binds its dashboard to 127.0.0.1; set RAY_DASHBOARD_HOST (e.g. 0.0.0.0)
    to reach it from other machines.
    """
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs = dict(namespace=namespace, logging_level=logging.ERROR, log_to_driver=True)
    if address:
        context = ray.init(address=address, **kwargs)
    else:
        host = os.environ.get("RAY_DASHBOARD_HOST", "127.0.0.1")
        context = ray.init(num_cpus=num_cpus, include_dashboard=True, dashboard_host=host,
                           **kwargs)
    if context.dashboard_url:
        print(f"walle_ray: Ray dashboard at http://{context.dashboard_url} (actors walle/*, "
              "metrics walle_*)", flush=True)


def cluster_resources() -> tuple[float, float]:
    """(CPUs, GPUs) of the whole cluster."""
    import ray

    res = ray.cluster_resources()
    return float(res.get("CPU", 0.0)), float(res.get("GPU", 0.0))


def check_gpus(learners: int, gpus_per_learner: float, cluster_gpus: float) -> None:
    """Fail now, with a message, rather than wait forever for GPUs that do not exist."""
    need = learners * gpus_per_learner
    if need > cluster_gpus:
        raise ConfigError(
            f"learner.num_gpus={gpus_per_learner:g} asks for {need:g} GPUs for {learners} "
            f"learner(s), but the Ray cluster has {cluster_gpus:g}; set learner.num_gpus=0 to "
            "train on CPUs, or add GPU nodes to the cluster")

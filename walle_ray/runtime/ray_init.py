"""Start a local Ray instance or join a cluster, and check that it has the GPUs and custom
resources the roles ask for (``runtime/remote.py`` turns the roles into Ray actors)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from walle_ray.config import ConfigError


def start_ray(address: str | None, num_cpus: int | None, namespace: str) -> None:
    """Join ``address`` (or RAY_ADDRESS, or the job's cluster) if given, else start locally.

    "local", Ray's word for a new local instance, starts one as no address does, and
    tells Ray so: it then neither reads RAY_ADDRESS nor joins an instance ``ray start``
    left on this machine.

    A local instance binds its dashboard to 127.0.0.1; set RAY_DASHBOARD_HOST (e.g. 0.0.0.0)
    to reach it from other machines. Its node address is the loopback one
    (``loopback_node``), so that its other servers, the Prometheus endpoints that answer
    without Ray's token among them, are not reachable from other machines either.
    """
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs = dict(namespace=namespace, logging_level=logging.ERROR, log_to_driver=True)
    with keep_python_handlers():
        if address and address != "local":
            context = ray.init(address=address, **kwargs)
        else:
            host = os.environ.get("RAY_DASHBOARD_HOST", "127.0.0.1")
            missing = dashboard_missing()
            if missing:
                print(f"walle_ray: no Ray dashboard: {missing}", flush=True)
            with own_session(), loopback_node():
                context = ray.init(address=address, num_cpus=num_cpus, include_dashboard=not missing,
                                   dashboard_host=host, _node_ip_address="127.0.0.1", **kwargs)
    if context.dashboard_url:
        print("\n".join(dashboard_lines(context.dashboard_url, auth_mode())), flush=True)


def dashboard_missing() -> str | None:
    """Why the local Ray instance cannot have its dashboard (Ray installed without its
    ``default`` extra), or None when it can: the run then goes on without it."""
    try:
        import ray.dashboard.optional_deps  # noqa: F401  (Ray's own check)
    except ImportError as e:
        return f"{e} (pip install 'ray[default]' brings the dashboard's packages)"
    return None


@contextlib.contextmanager
def own_session() -> Iterator[None]:
    """Start the local Ray instance's processes (GCS, raylet, dashboard, and through the
    raylet every role) in a session of their own.

    Ray blocks SIGINT in them but not SIGTERM, so a SIGTERM sent to the driver's whole
    process group (``timeout``, ``kill -TERM -<pgid>``) would kill every role while the
    driver is still writing its final checkpoint. In their own session only the driver gets
    it; they still die with the driver (the kernel's fate sharing, which Ray sets up on
    Linux) and at ``ray.shutdown()``. Elsewhere Ray's fallback reaper finds them by process
    group, so they stay in the driver's.
    """
    from ray._private import services, utils

    if not (sys.platform.startswith("linux") and utils.detect_fate_sharing_support()):
        yield
        return
    base = services.ConsolePopen

    class SessionPopen(base):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = SessionPopen
    try:
        yield
    finally:
        services.ConsolePopen = base


@contextlib.contextmanager
def loopback_node() -> Iterator[None]:
    """Let ``ray.init(_node_ip_address="127.0.0.1")`` keep the loopback address it is given.

    On Linux Ray replaces a loopback node address with the machine's outward one, and its
    servers listen there or on every interface; the dashboard's and the metrics agent's
    Prometheus endpoints then answer anyone without the token. Where clusters are off (its
    default on macOS and Windows) Ray keeps the loopback address, and every server of the
    instance binds to it. They are off here only while ``ray.init`` starts this process's own
    instance; a driver joining a cluster later finds its own address again.
    """
    from ray._private import ray_constants

    base = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    if base is None:  # a Ray without the switch: it keeps the address as it sees fit
        yield
        return
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = base


@contextlib.contextmanager
def keep_python_handlers() -> Iterator[None]:
    """Keep this process's Python handlers for SIGINT and SIGTERM (a run's clean stop,
    runtime/signals.py) while ``ray.init`` runs: it would install its own SIGTERM handler,
    which exits at once, from its first lines, and its core worker a C++ one for failure
    signals, SIGTERM among them, which can abort the driver while the roles start. Neither is
    installed in this process; Ray's role processes keep theirs."""
    from ray._private import ray_constants, utils

    main = threading.current_thread() is threading.main_thread()
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    base = utils.set_sigterm_handler
    failure_handler = getattr(ray_constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", False)
    if callable(kept.get(signal.SIGTERM)):
        utils.set_sigterm_handler = lambda handler: None
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True  # read as the driver connects
    try:
        yield
    finally:
        utils.set_sigterm_handler = base
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = failure_handler
        for sig, handler in kept.items():
            if callable(handler):
                signal.signal(sig, handler)


def auth_mode() -> str:
    """Ray's authentication mode in this process after ``ray.init``: "token" or "disabled".

    Since Ray 2.59 a local ``ray.init()`` turns token auth on unless RAY_AUTH_MODE says
    otherwise, and sets RAY_AUTH_MODE=token in this process when it does.
    """
    try:
        from ray._private.authentication.authentication_utils import is_token_auth_enabled

        return "token" if is_token_auth_enabled() else "disabled"
    except ImportError:  # a Ray without token auth
        return "token" if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" else "disabled"


def token_location(environ: Mapping[str, str] | None = None, home: Path | None = None) -> str:
    """Where Ray reads the auth token from, in its order: RAY_AUTH_TOKEN, the file named by
    RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token (which a local ``ray.init()`` creates)."""
    environ = os.environ if environ is None else environ
    if environ.get("RAY_AUTH_TOKEN"):
        return "the RAY_AUTH_TOKEN variable"
    if environ.get("RAY_AUTH_TOKEN_PATH"):
        return environ["RAY_AUTH_TOKEN_PATH"]
    return str((Path.home() if home is None else home) / ".ray" / "auth_token")


def dashboard_lines(url: str, mode: str, environ: Mapping[str, str] | None = None,
                    home: Path | None = None) -> list[str]:
    """The start-up lines about the dashboard: its address and, when Ray's token auth is on,
    how to get in. Never the token itself: run output ends up in logs and CI artefacts."""
    url = url if "://" in url else f"http://{url}"
    lines = [f"walle_ray: Ray dashboard at {url} (actors walle/*, metrics walle_*)"]
    if mode == "token":
        lines.append("walle_ray: Ray token auth is on; when the dashboard asks, paste the output "
                     f"of `ray get-auth-token` (the token in {token_location(environ, home)})")
    return lines


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


def check_role_resources(resources, processes: Mapping[str, int],
                         nodes: list[Mapping[str, float]]) -> None:
    """Fail now, with a message, rather than wait forever for a custom resource
    (``topology.resources``) that no node of the cluster has enough of for one process of
    a role, or that the cluster has too little of for all ``processes[role]`` of them."""
    for role, asks in (resources or {}).items():
        count = processes.get(role, 0)
        for name, amount in (asks or {}).items():
            total = sum(node.get(name, 0.0) for node in nodes)
            largest = max((node.get(name, 0.0) for node in nodes), default=0.0)
            if count and (largest < amount or total < count * amount):
                raise ConfigError(
                    f"topology.resources.{role}.{name}: {count} {role} process(es) ask for "
                    f"{amount:g} '{name}' each and the Ray cluster's nodes have "
                    f"{total:g} (at most {largest:g} on one node); start nodes with "
                    f"ray start --resources='{{\"{name}\": N}}', ask for less, or leave it out")


def live_nodes() -> dict[str, dict]:
    """The cluster's live nodes: node id -> Ray's record of it (``NodeManagerAddress``,
    ``Resources``)."""
    import ray

    return {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}


def settle_nodes(timeout_s: float = 120.0, answer_s: float = 10.0) -> list[str]:
    """Wait until every node Ray lists as alive answers a task pinned to it, or Ray marks it
    dead, for at most ``timeout_s``; returns the nodes that never answered. A node lost a
    moment ago stays listed as alive until its heartbeats have been missed for a while, and
    roles placed on it meanwhile would never start; a rebuild after a lost role waits here."""
    import time

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ping = ray.remote(num_cpus=0, max_retries=0)(_answer)
    deadline = time.monotonic() + timeout_s
    while True:
        alive = list(live_nodes())
        calls = {ping.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            node_id, soft=False)).remote(): node_id for node_id in alive}
        ready, waiting = ray.wait(list(calls), num_returns=len(calls), timeout=answer_s)
        for ref in waiting:
            ray.cancel(ref, force=True)
        silent = [calls[ref] for ref in waiting]
        if not silent or time.monotonic() > deadline:
            return silent
        print(f"walle_ray: waiting for {len(silent)} node(s) that do not answer to come back "
              f"or be marked dead: {', '.join(n[:8] for n in silent)}", file=sys.stderr,
              flush=True)
        time.sleep(2.0)


def _answer() -> bool:
    return True


def placement_lines(placement: Mapping[str, str], nodes: Mapping[str, dict]) -> list[str]:
    """One start-up line per node, naming the role processes on it (by their short name)."""
    by_node: dict[str, list[str]] = {}
    for role, node in placement.items():
        by_node.setdefault(node, []).append(role.removeprefix("walle/"))
    return [f"walle_ray: node {node[:8]} ({nodes.get(node, {}).get('NodeManagerAddress', '?')}): "
            f"{', '.join(roles)}"
            for node, roles in sorted(by_node.items(), key=lambda item: item[1][0])]

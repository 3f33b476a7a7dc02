"""The local Ray instance a run starts: where its servers listen."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

# Starts a local instance as a run does, waits until the metrics agent's Prometheus endpoint
# is up and a little longer, and prints the addresses its processes listen on.
LISTENERS = textwrap.dedent("""
    import json, time
    from walle_ray.runtime.ray_init import dashboard_missing, start_ray

    if dashboard_missing():
        print(json.dumps({"skip": dashboard_missing()}))
        raise SystemExit
    import psutil, ray  # psutil comes with Ray's default extra, as the dashboard does
    start_ray(None, 1, "walle_loopback_test")
    port = ray.nodes()[0]["MetricsExportPort"]
    me = psutil.Process()

    def listening():
        pids = {p.pid for p in me.children(recursive=True)}
        return sorted({(c.laddr.ip, c.laddr.port) for c in psutil.net_connections("inet")
                       if c.status == psutil.CONN_LISTEN and c.pid in pids})

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and port not in {p for _, p in listening()}:
        time.sleep(0.5)
    time.sleep(3)  # the dashboard's own metrics server comes up about then
    print(json.dumps({"metrics_port": port, "listening": listening()}))
    ray.shutdown()
""")

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def test_a_local_instance_listens_only_on_loopback():
    """Ray's Prometheus endpoints answer without its token: on a machine others reach, a
    local run's must not listen on its outward address or on every interface."""
    proc = subprocess.run([sys.executable, "-c", LISTENERS], cwd=ROOT, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in found:
        pytest.skip(f"Ray without its dashboard: {found['skip']}")
    ips = {ip for ip, _ in found["listening"]}
    assert found["metrics_port"] in {port for _, port in found["listening"]}, found
    assert ips <= LOOPBACK, found


# A run's driver takes SIGTERM with its own handler; here one arrives every 20 ms while the
# driver starts its local instance, as a `kill` during start-up may.
PELTED = textwrap.dedent("""
    import os, signal, threading, time
    taken = []
    signal.signal(signal.SIGTERM, lambda signum, frame: taken.append(signum))
    from walle_ray.runtime.ray_init import start_ray
    import ray

    stop = threading.Event()

    def pelt():
        while not stop.is_set():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.02)

    threading.Thread(target=pelt, daemon=True).start()
    start_ray(None, 1, "walle_sigterm_test")
    stop.set()
    print("taken", len(taken), flush=True)
    ray.shutdown()
""")


def test_sigterm_while_ray_starts_reaches_the_runs_handler_only():
    """Ray's core worker would install a C++ handler for failure signals, SIGTERM among them,
    that can abort the driver while its roles start; the run's own handler takes them all."""
    proc = subprocess.run([sys.executable, "-c", PELTED], cwd=ROOT, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SIGTERM received" not in proc.stderr, proc.stderr[-3000:]
    assert int(proc.stdout.split("taken")[-1]) > 10

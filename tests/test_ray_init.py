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

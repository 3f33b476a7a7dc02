"""A run on a Ray cluster of several nodes, simulated on this machine
(``ray.cluster_utils.Cluster``: one raylet per node, each with its own resources), and the
loss of nodes in the middle of it.

The head node has no CPUs, so every role runs on a worker node and the driver (on the head)
writes the checkpoints. Custom resources (``topology.resources``) decide which node takes
which role: the two learners on two nodes of their own (their gloo group spans nodes), both
memories and the parameter server on a third, two samplers on each of two more.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT

pytest.importorskip("ray.cluster_utils")

# Nodes that stop answering are declared dead within about 5 s rather than 30.
FAST_HEALTH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
               "health_check_timeout_ms": 1000, "health_check_failure_threshold": 5}
ROLES = ("topology.resources={sampler: {walle_sampler: 1}, memory: {walle_memory: 1}, "
         "ps: {walle_memory: 1}, learner: {walle_learner: 1}}")


class Output:
    """The run's output lines, read on a thread so the pipe never fills."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.thread.start()

    def _read(self, proc) -> None:
        for line in proc.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def tail(self, n: int = 4000) -> str:
        """The run's own lines, without the Ray log lines a dying raylet floods it with."""
        own = [line for line in self.lines
               if not line.startswith((" ", "\t")) and "(raylet)" not in line]
        return "".join(own)[-n:]

    def placements(self) -> list[dict[str, list[str]]]:
        """Each placement the run printed (at start-up, after each rebuild): node id prefix ->
        the role processes on it."""
        out, current = [], None
        for line in self.lines:
            if "role processes on" in line:
                current = {}
                out.append(current)
            elif current is not None and (m := re.match(r"walle_ray: node (\w+) \([^)]*\): (.*)", line)):
                current[m.group(1)] = m.group(2).strip().split(", ")
        return out


def records(run_dir) -> list[dict]:
    import json

    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(what: str, check, proc, output: Output, timeout_s: float = 150.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        assert proc.poll() is None, f"the run ended while waiting for {what}:\n{output.tail()}"
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout_s:.0f} s:\n{output.tail()}")


@contextlib.contextmanager
def interrupted_at_the_end(proc: subprocess.Popen, output: Output):
    """The run ``proc`` goes on while the block runs, then stops on SIGINT (killed where the
    block failed); its output is read to the end, and it must have exited as SIGINT says."""
    try:
        yield
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        output.thread.join(timeout=5)
    assert proc.returncode == 128 + signal.SIGINT, output.tail()


def raylet_alive(node) -> bool:
    """Whether the simulated node's raylet process is still running."""
    return node.all_processes["raylet"][0].process.poll() is None


@pytest.fixture
def cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 0, "_system_config": FAST_HEALTH})
    yield cluster
    cluster.shutdown()


def test_roles_on_several_nodes_and_the_loss_of_nodes(cluster, tmp_path):
    learner_nodes = [cluster.add_node(num_cpus=1, resources={"walle_learner": 1}) for _ in range(2)]
    memory_node = cluster.add_node(num_cpus=1, resources={"walle_memory": 3})
    sampler_nodes = [cluster.add_node(num_cpus=1, resources={"walle_sampler": 2}) for _ in range(2)]
    cluster.wait_for_nodes()
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "walle_ray", "algo=impala", "env=cartpole", "topology=4a2m2l",
         "topology.pack=off", "topology.sampler_cpus=0.25", ROLES,
         f"run.ray_address={cluster.address}", "run.total_env_steps=100000000",
         "run.stop_at_return=null", "run.max_wall_s=900", "run.checkpoint_every=5",
         "run.report_every_s=1", "logger.progress=line", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    output = Output(proc)
    with interrupted_at_the_end(proc, output):
        # Placed as the resources say: each learner on its own node, the memories together,
        # two samplers on each sampler node; nothing on the head.
        first = wait_for("placement", lambda: next(  # every role process named
            (p for p in output.placements() if sum(map(len, p.values())) == 9), None),
            proc, output)
        node = {n.node_id[:8]: n for n in cluster.list_all_nodes()}
        roles_on = {node[prefix]: set(roles) for prefix, roles in first.items()}
        assert {frozenset(roles_on[n]) for n in learner_nodes} == {
            frozenset({"learner-0"}), frozenset({"learner-1"})}, first
        assert roles_on[memory_node] == {"memory-0", "memory-1", "ps"}, first
        assert all(len(roles_on[n]) == 2 for n in sampler_nodes), first
        assert cluster.head_node not in roles_on
        wait_for("learning", lambda: any(r["updates"] > 0 for r in records(run_dir))
                 and (run_dir / "checkpoints" / "last.pt").exists(), proc, output)

        # A sampler node is lost: its samplers start again on a node that has room.
        spare = cluster.add_node(num_cpus=1, resources={"walle_sampler": 2, "walle_memory": 3})
        cluster.wait_for_nodes()
        lost = [r for r in roles_on[sampler_nodes[1]]]
        cluster.remove_node(sampler_nodes[1], allow_graceful=False)
        # Ray, with every node on one host, now and then takes the memory node's raylet down
        # with the sampler node's (a SIGKILL its logs do not explain): the run must then
        # rebuild at once, as it does below when the memory node is removed.
        memory_gone = lambda: not raylet_alive(memory_node)  # noqa: E731
        restarted = wait_for("sampler restarts", lambda: memory_gone() or next(
            (r for r in records(run_dir) if r["faults/sampler_restarts"] >= len(lost)), None),
            proc, output)
        if not memory_gone():
            wait_for("fragments after the restart", lambda: memory_gone() or any(
                r["env_steps"] > restarted["env_steps"] + 2000 for r in records(run_dir)),
                proc, output)
        if not memory_gone():
            assert "rebuilding" not in output.text

        # The memory node is lost: the run rebuilds every role from the last checkpoint, the
        # memories now on the spare node, and goes on learning.
        cluster.remove_node(memory_node, allow_graceful=False)
        rebuilt = wait_for("a rebuild", lambda: next(
            (r for r in records(run_dir) if r.get("faults/role_restarts", 0) >= 1), None),
            proc, output)
        wait_for("learning after the rebuild", lambda: any(
            r["env_steps"] > rebuilt["env_steps"] + 2000 and r["updates"] > rebuilt["updates"]
            for r in records(run_dir)), proc, output)
        after = output.placements()[-1]
        assert {"memory-0", "memory-1", "ps"} <= set(after[spare.node_id[:8]]), after
        assert "rebuilding the roles from the last checkpoint" in output.text

    assert "stopped (signal)" in output.text and "no final checkpoint" not in output.text
    from walle_ray.runtime.checkpoint import load_checkpoint

    saved = load_checkpoint(run_dir)  # written by the driver, on the head node
    assert saved["counters"]["env_steps"] == records(run_dir)[-1]["env_steps"]
    assert saved["counters"]["restarts"] == 1

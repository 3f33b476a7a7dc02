"""Build the walle_ray images with podman and run them as a user and a cluster would.

    python docker/check.py [--steps base,default,pong,cluster,node_loss] [--keep] [--cuda]

Where no Docker daemon runs and no registry is reachable (podman, a Debian base made with
debootstrap, torch's CPU wheel from the machine's wheel directory: ``containers.md`` in the
shared notes), each step is timed and what each command printed last is kept:

1. ``base``: a Debian bookworm image (debootstrap, once), a Python base from it
   (``docker/Dockerfile.python``), then the CPU image from that (``docker/Dockerfile`` with
   ``BASE_IMAGE`` and ``TORCH_INSTALL``), with their sizes;
2. ``default``: ``podman run`` of the image with no arguments trains the default job to
   CartPole 475, its run directory in the mounted ``/runs``, owned by the user who ran it
   (``--user``; for root, a UID the image does not know, 4242);
3. ``pong``: ``algo=impala env=pong run.max_wall_s=60``, stopped with SIGTERM (``podman
   stop``) after its first learner update: ALE and the conv learner work in the image, and
   the stop leaves a final checkpoint;
4. ``cluster``: a head container and two worker containers, each ``ray start`` with its
   own CPUs, custom resources and ports on the host network; ``ray job submit
   --working-dir`` of a user's project (``tests/fixtures/my_pkg``: its env and network) as
   a ``4a2m2l`` IMPALA job whose ``topology.resources`` put the samplers on one worker and
   the learners on the other; it completes with its checkpoints in the mounted volume;
5. ``node_loss``: the same job on two workers that both offer both resources, one worker
   killed (``podman kill``) mid-run, and the run completes; then ``ray job stop`` on
   another run leaves its final checkpoint.

``--cuda`` also builds ``docker/Dockerfile.cuda`` (it cannot run without a GPU). Writes
``benchmarks/results/containers_check.json``; ``--keep`` keeps the containers' run
directories (under /tmp) and the images.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs"]
DEBIAN = "localhost/debian:bookworm"
PYTHON = "localhost/walle-python:bookworm"
IMAGE = "localhost/walle_ray:cpu"
CUDA_IMAGE = "localhost/walle_ray:cuda"
STEPS = ("base", "default", "pong", "cluster", "node_loss")


class Check:
    """The steps' results, written as JSON as each ends (a failure leaves what came before)."""

    def __init__(self, path: Path):
        self.path = path
        self.result = {"benchmark": "containers_check", "machine": machine(),
                       "command": "python docker/check.py " + " ".join(sys.argv[1:]),
                       "steps": {}}

    def step(self, name: str, **figures) -> None:
        self.result["steps"][name] = figures
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.result, indent=2) + "\n")
        print(f"check: {name}: {json.dumps({k: v for k, v in figures.items() if k != 'last_lines'})}",
              flush=True)


def machine() -> dict:
    podman = subprocess.run(["podman", "--version"], capture_output=True, text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "podman": podman, "commit": commit,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def run(cmd: list[str], timeout: float = 3600, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """A command, its output captured; a failure raises with the output's tail."""
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(cmd)}\n{tail(proc.stdout + proc.stderr, 30)}")
    return proc


def tail(text: str, n: int = 8) -> list[str]:
    return [line for line in text.strip().splitlines() if line.strip()][-n:]


def image_size(image: str) -> int:
    out = run([*PODMAN, "image", "inspect", "--format", "{{.Size}}", image]).stdout.strip()
    return int(out)


def exists(image: str) -> bool:
    return run([*PODMAN, "image", "exists", image], check=False).returncode == 0


def torch_wheel(version: str) -> Path:
    """The CPU build of torch ``version`` in pip's wheel directories (``pip config``'s
    find-links), which is where this machine keeps it."""
    dirs = [Path(p) for p in re.split(r"[\s]+", os.environ.get("PIP_FIND_LINKS", "")) if p]
    listed = run([sys.executable, "-m", "pip", "config", "list"], check=False).stdout
    dirs += [Path(p) for p in re.findall(r"find-links='([^']+)'", listed)]
    for d in dirs:
        found = sorted(d.glob(f"torch-{version}+cpu-cp3*.whl"))
        if found:
            return found[0]
    raise FileNotFoundError(f"no torch-{version}+cpu wheel in {', '.join(map(str, dirs)) or 'no find-links'}; "
                            "pass --torch-wheel")


def prepare_podman() -> None:
    """Podman's settings that this kernel needs (``containers.md``): no default ulimits."""
    conf = Path("/etc/containers/containers.conf")
    if not conf.exists() or "default_ulimits" not in conf.read_text():
        conf.parent.mkdir(parents=True, exist_ok=True)
        with conf.open("a") as f:
            f.write("[containers]\ndefault_ulimits = []\n")


def step_base(check: Check, args) -> None:
    prepare_podman()
    t0 = time.monotonic()
    reused = exists(DEBIAN)
    if not reused:
        rootfs = Path(tempfile.mkdtemp(prefix="walle-rootfs-"))
        try:
            run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), args.mirror],
                timeout=1800)
            # what debian:bookworm-slim leaves out too: the downloaded packages, the package
            # lists, documentation, manual pages and translations
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc",
                         "usr/share/man", "usr/share/locale", "usr/share/info"):
                for path in (rootfs / junk).glob("*"):
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    elif path.name != "lock":
                        path.unlink()
            tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
            run([*PODMAN, "import", "-", DEBIAN], stdin=tar.stdout)
            tar.wait()
        finally:
            shutil.rmtree(rootfs, ignore_errors=True)
    debian_s = time.monotonic() - t0
    t0 = time.monotonic()
    python = run([*PODMAN, "build", "--network=host", "-f", "docker/Dockerfile.python",
                  "--build-arg", f"DEBIAN_IMAGE={DEBIAN}", "-t", PYTHON, "docker"], cwd=ROOT)
    python_s = time.monotonic() - t0
    wheel = args.torch_wheel or torch_wheel(args.torch_version)
    mounts = ["-v", f"{wheel.parent}:/wheels:ro"]
    build_args = ["--build-arg", f"BASE_IMAGE={PYTHON}",
                  "--build-arg", f"TORCH_INSTALL=/wheels/{wheel.name}"]
    if args.ca_bundle:  # pip reaches the index only with the host's CA bundle
        mounts += ["-v", f"{args.ca_bundle}:/etc/walle-host-ca.crt:ro"]
        build_args += ["--build-arg", "PIP_CERT=/etc/walle-host-ca.crt"]
    t0 = time.monotonic()
    built = run([*PODMAN, "build", "--network=host", "-f", "docker/Dockerfile", *mounts,
                 *build_args, "-t", IMAGE, "."], cwd=ROOT, timeout=5400)
    image_s = time.monotonic() - t0
    versions = run([*PODMAN, "run", "--rm", IMAGE, "python", "-c",
                    "import sys, torch, ray; print(sys.version.split()[0], torch.__version__, "
                    "ray.__version__, torch.version.cuda)"]).stdout.split()
    check.step("base", debian_s=debian_s, debian_reused=reused, python_base_s=python_s, image_s=image_s,
               debian_size=image_size(DEBIAN), python_base_size=image_size(PYTHON),
               image_size=image_size(IMAGE), torch_wheel=wheel.name,
               python=versions[0], torch=versions[1], ray=versions[2], torch_cuda=versions[3],
               last_lines=tail(python.stdout, 3) + tail(built.stdout))


def container_run(name: str, args: list[str], runs: Path, user: str, detach: bool = False,
                  env: dict | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    envs = [x for k, v in (env or {}).items() for x in ("-e", f"{k}={v}")]
    cmd = [*PODMAN, "run", "--name", name, "--network=host", "--shm-size=2g", "--user", user,
           "-v", f"{runs}:/runs", *envs]
    cmd += ["-d", IMAGE, *args] if detach else ["--rm", IMAGE, *args]
    return run(cmd, timeout=timeout, check=not detach)


def one_run_dir(runs: Path) -> Path:
    dirs = [d for d in runs.iterdir() if d.is_dir()]
    if len(dirs) != 1:
        raise RuntimeError(f"expected one run directory in {runs}, found {[d.name for d in dirs]}")
    return dirs[0]


def host_user() -> tuple[int, int]:
    """Who runs the containers: this user, or for root a user the image does not know
    (UID and GID 4242), so that the run directory's owner shows whose it is."""
    return (os.getuid(), os.getgid()) if os.getuid() else (4242, 4242)


def step_default(check: Check, work: Path) -> None:
    runs = work / "default_runs"
    runs.mkdir()
    uid, gid = host_user()
    os.chown(runs, uid, gid)
    user = f"{uid}:{gid}"
    t0 = time.monotonic()
    out = container_run("walle-check-default", [], runs, user)
    wall = time.monotonic() - t0
    run_dir = one_run_dir(runs)
    report = json.loads((run_dir / "report.json").read_text())
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in [run_dir, *run_dir.rglob("*")]}
    ok = ("stopped (return)" in out.stdout and (run_dir / "checkpoints" / "last.pt").is_file()
          and owners == {(uid, gid)} and "475" in report.get("milestones", {}))
    check.step("default", ok=ok, wall_s=wall, user=user, owners=sorted(owners),
               run_dir=run_dir.name, milestones=report.get("milestones"),
               last_lines=tail(out.stdout, 4))
    if not ok:
        raise RuntimeError("the default job did not reach 475 with its run directory in /runs")


def step_pong(check: Check, work: Path) -> None:
    runs = work / "pong_runs"
    runs.mkdir()
    name = "walle-check-pong"
    t0 = time.monotonic()
    container_run(name, ["algo=impala", "env=pong", "run.max_wall_s=60", "logger.progress=line"],
                  runs, f"{os.getuid()}:{os.getgid()}", detach=True)
    try:
        deadline = time.monotonic() + 240
        logs = ""
        while "first learner update" not in logs:
            if time.monotonic() > deadline:
                raise RuntimeError("no learner update within 240 s:\n" + "\n".join(tail(logs, 20)))
            time.sleep(2)
            logs = run([*PODMAN, "logs", name], check=False).stdout
        time.sleep(10)  # some updates, then SIGTERM
        stopped_at = time.monotonic() - t0
        run([*PODMAN, "stop", "-t", "60", name])
        code = run([*PODMAN, "inspect", "--format", "{{.State.ExitCode}}", name]).stdout.strip()
        logs = run([*PODMAN, "logs", name]).stdout
    finally:
        run([*PODMAN, "rm", "-f", name], check=False)
    run_dir = one_run_dir(runs)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    ok = ("stopped (signal)" in logs and (run_dir / "checkpoints" / "last.pt").is_file()
          and records[-1].get("updates", 0) > 0)
    check.step("pong", ok=ok, stopped_after_s=stopped_at, exit_code=int(code),
               updates=records[-1].get("updates"), agent_steps=records[-1]["env_steps"],
               last_lines=tail(logs, 4))
    if not ok:
        raise RuntimeError("SIGTERM to the Pong run left no final checkpoint")


class Cluster:
    """A Ray head container and worker containers on the host network, each node on ports of
    its own (``base`` + offsets), sharing one auth token; the head mounts ``runs``."""

    def __init__(self, runs: Path):
        self.runs = runs
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
                    "RAY_USAGE_STATS_ENABLED": "0"}
        self.gcs, self.dashboard = 26379, 28265
        self.names: list[str] = []

    @staticmethod
    def ports(base: int) -> list[str]:
        return [f"--node-manager-port={base}", f"--object-manager-port={base + 1}",
                f"--metrics-export-port={base + 2}", f"--dashboard-agent-listen-port={base + 3}",
                f"--dashboard-agent-grpc-port={base + 4}", f"--runtime-env-agent-port={base + 5}",
                f"--min-worker-port={base + 10}", f"--max-worker-port={base + 99}"]

    def start(self, name: str, ray_args: list[str], volume: bool = False) -> None:
        envs = [x for k, v in self.env.items() for x in ("-e", f"{k}={v}")]
        mount = ["-v", f"{self.runs}:/runs"] if volume else []
        run([*PODMAN, "run", "-d", "--name", name, "--network=host", "--shm-size=1g",
             "--user", f"{os.getuid()}:{os.getgid()}", *mount, *envs, IMAGE,
             "ray", "start", "--block", "--node-ip-address=127.0.0.1", *ray_args])
        self.names.append(name)

    def head(self) -> None:
        self.start("walle-head", ["--head", "--num-cpus=0", f"--port={self.gcs}",
                                  "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard}",
                                  "--ray-client-server-port=20001", *self.ports(21000)], volume=True)

    def worker(self, name: str, base: int, resources: dict, cpus: int = 2) -> None:
        self.start(name, [f"--address=127.0.0.1:{self.gcs}", f"--num-cpus={cpus}",
                          f"--resources={json.dumps(resources)}", *self.ports(base)])

    def cli(self, *args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        ray = Path(sys.executable).with_name("ray")
        env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")},
               **self.env}
        return run([str(ray), *args], check=False, env=env, cwd=cwd, timeout=timeout)

    def address(self) -> list[str]:
        return ["--address", f"http://127.0.0.1:{self.dashboard}"]

    def wait_nodes(self, n: int, timeout: float = 180, exactly: bool = False) -> None:
        """Until the cluster has ``n`` live nodes (at least, or ``exactly``: a killed node
        is dead to Ray only once its heartbeats have been missed for a while)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            listed = self.cli("list", "nodes", *self.address(), "--format", "json",
                              "--filter", "state=ALIVE")
            if listed.returncode == 0 and listed.stdout.strip().startswith("["):
                alive = len(json.loads(listed.stdout))
                if alive == n or (alive > n and not exactly):
                    return
            time.sleep(3)
        raise RuntimeError(f"the cluster did not reach {n} live nodes within {timeout:.0f} s")

    def submit(self, project: Path, job_id: str, overrides: list[str]) -> None:
        runtime_env = json.dumps({"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "60"}})
        deadline = time.monotonic() + 90
        while True:  # a node's job agent can come up after the head's dashboard
            out = self.cli("job", "submit", *self.address(), "--no-wait", "--submission-id", job_id,
                           "--working-dir", ".", "--runtime-env-json", runtime_env, "--",
                           "python", "-m", "walle_ray", *overrides, cwd=project)
            if out.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("job submit failed:\n" + "\n".join(tail(out.stdout + out.stderr, 20)))
            time.sleep(3)

    def status(self, job_id: str) -> str:
        """``ray job status``'s line that says how the job stands, without colours."""
        out = re.sub(r"\x1b\[[0-9;]*m", "", self.cli("job", "status", *self.address(), job_id).stdout)
        lines = [line for line in out.lower().splitlines() if f"job '{job_id}" in line]
        return lines[-1].strip() if lines else out.lower()

    def wait(self, job_id: str, timeout: float = 900) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status(job_id)
            if any(word in status for word in ("succeeded", "failed", "stopped")):
                return status
            time.sleep(3)
        raise RuntimeError(f"job {job_id} did not end within {timeout:.0f} s")

    def logs(self, job_id: str) -> str:
        return self.cli("job", "logs", *self.address(), job_id).stdout

    def wait_for_log(self, job_id: str, text: str, timeout: float = 300) -> float:
        t0 = time.monotonic()
        while text not in (logs := self.logs(job_id)):
            if time.monotonic() - t0 > timeout or any(
                    word in self.status(job_id) for word in ("succeeded", "failed", "stopped")):
                raise RuntimeError(f"job {job_id} printed no {text!r} (within {timeout:.0f} s):\n"
                                   + "\n".join(tail(logs, 20)))
            time.sleep(3)
        return time.monotonic() - t0

    def stop(self) -> None:
        for name in reversed(self.names):
            run([*PODMAN, "rm", "-f", "-t", "5", name], check=False)
        self.names.clear()


def user_project(work: Path) -> Path:
    """A user's project: their own package (an env and a network), on no path of the cluster."""
    project = work / "project"
    shutil.copytree(ROOT / "tests" / "fixtures" / "my_pkg", project / "my_pkg",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return project


JOB = ["algo=impala", "env.id=my_pkg.envs:Corridor-v0", "model._target_=my_pkg.nets:MyActorCritic",
       "topology=4a2m2l", "logger.progress=line", "run.report_every_s=2"]
PLACED = "topology.resources={sampler: {envs: 1}, learner: {trainer: 1}}"


def step_cluster(check: Check, work: Path) -> None:
    runs = work / "cluster_runs"
    runs.mkdir()
    os.chmod(runs, 0o777)
    project = user_project(work)
    cluster = Cluster(runs)
    t0 = time.monotonic()
    try:
        cluster.head()
        cluster.worker("walle-worker-1", 22000, {"envs": 8})
        cluster.worker("walle-worker-2", 23000, {"trainer": 4})
        cluster.wait_nodes(3)
        up_s = time.monotonic() - t0
        job = f"walle-cluster-{secrets.token_hex(3)}"
        cluster.submit(project, job, [*JOB, PLACED, "run.total_env_steps=40000"])
        status = cluster.wait(job)
        logs = cluster.logs(job)
    finally:
        cluster.stop()
    run_dir = one_run_dir(runs)
    # "walle_ray: node 1a2b3c4d (127.0.0.1): sampler-0,2, memory-0,1, ..." per node
    placement = [line.strip() for line in logs.splitlines()
                 if line.strip().startswith("walle_ray: node ")]
    node_of = lambda role: {re.match(r"walle_ray: node (\S+)", line).group(1)  # noqa: E731
                            for line in placement if f"{role}-" in line}
    apart = bool(node_of("sampler")) and not node_of("sampler") & node_of("learner")
    ok = ("succeeded" in status and (run_dir / "checkpoints" / "last.pt").is_file() and apart)
    check.step("cluster", ok=ok, cluster_up_s=up_s, wall_s=time.monotonic() - t0,
               status=status, placement=placement,
               samplers_and_learners_apart=apart, run_dir=run_dir.name, last_lines=tail(logs, 6))
    if not ok:
        raise RuntimeError("the cluster job did not complete:\n" + "\n".join(tail(logs, 30)))


def step_node_loss(check: Check, work: Path) -> None:
    runs = work / "loss_runs"
    runs.mkdir()
    os.chmod(runs, 0o777)
    project = user_project(work / "loss")
    cluster = Cluster(runs)
    t0 = time.monotonic()
    both = {"envs": 8, "trainer": 4}
    try:
        cluster.head()
        cluster.worker("walle-worker-1", 22000, both)
        cluster.worker("walle-worker-2", 23000, both)
        cluster.wait_nodes(3)
        job = f"walle-loss-{secrets.token_hex(3)}"
        # long enough that the kill comes mid-run: it ends at its wall budget
        cluster.submit(project, job, [*JOB, PLACED, "run.total_env_steps=1000000000",
                                      "run.max_wall_s=150", "run.checkpoint_every=5"])
        first_update_s = cluster.wait_for_log(job, "first learner update")
        time.sleep(20)
        killed_at = time.monotonic() - t0
        run([*PODMAN, "kill", "walle-worker-2"])
        status = cluster.wait(job, timeout=1200)
        logs = cluster.logs(job)
        lost_ok = "succeeded" in status and "stopped (" in logs and "node" in logs
        cluster.wait_nodes(2, exactly=True)  # the lost node is dead to Ray before the next job
        # ray job stop on another run: it ends with its final checkpoint
        stop_job = f"walle-stop-{secrets.token_hex(3)}"
        cluster.submit(project, stop_job, [*JOB, "run.total_env_steps=100000000"])
        cluster.wait_for_log(stop_job, "first learner update")
        time.sleep(10)
        cluster.cli("job", "stop", *cluster.address(), stop_job, timeout=180)
        stop_status = cluster.wait(stop_job, timeout=240)
        stop_logs = cluster.logs(stop_job)
    finally:
        cluster.stop()
    dirs = sorted((d for d in runs.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    stopped_ok = ("stopped" in stop_status and "stopped (signal)" in stop_logs
                  and (dirs[-1] / "checkpoints" / "last.pt").is_file())
    recovery = [line.strip() for line in logs.splitlines()
                if "rebuilding" in line or "restart" in line.lower() or "died" in line]
    check.step("node_loss", ok=lost_ok and stopped_ok, first_update_s=first_update_s,
               killed_worker_at_s=killed_at, wall_s=time.monotonic() - t0,
               status=status, recovery=recovery[:10], stop_status=stop_status,
               last_lines=tail(logs, 4) + tail(stop_logs, 3))
    if not (lost_ok and stopped_ok):
        raise RuntimeError("the run did not survive the lost node or the stop:\n"
                           + "\n".join(tail(logs, 30) + tail(stop_logs, 10)))


def uv_image(version: str) -> str:
    """An image holding uv's binary at /uv (what ghcr.io's uv image holds), made from the uv
    wheel on PyPI, for a build that cannot pull ghcr.io."""
    name = f"localhost/walle-uv:{version}"
    if exists(name):
        return name
    with tempfile.TemporaryDirectory() as tmp:
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             f"uv=={version}", "-d", tmp])
        import zipfile

        [wheel] = Path(tmp).glob("uv-*.whl")
        with zipfile.ZipFile(wheel) as z:
            [member] = [m for m in z.namelist() if m.endswith("/scripts/uv")]
            (Path(tmp) / "uv").write_bytes(z.read(member))
        os.chmod(Path(tmp) / "uv", 0o755)
        tar = subprocess.Popen(["tar", "-C", tmp, "-c", "uv"], stdout=subprocess.PIPE)
        run([*PODMAN, "import", "-", name], stdin=tar.stdout)
        tar.wait()
    return name


def step_cuda(check: Check, args) -> None:
    """The CUDA image on the Debian Python base (nvidia/cuda cannot be pulled here; torch's
    CUDA wheel brings its own CUDA libraries), its Python the base's and torch's CUDA build
    from PyPI."""
    t0 = time.monotonic()
    version = arg_default(ROOT / "docker" / "Dockerfile.cuda", "UV_VERSION")
    mounts, build_args = [], ["--build-arg", f"CUDA_IMAGE={PYTHON}",
                              "--build-arg", f"UV_IMAGE={uv_image(version)}",
                              "--build-arg", "PYTHON_SOURCE=base",
                              "--build-arg", f"TORCH_INSTALL=torch=={args.torch_version}"]
    if args.ca_bundle:
        mounts += ["-v", f"{args.ca_bundle}:/etc/walle-host-ca.crt:ro"]
        build_args += ["--build-arg", "PIP_CERT=/etc/walle-host-ca.crt"]
    built = run([*PODMAN, "build", "--network=host", "-f", "docker/Dockerfile.cuda", *mounts,
                 *build_args, "-t", CUDA_IMAGE, "."], cwd=ROOT, timeout=7200)
    check.step("cuda", image_s=time.monotonic() - t0, image_size=image_size(CUDA_IMAGE),
               last_lines=tail(built.stdout))


def arg_default(dockerfile: Path, name: str) -> str:
    return re.search(rf"^ARG {name}=(\S+)", dockerfile.read_text(), re.M).group(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", default=",".join(STEPS), help=f"any of {', '.join(STEPS)}")
    p.add_argument("--cuda", action="store_true", help="also build docker/Dockerfile.cuda")
    p.add_argument("--keep", action="store_true", help="keep the run directories and images")
    p.add_argument("--torch-version", default="2.13.0")
    p.add_argument("--torch-wheel", type=Path, help="torch's CPU wheel (default: pip's find-links)")
    p.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt",
                   help="the host's CA bundle, for pip inside a build ('' for none)")
    p.add_argument("--mirror", default="http://deb.debian.org/debian")
    p.add_argument("--out", type=Path, default=RESULTS / "containers_check.json")
    args = p.parse_args()
    if args.ca_bundle and not Path(args.ca_bundle).is_file():
        args.ca_bundle = ""
    steps = args.steps.split(",")
    check = Check(args.out)
    work = Path(tempfile.mkdtemp(prefix="walle-check-"))
    os.chmod(work, 0o755)
    t0 = time.monotonic()
    try:
        if "base" in steps or not exists(IMAGE):
            step_base(check, args)
        for name, fn in (("default", step_default), ("pong", step_pong), ("cluster", step_cluster),
                         ("node_loss", step_node_loss)):
            if name in steps:
                fn(check, work)
        if args.cuda:
            step_cuda(check, args)
    finally:
        check.result["total_s"] = time.monotonic() - t0
        check.step("end", steps=steps)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"check: all steps passed in {time.monotonic() - t0:.0f} s; {args.out}")


if __name__ == "__main__":
    main()

"""The container files agree with each other and with what the images run: the versions
pinned in both Dockerfiles and the KubeRay RayJob, and the RayJob's commands.

Building and running the images is ``docker/check.py`` (podman; its results in
``benchmarks/results/containers_check.json``)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, make_cfg

DOCKER = ROOT / "docker"


def arg_defaults(dockerfile: Path) -> dict[str, str]:
    """The ``ARG NAME=default`` lines of a Dockerfile."""
    return dict(re.findall(r"^ARG (\w+)=(\S+)", dockerfile.read_text(), re.M))


def rayjob() -> list[dict]:
    return list(yaml.safe_load_all((DOCKER / "rayjob.yaml").read_text()))


def test_python_torch_and_ray_are_pinned_once_for_every_image():
    cpu, cuda = arg_defaults(DOCKER / "Dockerfile"), arg_defaults(DOCKER / "Dockerfile.cuda")
    for name in ("PYTHON_VERSION", "TORCH_VERSION", "RAY_VERSION"):
        assert cpu[name] == cuda[name], f"{name}: {cpu[name]} in Dockerfile, {cuda[name]} in Dockerfile.cuda"
    [job] = [doc for doc in rayjob() if doc["kind"] == "RayJob"]
    assert job["spec"]["rayClusterSpec"]["rayVersion"] == cpu["RAY_VERSION"]
    # the torch the CI and the README install is the images' torch
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"torch=={cpu['TORCH_VERSION']}" in ci
    assert f"torch=={cpu['TORCH_VERSION']}" in (ROOT / "README.md").read_text()


def test_the_rayjob_names_the_images_the_dockerfiles_build_and_commands_they_run():
    [job] = [doc for doc in rayjob() if doc["kind"] == "RayJob"]
    cluster = job["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    images = {c["image"] for spec in [head, *groups.values()]
              for c in spec["template"]["spec"]["containers"]}
    assert {image.rsplit("/", 1)[-1] for image in images} == {"walle_ray:latest", "walle_ray:cuda"}
    # KubeRay turns rayStartParams into `ray start --<key>=<value>`: each must be an option of
    # the image's ray start (the same Ray as here)
    options = subprocess.run([str(Path(sys.executable).with_name("ray")), "start", "--help"],
                             capture_output=True, text=True, timeout=120).stdout
    for spec in [head, *groups.values()]:
        for key in spec["rayStartParams"]:
            assert f"--{key}" in options, f"ray start has no --{key}"
    # the entrypoint is a walle_ray command line that composes and validates
    words = shlex.split(job["spec"]["entrypoint"])
    assert words[:3] == ["python", "-m", "walle_ray"]
    from walle_ray.algos import validate

    validate(make_cfg(*[w.replace("topology=32a4m4l", "topology.spec=32a4m4l") for w in words[3:]]))


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_what_differs_on_a_machine_without_a_registry_is_a_build_argument(dockerfile):
    """The base image, how torch is installed and pip's settings (docker/check.py builds the
    CPU image here with them)."""
    text = (DOCKER / dockerfile).read_text()
    base = "BASE_IMAGE" if dockerfile == "Dockerfile" else "CUDA_IMAGE"
    assert re.search(rf"^FROM \${{{base}}}", text, re.M)
    assert "pip install ${TORCH_INSTALL}" in text
    for name in ("PIP_CERT", "PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        assert re.search(rf"^ARG {name}$", text, re.M), name

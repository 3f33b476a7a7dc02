"""Start sampler and learner processes with torch imported before they join Ray.

A Ray worker process imports the user's code only after it has connected to Ray. A process
that imported torch after connecting (or after ``ray.init``, in a driver) ran the sampler's
loop slower than one that imported torch first, while each torch call alone ran at the same
speed (docs/performance.md; ``benchmarks/sampling_overhead.py`` measures both ways). So
the actors that run torch in a loop are started by a command that imports torch, numpy and
gymnasium and then runs Ray's worker script, given to Ray as the ``py_executable`` of their
runtime environment.
"""

from __future__ import annotations

import shlex
import sys

# Run as ``python -c PRELOAD <Ray's worker script> <its arguments>``.
PRELOAD = ("import os, runpy, sys; import torch, numpy, gymnasium; "
           "sys.argv = sys.argv[1:]; sys.path[0] = os.path.dirname(sys.argv[0]); "
           "runpy.run_path(sys.argv[0], run_name='__main__')")


# Fields of a job's runtime environment that choose the worker's interpreter themselves.
_OWN_INTERPRETER = ("py_executable", "pip", "conda", "uv", "image_uri", "container")


def worker_runtime_env(enabled: bool = True, executable: str | None = None,
                       job_env: dict | None = None) -> dict | None:
    """The runtime environment for an actor that runs torch in a loop (None: Ray's default).

    Ray runs ``exec <py_executable> <worker script> ...`` under bash on the node. The
    interpreter is this process's (``executable``), which is where clusters built from one
    image keep it; a node without that path falls back to its ``python3``. A job whose
    runtime environment picks the interpreter (``job_env`` with pip, conda, uv, an image or
    its own py_executable) keeps Ray's default start; Ray merges the rest of the job's
    runtime environment (working_dir, env_vars) into the actor's."""
    if not enabled or any((job_env or {}).get(key) for key in _OWN_INTERPRETER):
        return None
    exe = shlex.quote(executable or sys.executable)
    python = f'"$(test -x {exe} && echo {exe} || command -v python3)"'
    return {"py_executable": f"{python} -c {shlex.quote(PRELOAD)}"}


def role_runtime_env(enabled: bool) -> dict | None:
    """``worker_runtime_env`` for the samplers and learners of the Ray job this process drives."""
    import ray

    return worker_runtime_env(enabled, job_env=dict(ray.get_runtime_context().runtime_env or {}))

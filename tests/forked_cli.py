"""A process that has imported what ``python -m walle_ray`` imports before its first line
(torch, Hydra, gymnasium, the config) and forks a child for each command line it is sent,
which runs ``walle_ray`` as ``__main__`` with its own arguments, environment and output
files, as a fresh interpreter would. A test's run of the command line then costs its own
work, not the seconds of imports every process of it would repeat (``conftest.run_cli``).

Ray is not imported here: a child imports it fresh, as a fresh driver does, so that no
thread or connection of Ray's is copied into it. Requests and answers are JSON lines on
stdin and stdout: ``{"args", "env", "cwd", "out", "err"}`` in; ``{"pid"}`` as the child
starts, then ``{"code"}`` (negative: the signal that ended it).
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import threading


def child(request: dict) -> None:
    """In the forked child: become the command line and run it; never returns."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]  # as ``python -m`` puts it first, then PYTHONPATH's
    for entry in reversed([p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]):
        if entry not in sys.path:
            sys.path.insert(1, entry)
    for fd, path in ((1, request["out"]), (2, request["err"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(0, closefd=False)
    sys.argv = ["walle_ray", *request["args"]]
    # Unhandled exceptions print their traceback and exit 1, as the interpreter would.
    runpy.run_module("walle_ray", run_name="__main__", alter_sys=True)
    sys.exit(0)


def serve() -> None:
    sys.path[0] = os.getcwd()  # not this file's folder: as ``python -m`` has it
    importlib.import_module("walle_ray.__main__")  # what each child would import first

    del sys.modules["walle_ray.__main__"]  # each child runs it afresh, as ``python -m`` does

    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stray prints of the imports stay out of it
    for line in sys.stdin:
        request = json.loads(line)
        if threading.active_count() != 1:
            raise RuntimeError("forked_cli: a thread was started before the fork")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                child(request)
            except SystemExit:
                raise
            except BaseException:  # as the interpreter reports what nothing caught
                sys.excepthook(*sys.exc_info())
                sys.exit(1)
        answers.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        answers.write(json.dumps({"code": code}) + "\n")


if __name__ == "__main__":
    serve()

"""Run directories: each run writes into a directory of its own.

The default names (``conf/config.yaml``: ``<runs>/<date>_<time>_<algo>_<env>`` for a run,
``<multirun>/<date>_<time>_multirun_<algo>_<env>`` for a sweep, whose jobs take its
subdirectories ``0/``, ``1/``, ...) go through the ``walle_new_dir`` resolver: it creates
the directory before Hydra writes its ``.hydra/`` there, and where a run started in the same
second holds that name it takes ``<name>-2``, ``<name>-3``, ... instead.

A directory named outright (``hydra.run.dir=...``, ``run_dir=`` from Python) that already
holds a run is refused unless the run resumes that same directory (``check_run_dir``); of
two runs that start in one new directory at once, the second to create its
``metrics.jsonl`` is refused (``taken``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from omegaconf import OmegaConf

from walle_ray.config import ConfigError


def register_resolver() -> None:
    """``walle_new_dir`` for conf/config.yaml's run and sweep directories, registered with
    the configs (``algos.register_configs``) before Hydra reads them. Cached, so that Hydra,
    which reads the name more than once, gets the one ``new_dir`` created."""
    OmegaConf.register_new_resolver("walle_new_dir", new_dir, use_cache=True, replace=True)


def new_dir(base: str) -> str:
    """Create the directory ``base``, or where it exists the first of ``base-2``, ``base-3``,
    ... that does not, and return its path. ``os.mkdir`` either creates a directory or
    fails, so two processes never get the same one."""
    base = base.rstrip("/\\") or base
    Path(base).parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        name = base if n == 1 else f"{base}-{n}"
        try:
            os.mkdir(name)
            return name
        except FileExistsError:
            n += 1


def hydra_own(path: Path) -> bool:
    """Whether ``path``, in a run directory, is what Hydra writes there before the run
    starts: ``.hydra/`` and the job's log."""
    return (path.name == ".hydra" and path.is_dir()) or (path.suffix == ".log" and path.is_file())


def remove_unused(run_dir: Path) -> bool:
    """Remove ``run_dir`` where it holds only what Hydra wrote there for a command that left
    no run in it (one refused, ``mode=eval``, ``mode=collect``): ``.hydra/`` and an empty
    log. Returns whether it did."""
    try:
        entries = list(Path(run_dir).iterdir())
        if not all(hydra_own(p) and (p.is_dir() or p.stat().st_size == 0) for p in entries):
            return False
    except OSError:
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return True


def check_run_dir(run_dir: Path, resume: str | None) -> None:
    """Refuse ``run_dir`` where it holds anything but Hydra's own files, unless ``resume``
    (``run.resume``) names this same directory."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or (resume and Path(resume).resolve() == run_dir.resolve()):
        return
    held = sorted(p.name for p in run_dir.iterdir() if not hydra_own(p))
    if held:
        raise ConfigError(taken(run_dir, held))


def taken(run_dir: Path, held: list[str]) -> str:
    """The one-line refusal of a run directory that holds ``held`` (file names)."""
    shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
    return (f"run directory {run_dir} already holds a run ({shown}); continue it with "
            f"run.resume={run_dir}, or choose another directory (hydra.run.dir=..., or "
            "run_dir= in walle_ray.train)")

"""Command-line conveniences applied before Hydra sees the arguments.

- ``topology=12a3m2l``: any topology string works, not only the shipped YAML files; an
  unknown option becomes ``topology.spec=12a3m2l`` (checked against the grammar later).
- ``run.resume=<run dir>``: the run continues in that directory with the overrides it was
  started with; overrides given now win over those.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from walle_ray.config import ConfigError


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def rewrite_args(args: list[str], conf_dir: Path) -> list[str]:
    known = {p.stem for p in (conf_dir / "topology").glob("*.yaml")}
    out = []
    for arg in args:
        if arg.startswith("topology="):
            values = arg.split("=", 1)[1].split(",")
            if not all(v in known for v in values):
                arg = "topology.spec=" + ",".join(values)
        out.append(arg)
    resume = next((a.split("=", 1)[1] for a in out if _key(a) == "run.resume"), None)
    if resume:
        out = _resume_args(Path(resume), out)
    return out


def _resume_args(run_dir: Path, args: list[str]) -> list[str]:
    # Written by a run that passed its checks (Hydra's own copy is rewritten by every
    # attempt, refused ones included); older runs have only Hydra's.
    stored = run_dir / "overrides.yaml"
    if not stored.is_file():
        stored = run_dir / ".hydra" / "overrides.yaml"
    if not run_dir.is_dir():
        raise ConfigError(f"run.resume: {run_dir} is not a run directory")
    previous = yaml.safe_load(stored.read_text()) if stored.is_file() else []
    given = {_key(a) for a in args}
    kept = [a for a in previous or [] if _key(a) not in given and _key(a) not in
            ("run.resume", "hydra.run.dir")]
    if "hydra.run.dir" not in given:
        args = [*args, f"hydra.run.dir={run_dir}"]
    return [*kept, *args]

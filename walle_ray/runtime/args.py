"""Command-line conveniences applied before Hydra sees the arguments.

- ``topology=12a3m2l``: any topology string works, not only the shipped YAML files; an
  unknown option becomes ``topology.spec=12a3m2l`` (checked against the grammar later).
- ``env.id=...`` or ``env.entry_point=...`` without ``env=<option>``: the env has no config
  file, so ``env=custom`` is chosen (its name comes from the id, and no other env's preset
  applies); ``env=cartpole env.id=...`` keeps CartPole's file and preset.
- ``run.resume=<run dir>``: the run continues in that directory with the overrides it was
  started with; overrides given now win over those. A stored override that names code to
  import (``config.CODE_KEYS``, a ``module:EnvId`` id, Hydra's own settings, a group file
  outside the search path, a config directory not given now) is refused unless this
  command gives ``run.trust_code=true``: the file may come from elsewhere.
- ``hydra.run.dir=<dir>`` that holds another run is refused before Hydra writes its
  ``.hydra/`` there (``check_named_run_dir``).
- ``algo.capacity=1e6``: a value in scientific notation that is a whole number is passed
  as that integer (``1000000``), so integer settings take it; Hydra would read a float,
  which they refuse.

``conf_dirs`` are the shipped config directory and the user's (``--config-dir``), in which
topology options are looked up.
"""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import yaml

from walle_ray.config import CODE_KEYS, CONF_DIR, MODULE_PREFIX, ConfigError
from walle_ray.runtime.run_dir import check_run_dir

# Hydra's flags that print, complete or sweep instead of running one job in hydra.run.dir
_NO_RUN_FLAGS = {"--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i", "--multirun",
                 "-m", "--shell-completion", "-sc"}


# A whole number in scientific notation: digits, an optional fraction, a positive exponent.
_SCIENTIFIC = re.compile(r"[+-]?\d+(\.\d*)?[eE]\+?\d+")


def whole_number(value: str) -> str:
    """``value`` as an integer literal when it is a whole number in scientific notation
    (``1e10``, ``2.5e5``), else unchanged."""
    if not _SCIENTIFIC.fullmatch(value):
        return value
    number = Decimal(value)
    return str(int(number)) if number == number.to_integral_value() else value


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def user_config_dirs(args: list[str]) -> list[Path]:
    """The directories named by ``--config-dir DIR`` / ``--config-dir=DIR`` / ``-cd DIR``."""
    dirs = []
    for i, arg in enumerate(args):
        if arg in ("--config-dir", "-cd") and i + 1 < len(args):
            dirs.append(Path(args[i + 1]))
        elif arg.startswith("--config-dir="):
            dirs.append(Path(arg.split("=", 1)[1]))
    return dirs


def checked_config_dirs(dirs: list[Path], key: str) -> list[Path]:
    """The user's config directories, absolute; a ConfigError names ``key`` for one that is
    not a directory."""
    for folder in dirs:
        if not Path(folder).is_dir():
            raise ConfigError(f"{key}: {folder} is not a directory")
    return [Path(folder).resolve() for folder in dirs]


def searchpath_override(dirs: list[Path]) -> str:
    """The override that puts the user's config directories on Hydra's search path (kept in
    overrides.yaml, so that ``run.resume`` finds them again)."""
    return "hydra.searchpath=[" + ",".join(f"file://{d}" for d in dirs) + "]"


def rewrite_args(args: list[str], conf_dirs: Path | list[Path]) -> list[str]:
    conf_dirs = [conf_dirs] if isinstance(conf_dirs, Path) else list(conf_dirs)
    known = {p.stem for d in conf_dirs for p in (Path(d) / "topology").glob("*.yaml")}
    out = []
    for arg in args:
        # A list or dict typed over several lines: Hydra's grammar has no line breaks, and
        # in YAML's flow style a line break is a space. Other values keep theirs.
        if "=" in arg and arg.split("=", 1)[1].lstrip().startswith(("[", "{")):
            arg = re.sub(r"\s*\n\s*", " ", arg)
        if "=" in arg and not arg.startswith("-"):
            key, value = arg.split("=", 1)
            arg = f"{key}={whole_number(value)}"
        if arg.startswith("topology="):
            values = arg.split("=", 1)[1].split(",")
            if not all(v in known for v in values):
                arg = "topology.spec=" + ",".join(values)
        out.append(arg)
    keys = [_key(a) if "=" in a else None for a in out]
    if "env" not in keys and {"env.id", "env.entry_point"} & set(keys):
        # beside the other overrides: argparse takes them as one run of positionals
        first = min(keys.index(k) for k in ("env.id", "env.entry_point") if k in keys)
        out.insert(first, "env=custom")
    resume = next((a.split("=", 1)[1] for a in out if _key(a) == "run.resume"), None)
    if resume:
        out = _resume_args(Path(resume), out, conf_dirs)
    return out


def _resume_args(run_dir: Path, args: list[str], conf_dirs: list[Path]) -> list[str]:
    # Written by a run that passed its checks (Hydra's own copy is rewritten by every
    # attempt, refused ones included); older runs have only Hydra's.
    stored = run_dir / "overrides.yaml"
    if not stored.is_file():
        stored = run_dir / ".hydra" / "overrides.yaml"
    if not run_dir.is_dir():
        raise ConfigError(f"run.resume: {run_dir} is not a run directory")
    previous = (yaml.safe_load(stored.read_text()) if stored.is_file() else None) or []
    if not isinstance(previous, list) or not all(isinstance(a, str) for a in previous):
        raise ConfigError(f"run.resume: {stored} is not a list of overrides")
    given = {_key(a) for a in args}
    # Trust is this command's to give: a stored run.trust_code is never kept.
    kept = [a for a in previous if _key(a) not in given and _key(a) not in
            ("run.resume", "hydra.run.dir", "run.trust_code")]
    if not any(_key(a) == "run.trust_code" and a.partition("=")[2].strip().lower() == "true"
               for a in args):
        for override in kept:
            _check_stored(override, stored, conf_dirs)
    # beside the other overrides: argparse takes them as one run of positionals, which a
    # flag such as --config-dir may precede or follow
    at = end = next(i for i, a in enumerate(args) if _key(a) == "run.resume")
    while end + 1 < len(args) and not args[end + 1].startswith("-"):
        end += 1
    place = [] if "hydra.run.dir" in given else [f"hydra.run.dir={run_dir}"]
    return [*args[:at], *kept, *args[at:end + 1], *place, *args[end + 1:]]


# A 'module:' inside an env.kwargs override's value, alone or in a list or dict literal (a
# dict's 'key: value' has a space after its colon)
_KWARG_MODULE = r"(^|[\s{\[,:'\"])" + MODULE_PREFIX + r"(?!\s)"


def _check_stored(override: str, stored: Path, conf_dirs: list[Path]) -> None:
    """Refuse, in one line naming it, the file and the opt-in, a stored override that names
    code for this process to import or run: a key of ``CODE_KEYS`` or below one, a
    ``module:EnvId`` env id or ``env.kwargs`` value (or an interpolation there, which could
    resolve to one), an interpolation that calls a resolver, a whole section or a group file
    given as a path, Hydra's own settings and flags (its callbacks and launchers are code),
    or a config directory (``hydra.searchpath``) that is not among ``conf_dirs``, whose files
    could name any of these. A Ray cluster to join (``run.ray_address``, other than ``auto`` or ``local``) is
    refused too: what it sends this process is unpickled, and can run code."""
    key, _, value = override.partition("=")
    name = key.lstrip("+~")
    opt_in = f"resume with run.trust_code=true if you trust {stored.parent}"
    if name == "hydra.searchpath":
        own = [Path(d).resolve() for d in conf_dirs]
        for folder in searchpath_dirs(override):
            if folder not in own:
                raise ConfigError(
                    f"run.resume: {stored} puts {str(folder)!r} on the config search path "
                    f"(hydra.searchpath), whose files may name code to import; {opt_in}, or "
                    f"give --config-dir {folder} again")
        return
    code = (not re.fullmatch(r"\w+(\.\w+)*", name)  # a flag, a Hydra group, a package
            or name == "hydra" or name.startswith("hydra.")
            or ("." not in name and not re.fullmatch(r"[\w.,\[\] -]*", value))
            or any(name == k or name.startswith(k + ".") for k in CODE_KEYS)
            or re.search(r"\$\{[^}]*:", value) is not None  # a resolver, called to resolve it
            or (name == "env.id" and (":" in value or "$" in value))
            or ((name == "env.kwargs" or name.startswith("env.kwargs."))
                and ("$" in value or re.search(_KWARG_MODULE, value))))
    if name == "run.ray_address" and value.strip().strip("'\"").lower() not in (
            "", "null", "auto", "local"):
        raise ConfigError(f"run.resume: {stored} sets {override!r}, a Ray cluster to join, whose "
                          f"answers this process would unpickle; {opt_in}, or give "
                          f"{name}=... on this command line")
    if code:
        raise ConfigError(f"run.resume: {stored} sets {override!r}, which names code to import; "
                          f"{opt_in}, or give {name}=... on this command line")


def searchpath_dirs(override: str) -> list[Path | str]:
    """The directories a stored ``hydra.searchpath`` names, as Hydra reads them; an entry
    that is not a ``file://`` directory, as it is written."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        value = OverridesParser.create().parse_overrides([override])[0].value()
    except Exception:  # Hydra's grammar errors: an entry nothing here can vouch for
        return [override]
    entries = value if isinstance(value, list) else [value]
    return [Path(e[len("file://"):]).resolve() if isinstance(e, str) and e.startswith("file://")
            else str(e) for e in entries]


def check_named_run_dir(args: list[str]) -> None:
    """Refuse a ``hydra.run.dir=`` that holds a run, for a training run that does not resume
    it, before Hydra writes its ``.hydra/`` there; ``args`` are ``rewrite_args``' output. The
    run checks again (``runtime/start.py``), for the Python API and for two runs that start
    in one directory at once."""
    if _NO_RUN_FLAGS & {a.split("=", 1)[0] for a in args}:
        return
    values = {_key(a): a.split("=", 1)[1] for a in args if "=" in a and not a.startswith("-")}
    if "hydra.run.dir" in values and values.get("mode", "train") == "train":
        check_run_dir(Path(values["hydra.run.dir"]), values.get("run.resume"))


def announce_preset(preset: str | None, config_dirs: list[Path]) -> None:
    """Say which preset file applies, if any (``optional preset: ${algo}_${env}``)."""
    for folder in config_dirs:
        path = folder / "preset" / f"{preset}.yaml"
        if preset and path.is_file():
            shown = f"conf/preset/{preset}.yaml" if folder == CONF_DIR else str(path)
            print(f"walle_ray: tuned settings from {shown} apply (~preset runs without them)",
                  flush=True)
            return

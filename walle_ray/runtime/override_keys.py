"""Overrides checked against the schema before Hydra composes them.

A key the config does not have (``run.total_env_step=100``), a value of the wrong type
(``run.seed=abc``) or a group option that does not exist (``algo=ppoo``) is refused in one
line that names it and the nearest right one. Hydra says these over several lines, and
takes ``+run.total_env_step=100`` as a new key that nothing reads.

Only what the schema settles is checked here: values with interpolations, sweeps, lists or
dicts, keys under a mapping (``env.kwargs.*``, ``topology.resources.*``) and Hydra's own
settings are left to Hydra.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from pathlib import Path

import yaml

from walle_ray.config import Config, ConfigError
from walle_ray.runtime.args import searchpath_dirs

GROUPS = ("algo", "env", "topology", "logger")  # config groups a user picks by name
OTHER_GROUPS = ("preset", "schema")  # picked by the configs themselves
BOOLS = {"true", "false", "yes", "no", "on", "off", "y", "n", "1", "0"}


def check_overrides(args: list[str], conf_dirs: list[Path]) -> None:
    """Raise ConfigError for the first override (``args``, after ``rewrite_args``) whose key,
    value type or group option the schema refuses; flags and Hydra's settings pass. Group
    options are looked for in ``conf_dirs`` and the directories a ``hydra.searchpath``
    override names (a resumed run's); not at all where it names a package's."""
    conf_dirs = list(conf_dirs)
    for arg in args:
        if arg.partition("=")[0].lstrip("+") == "hydra.searchpath":
            entries = searchpath_dirs(arg)
            conf_dirs = (conf_dirs + entries if all(isinstance(e, Path) for e in entries)
                         else [])
    roots = typing.get_type_hints(Config)
    algo_cls = _algo_schema(args, conf_dirs)
    for arg in args:
        if arg.startswith("-") or "=" not in arg or arg.startswith("~"):
            continue
        key, _, value = arg.partition("=")
        name = key.lstrip("+")
        parts = name.split(".")
        if parts[0].split("/")[0] == "hydra" or "/" in parts[0]:  # Hydra's own, nested groups
            continue
        if len(parts) == 1 and (name in GROUPS or name in OTHER_GROUPS
                                or any((Path(d) / name).is_dir() for d in conf_dirs)):
            if name not in OTHER_GROUPS:  # a user's group (experiment=...) too
                _check_option(name, value, conf_dirs)
            continue
        if parts[0] not in roots:
            known = sorted({*roots, *GROUPS})
            raise ConfigError(f"{key}: the config has no {parts[0]!r}{_nearest(parts[0], known)} "
                              f"(its sections: {', '.join(known)})")
        cls = algo_cls if parts[0] == "algo" else roots[parts[0]]
        if len(parts) == 1:
            _check_value(name, roots[name], value, None)
        elif cls is not None:
            _check_field(cls, parts, key, value)


def _check_field(cls: type, parts: list[str], key: str, value: str) -> None:
    """Walk ``parts`` (after the section) through ``cls``'s fields and nested dataclasses;
    the last one's value is checked against its type."""
    for depth in range(1, len(parts)):
        hints = typing.get_type_hints(cls)
        part, where = parts[depth], ".".join(parts[:depth])
        if part not in hints:
            added = (", and a key added with + would be read by nothing"
                     if key.startswith("+") else "")
            raise ConfigError(
                f"{key}: {where} has no key {part!r}{added}"
                f"{_nearest(part, list(hints), prefix=where + '.')} (python -m walle_ray "
                "--cfg job shows every key)")
        kind = _unwrap(hints[part])
        if depth == len(parts) - 1:
            default = next((f.default for f in dataclasses.fields(cls) if f.name == part), None)
            _check_value(".".join(parts), hints[part], value, default)
        elif dataclasses.is_dataclass(kind):
            cls = kind
        else:  # a mapping, a list or any value: its keys are the user's
            return


def _check_value(name: str, kind, value: str, default) -> None:
    """A plain value of a bool, int or float key must read as one."""
    optional = kind is not _unwrap(kind)
    kind = _unwrap(kind)
    text = value.strip()
    if not text or re.search(r"[$,\[\]{}()'\"]", text) or (optional and text == "null"):
        return  # interpolations, sweeps, lists, dicts and quoted strings are Hydra's
    whole = re.fullmatch(r"[+-]?\d+(_\d+)*", text) is not None  # 1_000_000 is Hydra's too
    ok = {bool: lambda: text.lower() in BOOLS or whole,
          int: lambda: whole,
          float: lambda: _is_float(text)}.get(kind)
    if ok is None or ok():
        return
    what = {bool: "true or false", int: "a whole number", float: "a number"}[kind]
    example = default if isinstance(default, kind) else {bool: "true", int: 1, float: 0.5}[kind]
    example = str(example).lower() if kind is bool else example
    raise ConfigError(f"{name}={value}: {name} takes {what}"
                      f"{' or null' if optional else ''}, e.g. {name}={example}")


def _check_option(group: str, value: str, conf_dirs: list[Path]) -> None:
    """Each option of ``group=value`` (a list or a sweep names several) has a file; a sweep
    written as a function (``glob(*)``, ``choice(a,b)``) is Hydra's to read."""
    options = sorted({p.stem for d in conf_dirs for p in (Path(d) / group).glob("*.yaml")})
    if not conf_dirs or not options or "(" in value:
        return
    for option in (o.strip() for o in re.split(r"[,\[\]]", value)):
        if option and "/" not in option and not option.startswith("$") and option not in options:
            raise ConfigError(f"{group}={value}: no {group} named {option!r}"
                              f"{_nearest(option, options, prefix=group + '=')} "
                              f"(choose from {', '.join(options)})")


def _algo_schema(args: list[str], conf_dirs: list[Path]) -> type | None:
    """The config class of the algorithm ``args`` choose (``algo=``, else the default ppo),
    from its file's ``/schema/algo/<name>`` default; None where that cannot be told."""
    from walle_ray.algos import ALGORITHMS

    chosen = [a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("algo=")]
    primary = _primary_config(args)
    if chosen:
        option = chosen[-1].strip()
    elif primary is None:
        option = "ppo"  # config.yaml's default
    else:  # a primary config of the user's own (--config-name) picks it, if anything does
        option = _primary_algo(primary, conf_dirs)
        if option is None:
            return None
    if re.search(r"[,\[\]$]", option):
        return None
    for entry in _defaults(f"algo/{option}.yaml", conf_dirs) or []:
        if isinstance(entry, str) and entry.startswith("/schema/algo/"):
            algo = ALGORITHMS.get(entry.removeprefix("/schema/algo/").split("@")[0])
            return algo.config_cls if algo is not None else None
    return None


def _defaults(name: str, conf_dirs: list[Path]) -> list | None:
    """The defaults list of config file ``name`` in the first of ``conf_dirs`` that holds
    it; None where none does or it cannot be read."""
    for folder in conf_dirs:
        path = Path(folder) / name
        if path.is_file():
            try:
                return list((yaml.safe_load(path.read_text()) or {}).get("defaults") or [])
            except (OSError, yaml.YAMLError, AttributeError, TypeError):
                return None
    return None


def _primary_config(args: list[str]) -> str | None:
    """The primary config ``--config-name``/``-cn`` names, or None for walle_ray's own."""
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in ("--config-name", "-cn"):
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            return None if value.removesuffix(".yaml") == "config" else value
    return None


def _primary_algo(name: str, conf_dirs: list[Path]) -> str | None:
    """The algo option a primary config's defaults list picks (``- algo: impala``, or
    ``- override /algo: impala``), ``ppo`` where it builds on walle_ray's ``config``, and
    None where that cannot be told."""
    defaults = _defaults(f"{name.removesuffix('.yaml')}.yaml", conf_dirs)
    if defaults is None:
        return None
    picked = [str(v) for entry in defaults if isinstance(entry, dict) for k, v in entry.items()
              if str(k).removeprefix("override ").strip().lstrip("/") == "algo"]
    if picked:
        return picked[-1]
    return "ppo" if any(entry in ("config", "/config") for entry in defaults) else None


def _unwrap(kind):
    """``Optional[X]`` as ``X``; any other type as it is."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if typing.get_origin(kind) is typing.Union and len(args) == 1 else kind


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _nearest(word: str, choices: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {prefix}{close[0]}?" if close else ""

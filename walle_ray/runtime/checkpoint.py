"""Checkpoints: state dicts only, written atomically, read with ``weights_only=True``.

Reading one runs no code, but the run's config it holds names code (an env's entry point,
modules to import, wrappers, a network's class): ``checked_config`` hands that config to
what builds the env and the network only when the caller trusts the file or names the same
code itself (docs/faults.md, "Files from elsewhere").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

import walle_ray
from walle_ray.config import MODULE_REF
from walle_ray.runtime.files import write_atomic

FORMAT = "walle_ray.checkpoint/1"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt or from something else; the message says which."""


def save_checkpoint(path: Path, payload: dict) -> Path:
    """Write to a temporary file, fsync, rename, fsync the directory: a crash mid-write keeps
    the old file (``runtime/files.py``, which also removes a dead writer's temporary file)."""
    payload = {"format": FORMAT, "walle_ray_version": walle_ray.__version__,
               **_apart(payload, {})}
    return write_atomic(Path(path), lambda f: torch.save(payload, f))


def _apart(obj, taken: dict[int, torch.dtype]):
    """``obj`` with no two tensors of different dtypes at one address, which ``torch.save``
    refuses. Arrays read from Ray's object store share one buffer, where an empty array
    starts where the next one does: an empty tensor becomes one of its own, and a tensor
    whose address another dtype already took is copied."""
    if isinstance(obj, torch.Tensor):
        if obj.numel() == 0:
            return torch.empty(obj.shape, dtype=obj.dtype)
        if taken.setdefault(obj.untyped_storage().data_ptr(), obj.dtype) != obj.dtype:
            return obj.clone()
        return obj
    if isinstance(obj, dict):
        return {k: _apart(v, taken) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_apart(v, taken) for v in obj)
    return obj


def load_checkpoint(path: Path) -> dict:
    """Load and sanity-check a checkpoint written by ``save_checkpoint``."""
    path = Path(path)
    if path.is_dir():
        path = latest_checkpoint(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a damaged file can fail anywhere inside torch's reader
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(exc).__name__}: {first_line(exc)}); "
            "it is truncated, corrupt or not a walle_ray checkpoint") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a walle_ray checkpoint (format {FORMAT})")
    for key in ("learner", "counters", "config"):
        if key not in payload:
            raise CheckpointError(f"checkpoint {path} lacks {key!r}; it is incomplete")
    return payload


def checked_config(ckpt: dict, path: Path, trust_code: bool, own=None) -> dict:
    """The run's config a checkpoint holds, resolved, to build its env and network from.

    A CheckpointError names the first piece of code it names (``named_code``) unless
    ``trust_code``, or unless ``own``, the caller's own config, names the same code under
    the same key.
    """
    path = latest_checkpoint(path) if Path(path).is_dir() else Path(path)
    opt_in = ("load it only if you trust the file, with trust_code=True (run.trust_code=true "
              "on the command line)")
    if not trust_code:  # walle_ray writes the config resolved: resolving calls what it names
        for key, value in _strings(ckpt["config"], "config"):
            if "${" in value:
                raise CheckpointError(
                    f"{key.removeprefix('config.')}: checkpoint {path} holds the interpolation "
                    f"{value!r}, which resolving would call; {opt_in}")
    try:
        config = OmegaConf.to_container(OmegaConf.create(ckpt["config"]), resolve=True)
    except Exception as exc:  # a value OmegaConf cannot hold, an interpolation that fails
        raise CheckpointError(f"checkpoint {path} holds a config that cannot be read "
                              f"({type(exc).__name__}: {first_line(exc)})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"checkpoint {path} holds a config that is not a mapping")
    if isinstance(config.get("env"), dict):  # from before env.action_mask: nothing was masked
        config["env"].setdefault("action_mask", "none")
    if trust_code:
        return config
    allowed = set(named_code(OmegaConf.to_container(own, resolve=True)
                             if OmegaConf.is_config(own) else own or {}))
    for key, value in named_code(config):
        if (key, value) not in allowed:
            raise CheckpointError(
                f"{key}: checkpoint {path} names {value!r}, code that building its env or "
                f"network would import and run; {opt_in}")
    return config


def named_code(config: dict) -> list[tuple[str, str]]:
    """(key, value) for each piece of code a run's config names for the process that builds
    its env and network to import or call: each of ``env.imports``, ``env.entry_point``, each
    of ``env.wrappers``' targets, a ``module:EnvId`` id, an ``env.kwargs`` value written
    that way (an env that makes another by id would import its module) and
    ``model._target_``. A registered or built-in env id (``CartPole-v1``, ``ALE/Pong-v5``,
    ``walle/Faulty-v0``) names none."""
    env, model = (_section(config, name) for name in ("env", "model"))
    found = [("env.imports", str(module)) for module in _items(env.get("imports"))]
    if env.get("entry_point"):
        found.append(("env.entry_point", str(env["entry_point"])))
    for i, item in enumerate(_items(env.get("wrappers"))):
        target = item.get("_target_", item) if isinstance(item, dict) else item
        found.append((f"env.wrappers[{i}]", str(target)))
    if ":" in str(env.get("id") or ""):
        found.append(("env.id", str(env["id"])))
    found += [(key, value) for key, value in _strings(env.get("kwargs"), "env.kwargs")
              if MODULE_REF.match(value)]
    if model.get("_target_"):
        found.append(("model._target_", str(model["_target_"])))
    return found


def _section(config, name: str) -> dict:
    section = config.get(name) if isinstance(config, dict) else None
    return section if isinstance(section, dict) else {}


def _strings(tree, key: str) -> list[tuple[str, str]]:
    """(dotted key, value) for every string inside dicts and lists."""
    if isinstance(tree, str):
        return [(key, tree)]
    if isinstance(tree, dict):
        return [found for k, v in tree.items() for found in _strings(v, f"{key}.{k}")]
    if isinstance(tree, (list, tuple)):
        return [found for i, v in enumerate(tree) for found in _strings(v, f"{key}[{i}]")]
    return []


def _items(value) -> list:
    """A list as it is; any other value that is set, as a list of one."""
    return value if isinstance(value, list) else [value] if value else []


def latest_checkpoint(run_dir: Path) -> Path:
    """The ``last.pt`` of a run directory (or of its checkpoints/ folder)."""
    run_dir = Path(run_dir)
    for candidate in (run_dir / "checkpoints" / "last.pt", run_dir / "last.pt"):
        if candidate.is_file():
            return candidate
    raise CheckpointError(f"no checkpoint in {run_dir} (looked for checkpoints/last.pt)")


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else "no detail"


def arrays_to_tensors(obj):
    """numpy arrays inside dicts and lists as tensors, which ``weights_only`` loading accepts."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, dict):
        return {k: arrays_to_tensors(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [arrays_to_tensors(v) for v in obj]
    return obj


def tensors_to_arrays(obj):
    """The inverse of ``arrays_to_tensors``."""
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return {k: tensors_to_arrays(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [tensors_to_arrays(v) for v in obj]
    return obj

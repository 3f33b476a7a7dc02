"""Checkpoints: state dicts only, written atomically, read with ``weights_only=True``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import walle_ray
from walle_ray.runtime.files import write_atomic

FORMAT = "walle_ray.checkpoint/1"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt or from something else; the message says which."""


def save_checkpoint(path: Path, payload: dict) -> Path:
    """Write to a temporary file, fsync, rename, fsync the directory: a crash mid-write keeps
    the old file (``runtime/files.py``, which also removes a dead writer's temporary file)."""
    payload = {"format": FORMAT, "walle_ray_version": walle_ray.__version__, **payload}
    return write_atomic(Path(path), lambda f: torch.save(payload, f))


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

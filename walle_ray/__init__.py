"""walle_ray: a Ray-based actor-learner framework for reinforcement learning.

The Python API (``walle_ray/api.py``): ``train``, ``load_policy``, ``evaluate``, ``collect``,
``ConfigError`` for settings that cannot work, and ``CheckpointError`` for a checkpoint that
cannot be used (missing, corrupt, or naming code it was not trusted to run). They are
imported on first use, so importing a part of the package (as memory processes do) loads
nothing else.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

__all__ = ["CheckpointError", "ConfigError", "collect", "evaluate", "load_policy", "train", "__version__"]

_EXPORTS = {"train": "walle_ray.api", "load_policy": "walle_ray.api",
            "evaluate": "walle_ray.api", "collect": "walle_ray.api",
            "ConfigError": "walle_ray.config",
            "CheckpointError": "walle_ray.runtime.checkpoint"}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'walle_ray' has no attribute {name!r}")

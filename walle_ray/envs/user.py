"""A user's own environments: modules to import before envs are made, gymnasium's
``module:EnvId`` ids, and entry points that need no registration.

Every process that builds envs (the driver, each sampler, the evaluator) goes through
``make_vector_env``, which calls ``prepare`` first: what a user's module registers with
gymnasium in one process is registered in every process.
"""

from __future__ import annotations

import importlib

import gymnasium as gym

from walle_ray.config import ConfigError


def _import(module: str, key: str) -> object:
    try:
        return importlib.import_module(module)
    except Exception as exc:  # whatever the user's module raised while importing
        raise ConfigError(f"{key}: cannot import {module!r} ({type(exc).__name__}: {exc}); "
                          "put its folder on PYTHONPATH, install it, or send it to a cluster "
                          "with ray job submit --working-dir") from None


def entry_point_id(entry_point: str) -> str:
    """The gymnasium id an ``env.entry_point`` is registered under in each process."""
    return f"walle-user/{entry_point.rsplit(':', 1)[-1].rsplit('.', 1)[-1]}-v0"


def prepare(cfg) -> str:
    """Import ``env.imports`` and the module of a ``module:EnvId`` id, register
    ``env.entry_point``; returns the gymnasium id to make."""
    for module in cfg.imports or ():
        _import(module, "env.imports")
    if cfg.entry_point:
        module, sep, name = cfg.entry_point.partition(":")
        if not sep or not module or not name:
            raise ConfigError(f"env.entry_point: got {cfg.entry_point!r}; write it as "
                              "'package.module:ClassOrFunction'")
        target = _import(module, "env.entry_point")
        if not callable(getattr(target, name, None)):
            raise ConfigError(f"env.entry_point: module {module!r} has no class or function "
                              f"{name!r}")
        env_id = entry_point_id(cfg.entry_point)
        if env_id not in gym.envs.registry:
            gym.register(env_id, entry_point=cfg.entry_point, disable_env_checker=True)
        return env_id
    module, sep, name = cfg.id.rpartition(":")
    if sep:
        _import(module, "env.id")
        return name
    return cfg.id

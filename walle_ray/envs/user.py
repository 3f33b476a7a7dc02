"""A user's own environments: modules to import before envs are made, gymnasium's
``module:EnvId`` ids, entry points that need no registration, and the wrappers
``env.wrappers`` puts around each env.

Every process that builds envs (the driver, each sampler, the evaluator) goes through
``make_vector_env``, which calls ``prepare`` first: what a user's module registers with
gymnasium in one process is registered in every process.
"""

from __future__ import annotations

import importlib
from functools import partial
from typing import Callable

import gymnasium as gym
from omegaconf import DictConfig, OmegaConf

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


def resolve_target(target: object, key: str) -> Callable:
    """The class or function a ``_target_`` names: 'package.module.Name' or
    'package.module:Name' ('package.module:Outer.Inner' too); its module is imported here,
    and a one-line ConfigError names ``key`` when it cannot be."""
    if not isinstance(target, str) or not target:
        raise ConfigError(f"{key}: got {target!r}; name a class or function, e.g. "
                          "my_pkg.module:ClassOrFunction")
    module, sep, name = target.partition(":") if ":" in target else target.rpartition(".")
    if not sep or not module or not name:
        raise ConfigError(f"{key}: got {target!r}; write it as 'package.module:ClassOrFunction' "
                          "or 'package.module.ClassOrFunction'")
    found = _import(module, key)
    for part in name.split("."):
        found = getattr(found, part, None)
    if not callable(found):
        raise ConfigError(f"{key}: module {module!r} has no class or function {name!r}")
    return found


def wrapper_factories(items) -> list[Callable[[gym.Env], gym.Env]]:
    """``env.wrappers`` as one callable per item, in order: each takes an env and returns it
    wrapped, ``item._target_(env, **the item's other keys)``. Every target is imported here,
    so a name that is wrong fails before any env is made."""
    factories = []
    for i, item in enumerate(items or ()):
        key = f"env.wrappers[{i}]"
        if isinstance(item, DictConfig):
            item = OmegaConf.to_container(item, resolve=True)
        if not isinstance(item, dict) or "_target_" not in item:
            raise ConfigError(f"{key}: got {item!r}; write each wrapper as "
                              "{_target_: package.module.Wrapper, <keyword>: <value>, ...}")
        kwargs = {k: v for k, v in item.items() if k != "_target_"}
        factories.append(partial(_wrap, resolve_target(item["_target_"], f"{key}._target_"), kwargs, key))
    return factories


def _wrap(wrapper: Callable, kwargs: dict, key: str, env: gym.Env) -> gym.Env:
    try:
        return wrapper(env, **kwargs)
    except TypeError as exc:  # most often a keyword the wrapper does not take
        raise ConfigError(f"{key}: {getattr(wrapper, '__name__', wrapper)}(env, **{kwargs}) "
                          f"failed: {exc}") from None

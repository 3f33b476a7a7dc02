"""The Python API: train, load a trained policy, evaluate, record a dataset, from a user's
own code.

    import walle_ray

    result = walle_ray.train(["algo=ppo", "env=cartpole", "topology=local"])
    policy = walle_ray.load_policy(result.run_dir)
    actions = policy.act(observations)           # [N, *obs_shape] -> [N, ...]
    walle_ray.evaluate(result.run_dir, episodes=10)
    walle_ray.collect(run={"checkpoint": str(result.run_dir)}, collect={"out": "expert"})

Everything heavy is imported inside the functions, so ``import walle_ray`` stays light
(memory processes import the package without torch).
"""

from __future__ import annotations

import contextlib
import numbers
import re
from pathlib import Path
from typing import Any, Iterable

import numpy as np


def compose_overrides(overrides: Iterable[str] | None, settings: dict[str, Any]) -> list[str]:
    """Hydra overrides from a list of ``key=value`` strings and keyword settings: a group
    option (``algo="impala"``), a nested mapping (``run={"seed": 1}``), a dotted key passed
    as ``**{"run.seed": 1}``, lists and mappings as values (``env={"wrappers": [...]}``).
    A mapping under a ``kwargs`` key (``env.kwargs``, ``model.kwargs``) is passed whole: its
    keys are the user's own, not the schema's."""
    out = list(overrides or ())

    def add(key: str, value: Any) -> None:
        if isinstance(value, dict) and value and key.rsplit(".", 1)[-1] != "kwargs":
            for sub, item in value.items():
                add(f"{key}.{sub}", item)
        elif isinstance(value, dict):
            out.append(f"++{key}={hydra_value(value)}")
        else:
            out.append(f"{key}={hydra_value(value)}")

    for key, value in settings.items():
        add(key, value)
    return out


def hydra_value(value: Any) -> str:
    """A Python value in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if re.fullmatch(r"[\w./:@+-]+", text) and text not in ("null", "true", "false"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def train(overrides: Iterable[str] | None = None, *, config_dir: str | Path | None = None,
          run_dir: str | Path | None = None, **settings: Any):
    """Run one training run, as ``python -m walle_ray <overrides>`` would, and return its
    ``RunResult``: ``run_dir``, ``counters`` (env steps, iterations, episodes, wall time),
    ``metrics`` (the last record, as written to ``metrics.jsonl``), ``stopped_by`` (budget,
    wall, return or signal) and ``exit_code``.

    ``overrides`` are the command line's ``key=value`` words; keyword ``settings`` add more
    (``algo="impala"``, ``run={"total_env_steps": 20_000}``). ``config_dir`` adds a directory
    of the user's own env, algo, preset or topology files (the command line's
    ``--config-dir``). ``run_dir`` replaces the dated directory under ``runs/``.
    Bad settings raise ``walle_ray.ConfigError`` with the key named. A local Ray instance the
    run starts is shut down when it ends.
    """
    import ray

    from walle_ray.config import ConfigError
    from walle_ray.runtime.train import train as run_training

    named = run_dir is not None
    cfg, run_dir, stored = _compose(compose_overrides(overrides, settings), config_dir, run_dir)
    if cfg.mode != "train":
        raise ConfigError("mode: walle_ray.train trains; use walle_ray.evaluate for mode=eval")
    started_ray = not ray.is_initialized()
    try:
        return run_training(cfg, run_dir, stored)
    except ConfigError:
        if not named:  # the dated directory made for this run, still empty
            with contextlib.suppress(OSError):
                run_dir.rmdir()
        raise
    finally:
        if started_ray and ray.is_initialized():
            ray.shutdown()


def collect(overrides: Iterable[str] | None = None, *, config_dir: str | Path | None = None,
            **settings: Any) -> dict:
    """Record episodes into a Minari dataset, as ``python -m walle_ray mode=collect
    <overrides>`` would (README, "Learning from recorded data"), in this process, without
    Ray: ``walle_ray.collect(run={"checkpoint": run_dir}, collect={"episodes": 50, "out":
    "datasets/expert"})``. Returns what it wrote: ``episodes``, ``steps``, ``return_mean``,
    ``return_std``, ``path`` (the data directory) and ``dataset_id``."""
    from walle_ray.runtime.collect import collect as run_collect

    cfg, _, _ = _compose(["mode=collect", *compose_overrides(overrides, settings)], config_dir, None)
    return run_collect(cfg)


def _compose(overrides: list[str], config_dir, run_dir):
    """The job config, its run directory (``run_dir``, else for ``mode=train`` a new one named
    by ``hydra.run.dir``) and the overrides to store for ``run.resume``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from walle_ray.algos import register_configs

    from walle_ray.config import CONF_DIR, ConfigError
    from walle_ray.runtime.args import (announce_preset, checked_config_dirs, rewrite_args,
                                        searchpath_override)
    from walle_ray.runtime.override_keys import check_overrides

    dirs = checked_config_dirs([config_dir] if config_dir is not None else [], "config_dir")
    overrides = rewrite_args(overrides, [CONF_DIR, *dirs])
    check_overrides(overrides, [CONF_DIR, *dirs])
    if dirs:
        overrides.append(searchpath_override(dirs))
    register_configs()
    GlobalHydra.instance().clear()  # a Hydra app in this process (a test, a notebook) may hold it
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        try:
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
        except Exception as exc:  # Hydra's own errors name the override; the cause says why
            lines = [line.strip() for error in (exc, exc.__cause__) if error is not None
                     for line in str(error).strip().splitlines() if line.strip()]
            raise ConfigError("; ".join(dict.fromkeys(lines))) from None
    if run_dir is None and cfg.mode == "train":  # walle_new_dir creates it: only for a run
        run_dir = cfg.hydra.run.dir
    announce_preset(cfg.hydra.runtime.choices.get("preset"),
                    [Path(s.path) for s in cfg.hydra.runtime.config_sources if s.schema == "file"])
    with open_dict(cfg):
        del cfg["hydra"]
    stored = [o for o in overrides if not o.startswith("hydra.run.dir=")]
    return cfg, Path(run_dir) if run_dir is not None else None, stored


class Policy:
    """A trained policy for a user's own code: ``act(obs)`` takes a batch of observations
    (numpy, ``[N, *obs_shape]``, or one observation ``[*obs_shape]``) and returns the
    actions as numpy (``[N, ...]``, or one action), as values of ``action_space`` (a Box's
    clipped to its bounds, a Discrete's shifted by its start). Greedy unless loaded with
    ``deterministic=False``. Runs in this process on the CPU; no Ray.

    ``observation_space`` and ``action_space`` are those of the env it was trained on (as the
    samplers saw them: flattened when the env's were Dict or Tuple); ``env_steps`` and
    ``version`` say how far it was trained; ``config`` is the run's config.

    A recurrent policy (``model.core``) keeps a state for each of the N observations' envs
    from call to call: call ``reset()`` when every episode starts over, or ``reset(done)``
    ([N] bool) for the envs whose episode ended; a batch of another size starts from zeros.
    """

    def __init__(self, acting, observation_space, action_space, config: dict, env_steps: int,
                 version: int):
        self._acting = acting
        self.observation_space = observation_space
        self.action_space = action_space
        self.config = config
        self.env_steps = env_steps
        self.version = version
        self._obs_shape = tuple(observation_space.shape)
        self._obs_dtype = np.dtype(observation_space.dtype)
        if np.issubdtype(self._obs_dtype, np.floating):
            self._obs_dtype = np.dtype(np.float32)

    def act(self, obs, action_mask=None) -> np.ndarray:
        """Actions for ``obs``. An env with Dict observations may also be given one in its
        own structure (a dict; a list of them for a batch), flattened here. Where the env
        gives its mask in ``info["action_mask"]`` (``env.action_mask=info``), pass it as
        ``action_mask`` ([n], or [N, n] for a batch); left out, every action is allowed."""
        from walle_ray.envs.spaces import to_space

        obs = self._flat(obs, action_mask)
        obs = np.asarray(obs, dtype=self._obs_dtype)
        single = obs.shape == self._obs_shape
        if single:
            obs = obs[None]
        if obs.shape[1:] != self._obs_shape:
            raise ValueError(f"observations of shape {obs.shape}; this policy takes "
                             f"[N, {', '.join(map(str, self._obs_shape))}]")
        actions = to_space(self.action_space, np.asarray(self._acting.act(np.ascontiguousarray(obs))))
        return actions[0] if single else actions

    def _flat(self, obs, action_mask):
        """``obs`` as the samplers saw it: a Dict observation (or a list of them) flattened,
        an info mask joined to the observation it came with; a masked policy given no mask
        allows every action."""
        import gymnasium as gym

        from walle_ray.envs.spaces import MASK_KEY

        space = self.observation_space
        source, masked = getattr(space, "source", None), getattr(space, "action_mask", None)
        if action_mask is not None and masked is None:
            raise ValueError("act: this policy was trained without action masks "
                             "(env.action_mask=none); call act(obs)")
        structured = isinstance(obs, dict) or (isinstance(obs, list) and len(obs) > 0
                                                and isinstance(obs[0], dict))
        info = masked is not None and space.mask_from == "info" and set(source.spaces) == {"obs", MASK_KEY}
        if not structured:
            if action_mask is None and (not info or np.shape(obs)[-1:] == self._obs_shape):
                return obs  # flat already (or the wrong shape, which act reports)
            if not info:
                raise ValueError("act: this policy's env puts its mask in the observation; pass "
                                 "the Dict observation with its 'action_mask', or the flattened one")
        batch = isinstance(obs, list) and structured
        masks = None
        if action_mask is not None:
            masks = _mask_rows(action_mask)
            batch = batch or masks.ndim == 2
        if not structured and action_mask is None:  # an info env's raw observation, no mask
            batch = np.shape(obs) != source["obs"].shape
        rows = list(obs) if batch else [obs]
        if masks is None:
            width = masked[1] - masked[0] if masked else 0
            masks = np.ones((len(rows), width), np.int8)
        elif masks.ndim == 1:
            masks = masks[None]
        if len(rows) != len(masks):
            raise ValueError(f"act: {len(rows)} observations and {len(masks)} masks")
        flat = []
        for row, mask in zip(rows, masks):
            if isinstance(row, dict):
                if masked:  # the mask given, else the observation's own, else all allowed
                    row = {**row, MASK_KEY: mask if action_mask is not None else row.get(MASK_KEY, mask)}
            else:
                row = {"obs": row, MASK_KEY: mask}
            flat.append(gym.spaces.flatten(source, row))
        return np.stack(flat) if batch else flat[0]

    def reset(self, done=None) -> None:
        """Start a recurrent policy's episodes over: all of them, or where ``done`` [N] is
        true. A feed-forward policy has nothing to forget."""
        reset = getattr(self._acting, "reset", None)
        if reset is None or getattr(self._acting, "state", None) is None:
            return
        envs = len(self._acting.state)
        done = np.ones(envs, bool) if done is None else np.atleast_1d(np.asarray(done, bool))
        if done.shape != (envs,):
            raise ValueError(f"reset(done): done has shape {done.shape}; this policy holds the "
                             f"state of {envs} envs (the batch its last act was given)")
        reset(done)


def _mask_rows(action_mask) -> np.ndarray:
    """An action mask as ``act`` is given it, as [n] or [N, n] 0/1: a tuple of one array per
    MultiDiscrete component is joined, as ``InfoMask`` joins it."""
    if isinstance(action_mask, tuple):
        parts = [np.asarray(m) for m in action_mask]
        return np.concatenate(parts, axis=-1).astype(np.int8)
    return np.asarray(action_mask).astype(np.int8)


def load_policy(checkpoint: str | Path, deterministic: bool = True, seed: int = 0,
                trust_code: bool = False) -> Policy:
    """The policy of a checkpoint file or run directory (its ``checkpoints/last.pt``), built
    as the run's evaluation builds it. A checkpoint whose parts do not fit together (weights
    of another network, a config or counters missing) raises ``CheckpointError``.

    A checkpoint whose env or network is code (``env.imports``, an ``env.entry_point``, a
    ``module:EnvId`` id, ``env.wrappers``, ``model._target_``) is refused with a
    ``CheckpointError`` naming it, unless ``trust_code=True``: building it imports and runs
    that code, here, so it must be importable in this process (docs/faults.md, "Files from
    elsewhere")."""
    from walle_ray.algos import algorithm_of
    from walle_ray.envs import env_spaces
    from walle_ray.runtime.checkpoint import (CheckpointError, checked_config, first_line,
                                              load_checkpoint)
    from walle_ray.runtime.evaluate import typed_sections
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = Path(checkpoint)
    ckpt = load_checkpoint(path)
    config = checked_config(ckpt, path, trust_code)

    def inconsistent(what: str, exc: BaseException) -> CheckpointError:
        return CheckpointError(f"checkpoint {path} is inconsistent: {what} "
                               f"({type(exc).__name__}: {first_line(exc)})")

    try:
        trained = OmegaConf.create(config)
        algo = algorithm_of(OmegaConf.to_container(trained.algo))
        sections = typed_sections(trained, algo.config_cls)
        weights = {k: v.numpy() for k, v in ckpt["learner"]["model"].items()}
        env_steps, version = int(ckpt["counters"]["env_steps"]), int(ckpt["learner"]["version"])
    except (KeyError, TypeError, ValueError, AttributeError, OmegaConfBaseException) as exc:
        raise inconsistent("its config, counters or learner state are incomplete", exc) from None
    obs_space, action_space = env_spaces(sections.env)
    acting = algo.eval_policy(obs_space, action_space, sections, seed, deterministic)
    try:
        acting.set_weights(weights)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise inconsistent("its weights do not fit the network its config describes", exc) from None
    return Policy(acting, obs_space, action_space, config, env_steps, version)


def evaluate(checkpoint: str | Path, episodes: int = 10, deterministic: bool = True,
             seed: int = 1, video_dir: str | Path | None = None, trust_code: bool = False) -> dict:
    """Run ``episodes`` whole episodes of the checkpoint's env with its policy, as
    ``mode=eval`` does; returns ``return_mean``, ``return_std``, ``returns``, ``lengths``
    and ``videos`` (MP4 paths, when ``video_dir`` is given). ``episodes`` must be a
    positive whole number (``ConfigError``). The code a checkpoint names is refused unless
    ``trust_code=True``, as for ``load_policy``."""
    from walle_ray.config import ConfigError
    from walle_ray.runtime.evaluate import evaluate_checkpoint

    if not isinstance(episodes, numbers.Integral) or isinstance(episodes, bool) or episodes < 1:
        raise ConfigError(f"episodes: got {episodes!r}; use a positive whole number, e.g. "
                          "episodes=10")
    return evaluate_checkpoint(Path(checkpoint), int(episodes), seed, deterministic,
                               Path(video_dir) if video_dir is not None else None, trust_code)

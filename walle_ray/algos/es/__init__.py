"""ES: evolution strategies (Salimans et al. 2017), synchronous: samplers evaluate
antithetic perturbations from a shared noise table, the learner steps along their centred
ranks."""

from __future__ import annotations

import math
from functools import partial

import gymnasium as gym
import numpy as np
import torch
from omegaconf import DictConfig

from walle_ray.algos.es.config import ESConfig
from walle_ray.algos.es.model import ESPolicy, make_model
from walle_ray.algos.es.update import ESUpdate
from walle_ray.algos.spec import Algorithm, require_algo, role_sections

_TABLES: dict = {}  # (seed, size, Ray job) -> where samplers find the table


def noise_source(seed: int, size: int):
    """Where samplers get the shared noise table: under Ray the name of the ``RefHolder``
    (``algos/es/holder.py``) whose box holds its ObjectRef, the table put in the object store
    once per job; else a one-element list holding the array."""
    from walle_ray.algos.es.ops import noise_table

    try:
        import ray

        job = ray.get_runtime_context().get_job_id() if ray.is_initialized() else None
    except ImportError:
        job = None
    key = (seed, size, job)
    if key not in _TABLES:
        _TABLES.clear()  # one table at a time: an older job's is gone with its job
        table = noise_table(size, seed)
        if job is None:
            _TABLES[key] = [table]
        else:
            name = f"walle/es-noise-{seed}-{size}"
            from walle_ray.algos.es.holder import RefHolder

            holder = ray.remote(RefHolder).options(name=name, num_cpus=0, get_if_exists=True)
            _TABLES[key] = (name, holder.remote([ray.put(table)]))  # the handle keeps it alive
    entry = _TABLES[key]
    return entry[0] if isinstance(entry, tuple) else entry


def _model_factory(sections, obs_space, action_space) -> ESPolicy:
    return make_model(obs_space, action_space, sections)


def sampler_spec(algo, cfg: DictConfig, topo, i: int) -> tuple[type, tuple, dict]:
    """Sampler i evaluates its share of ``algo.pairs`` (rounded up) each iteration."""
    from walle_ray.algos.es.sampler import ESSampler

    a = cfg.algo
    sections = role_sections(cfg)
    pairs = math.ceil(a.pairs / max(1, topo.samplers))
    return ESSampler, (sections.env, partial(_model_factory, sections), pairs, float(a.noise_std),
                       float(a.action_noise_std), noise_source(a.noise_seed, a.noise_size), i,
                       cfg.run.seed), {}


def memory_needs(algo, cfg: DictConfig, obs_space, action_space) -> list:
    """The noise table, ``algo.noise_size`` float32 values, held twice: once where samplers
    read it (the object store, or the driver under ``topology=local``) and once by the
    learner, which rebuilds it from its seed."""
    from walle_ray.memory_plan import MemoryNeed

    return [MemoryNeed("algo.noise_size", int(cfg.algo.noise_size),
                       lambda size: 2 * size * np.dtype(np.float32).itemsize)]


def make_update(cfg: DictConfig, model, collective, device: torch.device) -> ESUpdate:
    return ESUpdate(cfg.algo, model, collective, cfg.run.total_env_steps, device)


class ESEvalPolicy:
    """Evaluation acts with the unperturbed policy (deterministic either way)."""

    def __init__(self, obs_space, action_space, cfg, seed: int, deterministic: bool):
        self.model = make_model(obs_space, action_space, cfg)
        self.model.eval()

    def set_weights(self, weights) -> None:
        self.model.set_weights(weights)

    def act(self, obs):
        with torch.inference_mode():
            return self.model(torch.from_numpy(obs)).numpy()


def check_spaces(obs_space: gym.Space, action_space: gym.Space) -> None:
    from walle_ray.config import ConfigError

    vector = isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1
    acts = isinstance(action_space, gym.spaces.Discrete) or (
        isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1)
    if not (vector and acts):
        raise ConfigError(f"ES evolves an MLP policy: it needs vector observations and Discrete "
                          f"or 1-D Box actions; this env has {obs_space} and {action_space}")


def validate(cfg: DictConfig) -> None:
    from walle_ray.config import ConfigError
    from walle_ray.topology import parse_topology

    a = cfg.algo
    require_algo([
        (a.pairs > 0, "pairs", "must be positive"),
        (a.noise_std > 0, "noise_std", "must be positive"),
        (a.lr > 0, "lr", "must be positive"),
        (a.l2_coef >= 0, "l2_coef", "must be zero (off) or positive"),
        (a.noise_size > 0, "noise_size", "must be positive"),
        (a.action_noise_std >= 0, "action_noise_std", "must be zero (off) or positive"),
    ])
    if cfg.model.activation not in ("tanh", "relu"):
        raise ConfigError(f"model.activation: ES policies use tanh or relu, not {cfg.model.activation!r}")
    if cfg.model.get("_target_"):
        raise ConfigError("model._target_: ES evolves its own MLP (model.hidden, "
                          "model.activation); a network of your own is for ppo, impala and the others")
    if cfg.env.normalize_reward:
        raise ConfigError("env.normalize_reward: ES ranks episode returns, so their scale does "
                          "not matter; set env.normalize_reward=false")
    topo = parse_topology(cfg.topology.spec)
    if topo.learners > 1:
        raise ConfigError(f"topology: ES's update is one sum over every perturbation of an "
                          f"iteration, made by one learner; use {topo.samplers}a1m1l")


ES = Algorithm(name="es", config_cls=ESConfig, loop="sync", make_update=make_update,
               fragment_length=lambda cfg, topo: 1, validate=validate, check_spaces=check_spaces,
               make_model=make_model, sampler_spec=sampler_spec, eval_policy=ESEvalPolicy,
               estimate_memory=memory_needs, split_work=lambda cfg: int(cfg.algo.pairs))

"""What every algorithm folder exports: its config class, how it updates, how it runs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace
from typing import Any, Callable, Optional

import gymnasium as gym
from omegaconf import DictConfig


def packed_as_is(cfg: DictConfig, shards: int) -> DictConfig:
    """``Algorithm.packed_learner`` for an update whose loss is a mean over the rows of the
    batches it is given: one process learning from a batch of each shard computes the mean
    of the shards' gradients, as their all-reduce would, with the same settings."""
    return cfg


@dataclass(frozen=True)
class Algorithm:
    """One algorithm's wiring, resolved once where a run starts (``algos.algorithm_for``)
    and handed to every part of the runtime that builds its roles.

    ``make_update(cfg, model, collective, device)`` builds the object that turns fragments
    into a parameter update (it owns the optimizer); ``loop`` names the driver loop;
    ``validate(cfg)`` raises ConfigError for settings that cannot work;
    ``check_spaces(obs_space, action_space)`` refuses environments the algorithm cannot act in;
    ``fragment_length(cfg, topology)`` is the number of steps per env in one fragment;
    ``make_model(obs_space, action_space, cfg)`` builds the network learners train and
    samplers act with (anything with ``get_weights`` / ``set_weights``);
    ``recurrent``: its updates unroll ``model.core`` over each fragment from the state its
    sampler stored (``Rollout.state_b``), so ``model.core`` may be set;
    ``reads_dataset``: its memories serve recorded data, so a topology with no samplers
    (``0a1m1l``) is legal for it and the run counts the recorded steps it learned from;
    ``deals_rows``: its fragments' rows are dealt across the memories (``Topology.routes``).
    ``packed_learner(cfg, shards)``: the config of one learner process that holds ``shards``
    of the topology's learner shards (``topology.pack``), given a batch from each per
    update, so that its gradient is the mean the shards' all-reduce would compute; None:
    its learners are never packed. An update's ``memory_feedback`` after several batches
    has ``split(sizes)``, its part for each batch (``Priorities``).

    The algorithm builds its roles, so the runtime never asks which algorithm it runs. Each
    ``*_spec`` function gets the algorithm first and gives a class with its constructor's
    positional and keyword arguments (call them through ``sampler``, ``memory`` and
    ``learner``): ``sampler_spec(algo, cfg, topo, i)``, sampler i (the one acting loop,
    ``Sampler``, given the algorithm's ``ActingPolicy`` and ``Writer`` factories);
    ``memory_spec(algo, cfg, k)``, memory k of an asynchronous algorithm (a synchronous one's
    learners take its samplers' fragments directly); ``learner_spec(algo, cfg, shards)``, a
    learner process holding ``shards`` learner shards (``Learner`` with ``make_model`` and
    ``make_update``; the runtime adds the spaces and the device).
    ``estimate_memory(algo, cfg, obs_space, action_space)``: what its memories hold once
    full, as ``memory_plan.MemoryNeed``s, one per setting that sizes them (call it through
    ``memory_needs``); None: its memories hold nothing that a setting grows. The run checks
    them, with its role processes, against the memory it has before any role starts.
    ``eval_policy(obs_space, action_space, cfg, seed, deterministic)`` is what evaluation acts
    with (``set_weights``, ``act``), ``cfg`` holding the trained run's env, model and algo
    sections as dataclasses.
    ``split_work(cfg)``: a synchronous algorithm whose iteration is a number of like pieces of
    work, two episodes each, dealt among its samplers whatever their envs (ES's antithetic
    pairs) gives that number, and ``topology=auto`` may run any sampler count that divides
    it and leaves each sampler an episode per env; None: a synchronous run holds its total
    envs (the batch over them is the fragment length).
    """

    name: str
    config_cls: type
    loop: str  # "sync" (collect, then learn) or "async" (samplers and learners overlap)
    make_update: Callable
    fragment_length: Callable
    validate: Callable[[DictConfig], None]
    check_spaces: Callable[[gym.Space, gym.Space], None]
    make_model: Callable[..., Any] = None  # type: ignore[assignment]  # set in __post_init__
    reads_dataset: bool = False
    sampler_spec: Callable[..., tuple[type, tuple, dict]] = None  # type: ignore[assignment]
    memory_spec: Optional[Callable[..., tuple[type, tuple, dict]]] = None
    learner_spec: Callable[..., tuple[type, tuple, dict]] = None  # type: ignore[assignment]
    eval_policy: Callable[..., Any] = None  # type: ignore[assignment]
    packed_learner: Optional[Callable[[DictConfig, int], DictConfig]] = None
    recurrent: bool = False  # its updates unroll a recurrent core (model.core)
    # Its fragments are rows of env columns that may be dealt across the memories
    # (``Topology.routes``): IMPALA's, whose memories serve rows to their learners
    deals_rows: bool = False
    estimate_memory: Optional[Callable[..., list]] = None
    split_work: Optional[Callable[[DictConfig], int]] = None

    def __post_init__(self) -> None:
        if self.make_model is None:
            object.__setattr__(self, "make_model", actor_critic_model)
        if self.sampler_spec is None:
            object.__setattr__(self, "sampler_spec", fragment_sampler_spec)
        if self.learner_spec is None:
            object.__setattr__(self, "learner_spec", learner_spec)
        if self.eval_policy is None:
            object.__setattr__(self, "eval_policy", ActorCriticPolicy)

    def sampler(self, cfg: DictConfig, topo, i: int) -> tuple[type, tuple, dict]:
        """Sampler i's class and arguments (``sampler_spec``)."""
        return self.sampler_spec(self, cfg, topo, i)

    def memory(self, cfg: DictConfig, k: int) -> tuple[type, tuple, dict]:
        """Memory k's class and arguments (``memory_spec``; an asynchronous algorithm's)."""
        return self.memory_spec(self, cfg, k)

    def memory_needs(self, cfg: DictConfig, obs_space: gym.Space, action_space: gym.Space) -> list:
        """What the memories hold once full, by the setting that sizes each
        (``estimate_memory``; none for an algorithm without)."""
        if self.estimate_memory is None:
            return []
        return self.estimate_memory(self, cfg, obs_space, action_space)

    def work_pieces(self, cfg: DictConfig) -> int:
        """The pieces of an iteration's work its samplers deal among them (``split_work``);
        0 for an algorithm without."""
        return int(self.split_work(cfg)) if self.split_work else 0

    def learner(self, cfg: DictConfig, shards: int = 1) -> tuple[type, tuple, dict]:
        """A learner process's class and arguments, for ``shards`` learner shards
        (``learner_spec``); construct it with the spaces after ``args``."""
        return self.learner_spec(self, cfg, shards)

    def build_learner(self, cfg: DictConfig, obs_space: gym.Space, action_space: gym.Space,
                      shards: int = 1, **kwargs):
        """A learner in this process (``LocalFleet``, tests, benchmarks)."""
        cls, args, spec_kwargs = self.learner(cfg, shards)
        return cls(*args, obs_space, action_space, **spec_kwargs, **kwargs)


def learner_spec(algo: Algorithm, cfg: DictConfig, shards: int) -> tuple[type, tuple, dict]:
    """The plain ``Learner``, with the config of a process of ``shards`` learner shards
    (``Algorithm.packed_learner``) and the algorithm's model and update factories."""
    from walle_ray.learners import Learner

    config = cfg if algo.packed_learner is None else algo.packed_learner(cfg, shards)
    return Learner, (config,), {"make_model": algo.make_model, "make_update": algo.make_update}


class ActorCriticActing:
    """How the policy-gradient methods act on a sampler (the ``ActingPolicy`` contract): one
    batched forward pass per step, an action sampled from the head (its mode when
    ``deterministic``). The extras are what ``FragmentWriter`` keeps of each step: the
    action, its log-probability and the head's parameters as tensors, and the value, or None
    with a separate critic (the writer values those observations in one batch).

    ``act`` runs inside the sampler's ``torch.inference_mode`` (``Sampler.collect``); it is
    called once per env step, so it looks nothing up that it can keep.

    A recurrent model (``model.core``) keeps each env's state here: ``act`` steps it,
    ``reset`` zeroes it where episodes ended (the sampler calls it after the writer has
    valued their final observations), ``core_state`` is what a fragment stores at its start."""

    def __init__(self, obs_space, action_space, cfg, deterministic: bool = False,
                 encode: bool = False):
        """``encode``: each step's extras also carry the policy's encoding of the state
        (``ActorCritic.encode``, from the same forward pass), which elite replay compares
        with the learner's encoding later (``walle_ray/buffers/ranked.py``)."""
        import torch

        self.model = actor_critic_model(obs_space, action_space, cfg)
        self.model.eval()
        self.separate = self.model.separate_critic
        self.recurrent = getattr(self.model, "recurrent", False)
        self.state = None  # [B, S] per env, from the first act (a recurrent model's)
        self.deterministic = deterministic
        self.encode = encode
        self._tensor = torch.from_numpy
        self._head_act = self.model.head.act

    def set_weights(self, weights) -> None:
        self.model.set_weights(weights)

    def act(self, obs, env_steps: int = 0):
        x = self._tensor(obs)
        encoded = None
        if self.encode:
            if self.recurrent:
                params, value, self.state, encoded = self.model.step(x, self._state(len(obs)), True)
            elif self.separate:
                (params, encoded), value = self.model.policy(x, True), None
            else:
                params, value, encoded = self.model(x, True)
        elif self.recurrent:
            params, value, self.state = self.model.step(x, self._state(len(obs)))
        elif self.separate:
            params, value = self.model.policy(x), None
        else:
            params, value = self.model(x)
        action, logp = self._head_act(params, self.deterministic)
        return action.numpy(), (action, logp, params, value, encoded)

    def value(self, obs, rows=None):
        """State values of ``obs`` [N, *obs_shape] as numpy (under the caller's inference
        mode). A recurrent model values them from the state after the last step: every env's,
        or those of ``rows`` (an index array) when ``obs`` holds only theirs."""
        x = self._tensor(obs)
        if self.recurrent:
            state = self._state(len(obs)) if rows is None else self.state[rows]
            return self.model.step(x, state)[1].numpy()
        return self.model.value(x).numpy()

    def reset(self, done) -> None:
        """Zero the state of the envs whose episode ended (``done`` [B] bool)."""
        if self.state is not None:
            import torch

            with torch.inference_mode():
                self.state = self.state.masked_fill(self._tensor(done)[:, None], 0.0)

    def core_state(self, batch: int):
        """The state [B, S] as numpy (zeros before the first step; width 0 without a core)."""
        if not self.recurrent:
            import numpy as np

            return np.zeros((batch, 0), np.float32)
        return self._state(batch).numpy().copy()

    def _state(self, batch: int):
        """Each env's state, zeros before the first step."""
        if self.state is None or len(self.state) != batch:
            self.state = self.model.initial_state(batch)
        return self.state

    def stats(self) -> dict[str, float]:
        return {}


class ActorCriticPolicy(ActorCriticActing):
    """Evaluation for the policy-gradient methods: acts as their samplers do, with the
    action head's mode when deterministic, else a sample from it."""

    def __init__(self, obs_space, action_space, cfg, seed: int, deterministic: bool):
        super().__init__(obs_space, action_space, cfg, deterministic)

    def act(self, obs):
        import torch

        with torch.inference_mode():
            return super().act(obs)[0]


def _actor_critic_acting(cfg, encode: bool, obs_space, action_space, index: int,
                         seed: int) -> ActorCriticActing:
    return ActorCriticActing(obs_space, action_space, cfg, encode=encode)


def _fragment_writer(gamma: float, track_return: bool, bootstrap_value: bool, policy, env,
                     fragment_length: int):
    from walle_ray.actors.writers import FragmentWriter

    return FragmentWriter(policy, env, fragment_length, gamma, track_return, bootstrap_value)


def fragment_sampler_args(env_cfg, model_cfg, fragment_length: int, gamma: float, index: int = 0,
                          seed: int = 0, bootstrap_value: bool = True, encode: bool = False) -> tuple:
    """``Sampler``'s arguments for the policy-gradient methods: the actor-critic acting, a
    ``FragmentWriter`` keeping fixed-length fragments (with each step's state encoding when
    ``encode``: ``ActorCriticActing``)."""
    policy = partial(_actor_critic_acting, SimpleNamespace(env=env_cfg, model=model_cfg), encode)
    writer = partial(_fragment_writer, float(gamma), bool(env_cfg.normalize_reward), bootstrap_value)
    return env_cfg, policy, writer, fragment_length, index, seed


def fragment_sampler(*args, **kwargs):
    """A policy-gradient ``Sampler`` in this process (``fragment_sampler_args``' arguments)."""
    from walle_ray.actors.sampler import Sampler

    return Sampler(*fragment_sampler_args(*args, **kwargs))


def fragment_sampler_spec(algo: Algorithm, cfg, topo, i: int, bootstrap_value: bool = True,
                          encode: bool = False) -> tuple[type, tuple, dict]:
    """Sampler i of the policy-gradient methods (``fragment_sampler_args``). An algorithm
    whose learners value each fragment's last observation themselves passes
    ``bootstrap_value=False``, so samplers skip that value; ``encode`` keeps each step's
    state encoding (elite replay)."""
    from walle_ray.actors.sampler import Sampler

    sections = role_sections(cfg)
    return Sampler, fragment_sampler_args(sections.env, sections.model, algo.fragment_length(cfg, topo),
                                          cfg.algo.gamma, i, cfg.run.seed, bootstrap_value,
                                          encode), {}


def role_sections(cfg) -> SimpleNamespace:
    """The env, model and algo sections as plain dataclasses, for roles built in other
    processes: a config node would pickle the whole config tree with it."""
    from omegaconf import OmegaConf

    return SimpleNamespace(env=OmegaConf.to_object(cfg.env), model=OmegaConf.to_object(cfg.model),
                           algo=OmegaConf.to_object(cfg.algo))


def configured_fragment_length(cfg, topo) -> int:
    """``algo.fragment_length`` as configured (asynchronous and replay-based algorithms)."""
    return cfg.algo.fragment_length


def learner_batch(cfg) -> int:
    """Rows (IMPALA), transitions (replay) or recorded steps (BC, MARWIL) each learner shard
    takes per update. ``algo.batch_size`` is the whole update's, split evenly across the
    topology's L learners, whose all-reduce averages the gradient over all of them: adding
    learners spreads an update's work without changing what it learns (docs/algorithms.md,
    "One update, however many learners"). ``check_learner_batch`` refuses a batch that L
    does not divide."""
    from walle_ray.topology import parse_topology

    return cfg.algo.batch_size // parse_topology(cfg.topology.spec).learners


def check_learner_batch(cfg, unit: str = "rows") -> None:
    """``algo.batch_size`` splits into whole ``unit`` for every learner of the topology."""
    from walle_ray.config import ConfigError
    from walle_ray.topology import parse_topology

    learners, n = parse_topology(cfg.topology.spec).learners, cfg.algo.batch_size
    if n % learners:
        whole = [d for d in range(1, n + 1) if n % d == 0 and d <= max(8, learners)]
        raise ConfigError(
            f"algo.batch_size: {n} {unit} per update do not split evenly across "
            f"{learners} learners; use a multiple of {learners} (e.g. "
            f"algo.batch_size={n + learners - n % learners}), or {', '.join(map(str, whole))} "
            "learners")


def require_algo(checks: list[tuple[bool, str, str]]) -> None:
    """Raise ConfigError("algo.<key>: <message>") for the first (ok, key, message) not ok."""
    from walle_ray.config import ConfigError

    for ok, key, message in checks:
        if not ok:
            raise ConfigError(f"algo.{key}: {message}")


def actor_critic_model(obs_space: gym.Space, action_space: gym.Space, cfg):
    """The policy-gradient methods' network: ``ActorCritic`` from ``cfg.model`` and ``cfg.env``,
    or the user's own (``model._target_``, ``models/user.py``)."""
    from walle_ray.models import make_actor_critic

    return make_actor_critic(obs_space, action_space, cfg.model, cfg.env.normalize_obs)


def check_policy_spaces(algo_name: str) -> Callable[[gym.Space, gym.Space], None]:
    """A ``check_spaces`` for policy-gradient methods: actions an action head can sample
    (Discrete, 1-D Box, MultiDiscrete, MultiBinary; ``models/heads.py``)."""

    def check(obs_space: gym.Space, action_space: gym.Space) -> None:
        from walle_ray.config import ConfigError
        from walle_ray.models.heads import SUPPORTED_ACTION_SPACES, make_action_head

        try:
            make_action_head(action_space)
        except TypeError:
            raise ConfigError(f"{algo_name} needs one of these action spaces: "
                              f"{SUPPORTED_ACTION_SPACES}; this env has {action_space}") from None

    return check


def check_discrete(algo_name: str) -> Callable[[gym.Space, gym.Space], None]:
    """A ``check_spaces`` for value-based methods that pick among finitely many actions."""

    def check(obs_space: gym.Space, action_space: gym.Space) -> None:
        from walle_ray.config import ConfigError

        if not isinstance(action_space, gym.spaces.Discrete):
            other = ("algo=ppo or algo=impala" if isinstance(
                action_space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
                else "algo=td3, algo=ddpg or algo=ppo")
            raise ConfigError(f"{algo_name} needs a discrete action space (gymnasium Discrete); "
                              f"this env has {action_space}. For these actions use {other}")

    return check


def check_continuous(algo_name: str) -> Callable[[gym.Space, gym.Space], None]:
    """A ``check_spaces`` for deterministic-policy methods: bounded 1-D Box actions."""

    def check(obs_space: gym.Space, action_space: gym.Space) -> None:
        import numpy as np

        from walle_ray.config import ConfigError

        if not (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1):
            raise ConfigError(f"{algo_name} needs a continuous action space (a 1-D gymnasium Box); "
                              f"this env has {action_space}. For discrete actions use "
                              "algo=dqn, algo=apex, algo=impala or algo=ppo")
        if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
            raise ConfigError(f"{algo_name} needs bounded actions; this env has {action_space}")

    return check

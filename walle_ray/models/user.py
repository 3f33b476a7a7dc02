"""Your own network: ``model._target_`` names a class or function that builds a plain
``nn.Module``, called as ``target(obs_space, action_space, model_cfg, **model.kwargs)``.

The contract each family of algorithms needs of it is in ``walle_ray/contracts.py``:
``ActorCriticNet`` (PPO, PPO-KL, IMPALA), ``QNet`` (DQN, Ape-X), ``DeterministicNet`` (DDPG,
TD3, Ape-X DDPG). A wrapper here gives the user's module what samplers, updates, evaluation
and checkpoints call on the built-in networks (the action head, ``policy``/``value``,
observation normalisation, action bounds, ``get_weights``/``set_weights``); its state dict
holds the user's weights under ``net.``.

The model factories (``make_actor_critic``, ``make_q_network``, ``make_deterministic_model``)
build these wrappers, so every process that builds a model (driver, samplers, learners,
evaluator) imports the user's module itself. ``check_user_model`` runs in the driver before
any role starts: one build, one forward pass on a few sampled observations, and a one-line
ConfigError naming what does not fit.
"""

from __future__ import annotations

import copy
from typing import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from walle_ray.config import ConfigError, ModelConfig
from walle_ray.models.deterministic import BoundedActions
from walle_ray.models.heads import make_action_head
from walle_ray.models.masking import action_mask, masked
from walle_ray.models.normalizer import RunningNorm
from walle_ray.models.weights import NumpyWeights

KEY = "model._target_"
CHECK_ROWS = 4  # observations in the start-of-run forward pass


def model_config(cfg) -> ModelConfig:
    """The ``model`` section as the dataclass the user's constructor receives (samplers and
    the evaluator hold a dataclass already, learners a config node)."""
    if isinstance(cfg, ModelConfig):
        return cfg
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg))


def load_target(target: str) -> Callable:
    """The class or function ``model._target_`` names ('package.module:Name' or Hydra's
    'package.module.Name'); its module is imported here."""
    from walle_ray.envs.user import resolve_target

    return resolve_target(target, KEY)


def build_user_net(obs_space: gym.Space, action_space: gym.Space, cfg) -> nn.Module:
    """``target(obs_space, action_space, model_cfg, **model.kwargs)``, which must be an
    ``nn.Module``."""
    cfg = model_config(cfg)
    target = load_target(cfg._target_)
    kwargs = dict(cfg.kwargs or {})
    try:
        net = target(obs_space, action_space, cfg, **kwargs)
    except Exception as exc:  # whatever the user's constructor raised
        raise ConfigError(f"{KEY}: {cfg._target_}(obs_space, action_space, cfg, **{kwargs}) "
                          f"raised {_first_line(exc)}") from None
    if not isinstance(net, nn.Module):
        raise ConfigError(f"{KEY}: {cfg._target_} returned a {type(net).__name__}, not a "
                          "torch nn.Module")
    return net


class UserNetwork(NumpyWeights, nn.Module):
    """What the three wrappers share: the user's module as ``net`` and its name. Each wrapper's
    ``check(obs, action_space, algo_cfg)`` raises ConfigError unless the user's module meets
    its contract on ``obs``."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, cfg):
        super().__init__()
        cfg = model_config(cfg)
        self.target = cfg._target_
        self.net = build_user_net(obs_space, action_space, cfg)


class UserActorCritic(UserNetwork):
    """A user's ``ActorCriticNet`` as the policy-gradient methods use an ``ActorCritic``:
    the action head, ``forward``/``policy``/``value``, and the running observation
    normaliser (``env.normalize_obs``) in front of the user's module.

    The user's module computes policy and value in one pass, so a sampler keeps each step's
    value (``separate_critic`` is false)."""

    separate_critic = False

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, cfg,
                 normalize_obs: bool = False):
        super().__init__(obs_space, action_space, cfg)
        self.head = make_action_head(action_space)
        self.mask = action_mask(obs_space, action_space)  # applied to the params it returns
        image = len(obs_space.shape) == 3  # frames are not normalised, as in ActorCritic
        self.obs_norm = RunningNorm(tuple(obs_space.shape)) if normalize_obs and not image else None

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [N, *obs_shape] -> (distribution params [N, P], value [N]), float32; the
        logits of actions the env forbids masked (``models/masking.py``)."""
        x = obs if self.obs_norm is None else self.obs_norm(obs.float())
        params, value = self.net(x)
        return masked(self.mask, params.float(), obs), value.reshape(-1).float()

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)[0]

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs)[1]

    def check(self, obs, action_space, algo_cfg) -> None:
        n, p = obs.shape[0], self.head.param_dim
        x = obs if self.obs_norm is None else self.obs_norm(obs.float())
        out = _run(self, "forward", self.net, x)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise ConfigError(f"{KEY}: {self.target} forward returned {_describe(out)}; it must "
                              "return (distribution params [N, P], value [N])")
        params, value = out
        meaning = _param_meaning(self.head, action_space)
        _require_tensor(self.target, "params", params, (n, p),
                        f"algo={algo_cfg.name} on this env needs {(n, p)} ({meaning})")
        value = _require_tensor(self.target, "value", value, (n,), f"it must be {(n,)} or {(n, 1)}",
                                also=(n, 1))
        _require_grad(self.target, "params", params)
        _require_grad(self.target, "value", value)
        self.head.act(params.detach().float())  # the head can act on them


class UserQNetwork(UserNetwork):
    """A user's ``QNet`` as DQN and Ape-X use a ``QNetwork``: Q-values for every action."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, cfg):
        super().__init__(obs_space, action_space, cfg)
        self.mask = action_mask(obs_space, action_space)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [N, *obs_shape] -> Q [N, num_actions], float32, forbidden actions' masked."""
        return masked(self.mask, self.net(obs).float(), obs)

    def check(self, obs, action_space, algo_cfg) -> None:
        n, a = obs.shape[0], int(action_space.n)
        q = _run(self, "forward", self.net, obs)
        _require_tensor(self.target, "Q-values", q, (n, a), f"algo={algo_cfg.name} on this env "
                        f"needs {(n, a)} (one per action of {action_space})")
        _require_grad(self.target, "Q-values", q)


class UserDeterministic(BoundedActions, UserNetwork):
    """A user's ``DeterministicNet`` as DDPG and TD3 use a ``DeterministicActorCritic``:
    ``act``, ``q``/``q_both``/``q_min``, the actor and critic parameter groups, and the
    action bounds as buffers (TD3's target smoothing reads them)."""

    def __init__(self, obs_space: gym.Space, action_space: gym.spaces.Box, cfg):
        super().__init__(obs_space, action_space, cfg)
        self.register_bounds(action_space)

    @property
    def actor(self) -> nn.Module:
        """The parameters the actor loss trains."""
        return self.net.actor

    @property
    def critics(self) -> nn.Module:
        """The parameters the critic loss trains (every critic's)."""
        return self.net.critic

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [N, obs_dim] -> deterministic action [N, act_dim]."""
        return self.net.act(obs.float()).float()

    def q_both(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every critic's Q(s, a) [N]: one for DDPG, two for TD3's twin critics."""
        q = self.net.q(obs.float(), action.float()).float()
        return tuple(q.unbind(-1)) if q.dim() == 2 else (q,)

    def q(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The first critic's Q(s, a) [N]: the one the actor climbs."""
        return self.q_both(obs, action)[0]

    def q_min(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The smallest critic's Q(s, a) [N]."""
        return torch.stack(self.q_both(obs, action)).min(dim=0).values

    def check(self, obs, action_space, algo_cfg) -> None:
        for name in ("actor", "critic"):
            if not isinstance(getattr(self.net, name, None), nn.Module):
                raise ConfigError(f"{KEY}: {self.target} has no nn.Module attribute {name!r}; "
                                  "DDPG and TD3 train the actor's and the critic's parameters "
                                  "with separate optimizers")
        for name in ("act", "q"):
            if not callable(getattr(self.net, name, None)):
                raise ConfigError(f"{KEY}: {self.target} has no method {name!r}")
        _check_groups(self.target, self.net)
        n, d = obs.shape[0], int(action_space.shape[0])
        action = _run(self, "act", self.net.act, obs.float())
        _require_tensor(self.target, "actions", action, (n, d),
                        f"algo={algo_cfg.name} on this env needs {(n, d)} (for {action_space})")
        low, high = self.action_low, self.action_high
        if not bool(((action >= low - 1e-5) & (action <= high + 1e-5)).all()):
            raise ConfigError(f"{KEY}: {self.target} act returned actions outside the bounds "
                              f"[{action_space.low}, {action_space.high}]; scale a tanh to them")
        _require_grad(self.target, "actions", action)
        q = _run(self, "q", self.net.q, obs.float(), action.detach().float())
        if algo_cfg.twin_critics:
            need = f"algo={algo_cfg.name} needs {(n, 2)}: one column per critic of its twin critics"
        else:
            need = f"algo={algo_cfg.name} needs {(n, 1)} or {(n,)}: one critic"
        _require_tensor(self.target, "Q-values", q, (n, 2 if algo_cfg.twin_critics else 1), need,
                        also=None if algo_cfg.twin_critics else (n,))
        _require_grad(self.target, "Q-values", q)


def check_user_model(algo, obs_space: gym.Space, action_space: gym.Space, cfg) -> None:
    """When ``model._target_`` is set: build the model as every role will, run it on
    CHECK_ROWS sampled observations, and raise a one-line ConfigError naming the missing
    method or the wrong output. Called in the driver before any role starts."""
    if not cfg.model._target_:
        return
    model = algo.make_model(obs_space, action_space, cfg)
    target = cfg.model._target_
    if not isinstance(model, UserNetwork):
        raise ConfigError(f"{KEY}: algo={cfg.algo.name} builds its own network and takes none "
                          "of yours; remove model._target_")
    if not any(p.requires_grad for p in model.net.parameters()):
        raise ConfigError(f"{KEY}: {target} has no parameters to train")
    obs = np.stack([obs_space.sample() for _ in range(CHECK_ROWS)])
    if np.issubdtype(obs.dtype, np.floating):
        obs = obs.astype(np.float32)  # what samplers and evaluation send (GymVectorEnv)
    obs = torch.as_tensor(obs)
    model.check(obs, action_space, cfg.algo)
    try:
        copy.deepcopy(model)  # replay algorithms copy it into their target networks
    except Exception as exc:
        raise ConfigError(f"{KEY}: {target} cannot be copied with copy.deepcopy "
                          f"({_first_line(exc)}); DQN and DDPG keep a copy as target "
                          "network") from None
    try:  # each role builds its own copy and loads the learner's weights into it
        algo.make_model(obs_space, action_space, cfg).set_weights(model.get_weights())
    except RuntimeError as exc:
        raise ConfigError(f"{KEY}: {target} builds different weights each time "
                          f"({_first_line(exc)}); every role builds its own copy from the config "
                          "and loads the learner's weights into it") from None


def _check_groups(target: str, net: nn.Module) -> None:
    """Every parameter is the actor's or the critic's, not both: each optimizer steps one."""
    actor = {id(p) for p in net.actor.parameters()}
    critic = {id(p) for p in net.critic.parameters()}
    if actor & critic:
        raise ConfigError(f"{KEY}: {target} shares parameters between actor and critic; DDPG "
                          "and TD3 train them with separate optimizers")
    orphans = [name for name, p in net.named_parameters() if id(p) not in actor | critic]
    if orphans:
        raise ConfigError(f"{KEY}: {target} has parameters in neither actor nor critic "
                          f"({', '.join(orphans[:3])}); they would never train")


def _run(model: UserNetwork, what: str, fn: Callable, *args):
    """``fn(*args)``, with anything it raises as a one-line ConfigError."""
    try:
        return fn(*args)
    except Exception as exc:  # whatever the user's code raised
        shapes = ", ".join(f"{tuple(a.shape)} {str(a.dtype).removeprefix('torch.')}" for a in args)
        raise ConfigError(f"{KEY}: {model.target} {what} raised {_first_line(exc)} (on inputs "
                          f"of shape {shapes})") from None


def _require_tensor(target: str, what: str, x, shape: tuple, need: str, also: tuple | None = None):
    """``x`` as a finite tensor of ``shape`` (or ``also``), else ConfigError."""
    if not isinstance(x, torch.Tensor):
        raise ConfigError(f"{KEY}: {target} returned {what} as {_describe(x)}; {need}")
    if tuple(x.shape) not in (shape, also):
        raise ConfigError(f"{KEY}: {target} returned {what} of shape {tuple(x.shape)}; {need}")
    if not x.is_floating_point() or not bool(torch.isfinite(x).all()):
        raise ConfigError(f"{KEY}: {target} returned {what} that are not finite floats "
                          f"({x.dtype})")
    return x


def _require_grad(target: str, what: str, x: torch.Tensor) -> None:
    if not x.requires_grad:
        raise ConfigError(f"{KEY}: {target} returned {what} that no parameter affects (they do "
                          "not require grad), so training could not change them")


def _param_meaning(head, action_space: gym.Space) -> str:
    meaning = {"CategoricalHead": "logits", "GaussianHead": "means, then log-stds",
               "MultiCategoricalHead": "each component's logits, concatenated",
               "BernoulliHead": "one logit per bit"}
    return f"{meaning.get(type(head).__name__, 'action-head parameters')} for {action_space}"


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}"
    return f"a {type(x).__name__}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


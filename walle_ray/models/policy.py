"""Actor-critic networks: MLPs for vector observations, conv nets for Atari frames."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from walle_ray.config import ModelConfig
from walle_ray.models.heads import ActionHead, GaussianHead, make_action_head
from walle_ray.models.normalizer import RunningNorm
from walle_ray.models.precision import bf16_setting, use_bf16
from walle_ray.models.weights import NumpyWeights

_ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu}


def _init(layer: nn.Module, gain: float, ortho: bool) -> nn.Module:
    if ortho and isinstance(layer, (nn.Linear, nn.Conv2d)):
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return layer


class MLP(nn.Module):
    """Linear layers with an activation between them.

    The forward pass calls ``F.linear`` directly: for the small batches a sampler acts on,
    nn.Module call overhead per layer costs more than the arithmetic.
    """

    def __init__(self, sizes: list[int], activation: str, ortho: bool, out_gain: float):
        super().__init__()
        self.layers = nn.ModuleList(
            _init(nn.Linear(sizes[i], sizes[i + 1]), out_gain if i == len(sizes) - 2 else math.sqrt(2), ortho)
            for i in range(len(sizes) - 1))
        self.activation = _ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = F.linear(x, layer.weight, layer.bias)
            if i < last:
                x = self.activation(x)
        return x


class ConvTorso(nn.Module):
    """Atari conv stack: Nature DQN's for 84x84 frames; for 42x42 (EasyRL's size) the small
    four-layer stack of 3x3 stride-2 convolutions common for 42x42 A3C agents, about a third
    of the compute, since on CPU learners the network bounds throughput.

    Convolutions run channels-last (NHWC), which oneDNN computes faster on CPU than NCHW
    (``benchmarks/learner_throughput.py``). Under bfloat16 (``bf16``: auto, true or false,
    see ``models/precision.py``) they run under autocast: weights stay float32 and so does
    the output. ``auto`` decides per device type, once, whether it computes bfloat16 natively.
    """

    def __init__(self, in_channels: int, size: int, ortho: bool, bf16: str | bool = "auto"):
        super().__init__()
        self.bf16 = bf16_setting(bf16)
        self.bf16_on: dict[str, bool] = {}  # the decision per device type, made at first use
        if size == 84:
            convs, hidden = [(in_channels, 32, 8, 4, 0), (32, 64, 4, 2, 0), (64, 64, 3, 1, 0)], 512
        else:
            convs, hidden = [(in_channels, 32, 3, 2, 1)] + [(32, 32, 3, 2, 1)] * 3, 256
        layers: list[nn.Module] = []
        for c_in, c_out, k, stride, pad in convs:
            layers += [_init(nn.Conv2d(c_in, c_out, k, stride, pad), math.sqrt(2), ortho), nn.ReLU()]
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, in_channels, size, size)).shape[-1]
        self.fc = nn.Sequential(_init(nn.Linear(flat, hidden), math.sqrt(2), ortho), nn.ReLU())
        self.convs.to(memory_format=torch.channels_last)
        self.out_dim = hidden

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = (frames.float() / 255.0).contiguous(memory_format=torch.channels_last)
        kind = x.device.type
        if kind not in self.bf16_on:
            self.bf16_on[kind] = use_bf16(self.bf16, kind)
        with torch.autocast(kind, dtype=torch.bfloat16, enabled=self.bf16_on[kind]):
            return self.fc(self.convs(x)).float()


class ActorCritic(NumpyWeights, nn.Module):
    """Policy distribution parameters and a state value from one observation batch.

    Vector observations use separate actor and critic MLPs (better for continuous control);
    image observations share a conv torso. A Gaussian policy has a state-independent log-std.
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, cfg: ModelConfig,
                 normalize_obs: bool = False):
        super().__init__()
        self.head: ActionHead = make_action_head(action_space)
        self.obs_shape = tuple(obs_space.shape)
        self.image = len(self.obs_shape) == 3
        out = self.head.param_dim
        gaussian = isinstance(self.head, GaussianHead)
        if gaussian:
            out = self.head.dim
            self.log_std = nn.Parameter(torch.full((self.head.dim,), float(cfg.log_std_init)))
        self.obs_norm = RunningNorm(self.obs_shape) if normalize_obs and not self.image else None
        if self.image:
            self.torso = ConvTorso(self.obs_shape[0], self.obs_shape[-1], cfg.ortho_init, cfg.bf16)
            self.pi = _init(nn.Linear(self.torso.out_dim, out), 0.01, cfg.ortho_init)
            self.v = _init(nn.Linear(self.torso.out_dim, 1), 1.0, cfg.ortho_init)
        else:
            in_dim = int(np.prod(self.obs_shape))
            sizes = [in_dim, *cfg.hidden]
            self.pi = MLP([*sizes, out], cfg.activation, cfg.ortho_init, 0.01)
            self.v = MLP([*sizes, 1], cfg.activation, cfg.ortho_init, 1.0)
        self.gaussian = gaussian
        # Whether the value can be computed apart from the policy at no extra cost: true for
        # the separate MLPs, false for a shared conv torso (it would run twice).
        self.separate_critic = not self.image

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [N, *obs_shape] -> (distribution params [N, D], value [N])."""
        h = self._features(obs)
        return self._params(self.pi(h)), self.v(h).squeeze(-1)

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """Distribution params alone: for vector observations the critic MLP is not run,
        which a sampler uses to act step by step and compute the values of a whole fragment
        in one batch afterwards (``separate_critic``)."""
        return self._params(self.pi(self._features(obs)))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values [N] alone."""
        return self.v(self._features(obs)).squeeze(-1)

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        """What the heads read: the conv torso's output for frames; for vectors, the
        flattened (and normalised, when on) observation."""
        if self.image:
            return self.torso(obs)
        x = obs.reshape(obs.shape[0], -1).float()
        return x if self.obs_norm is None else self.obs_norm(x)

    def _params(self, out: torch.Tensor) -> torch.Tensor:
        if self.gaussian:
            return torch.cat([out, self.log_std.expand_as(out)], dim=-1)
        return out


def make_actor_critic(obs_space: gym.Space, action_space: gym.Space, cfg: ModelConfig,
                      normalize_obs: bool = False) -> nn.Module:
    """``ActorCritic``, or with ``model._target_`` the user's network behind
    ``UserActorCritic`` (``models/user.py``; its contract: ``contracts.ActorCriticNet``)."""
    if cfg._target_:
        from walle_ray.models.user import UserActorCritic

        return UserActorCritic(obs_space, action_space, cfg, normalize_obs)
    return ActorCritic(obs_space, action_space, cfg, normalize_obs)

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
from walle_ray.models.masking import action_mask, masked
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

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """The last hidden layer's activations (the input where there is none)."""
        for i in range(len(self.layers) - 1):
            layer = self.layers[i]
            x = self.activation(F.linear(x, layer.weight, layer.bias))
        return x

    def hidden_and_out(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the last hidden layer's activations, the output) in one pass."""
        h = self.hidden(x)
        last = self.layers[-1]
        return h, F.linear(h, last.weight, last.bias)


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


class Core(nn.Module):
    """A recurrent core (``model.core``): an LSTM or GRU cell over the torso's features.

    Its state is one ``[B, state_size]`` tensor per batch of envs (an LSTM's h, then its c),
    so samplers, rollouts and replay carry it as a plain array. ``unroll`` runs the cell over
    a fragment and zeroes the state where an episode starts (``first_t``), as the sampler
    did when it acted."""

    def __init__(self, kind: str, in_dim: int, size: int):
        super().__init__()
        self.lstm = kind == "lstm"
        self.size = size
        self.cell = nn.LSTMCell(in_dim, size) if self.lstm else nn.GRUCell(in_dim, size)
        self.state_size = 2 * size if self.lstm else size

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: features [B, F], state [B, S] -> (output [B, size], next state [B, S])."""
        if self.lstm:
            h, c = self.cell(x, (state[:, :self.size], state[:, self.size:]))
            return h, torch.cat([h, c], dim=-1)
        h = self.cell(x, state)
        return h, h

    def unroll(self, x_t: torch.Tensor, state: torch.Tensor,
               first_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Features [T, B, F] from ``state`` [B, S], zeroing it before step t where
        ``first_t`` [T, B] -> (outputs [T, B, size], the state after each step [T, B, S])."""
        keep_t = (~first_t).unsqueeze(-1).to(state.dtype)
        outputs, states = [], []
        for t in range(x_t.shape[0]):
            out, state = self(x_t[t], state * keep_t[t])
            outputs.append(out)
            states.append(state)
        return torch.stack(outputs), torch.stack(states)


class ActorCritic(NumpyWeights, nn.Module):
    """Policy distribution parameters and a state value from one observation batch.

    Vector observations use separate actor and critic MLPs (better for continuous control);
    image observations share a conv torso. A Gaussian policy has a state-independent log-std.

    With ``model.core`` (lstm or gru) the torso (the conv stack, or an MLP of ``hidden``
    widths) feeds a recurrent ``Core`` that both heads read, as in IMPALA's agent: ``step``
    acts one step from a state, ``unroll`` runs a fragment, and ``forward`` is refused
    (without the state a recurrent policy is a different policy).
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, cfg: ModelConfig,
                 normalize_obs: bool = False):
        super().__init__()
        self.head: ActionHead = make_action_head(action_space)
        self.mask = action_mask(obs_space, action_space)  # env.action_mask (models/masking.py)
        self.obs_shape = tuple(obs_space.shape)
        self.image = len(self.obs_shape) == 3
        out = self.head.param_dim
        gaussian = isinstance(self.head, GaussianHead)
        if gaussian:
            out = self.head.dim
            self.log_std = nn.Parameter(torch.full((self.head.dim,), float(cfg.log_std_init)))
        self.obs_norm = RunningNorm(self.obs_shape) if normalize_obs and not self.image else None
        self.core: Core | None = None
        self.state_size = 0
        if self.image:
            self.torso = ConvTorso(self.obs_shape[0], self.obs_shape[-1], cfg.ortho_init, cfg.bf16)
        elif getattr(cfg, "core", None):
            in_dim = int(np.prod(self.obs_shape))
            self.torso_mlp = MLP([in_dim, *cfg.hidden], cfg.activation, cfg.ortho_init, math.sqrt(2))
        if getattr(cfg, "core", None):
            features = self.torso.out_dim if self.image else cfg.hidden[-1]
            self.core = Core(cfg.core, features, cfg.core_size)
            self.state_size = self.core.state_size
            self.pi = _init(nn.Linear(cfg.core_size, out), 0.01, cfg.ortho_init)
            self.v = _init(nn.Linear(cfg.core_size, 1), 1.0, cfg.ortho_init)
        elif self.image:
            self.pi = _init(nn.Linear(self.torso.out_dim, out), 0.01, cfg.ortho_init)
            self.v = _init(nn.Linear(self.torso.out_dim, 1), 1.0, cfg.ortho_init)
        else:
            in_dim = int(np.prod(self.obs_shape))
            sizes = [in_dim, *cfg.hidden]
            self.pi = MLP([*sizes, out], cfg.activation, cfg.ortho_init, 0.01)
            self.v = MLP([*sizes, 1], cfg.activation, cfg.ortho_init, 1.0)
        self.gaussian = gaussian
        # Whether the value can be computed apart from the policy at no extra cost: true for
        # the separate MLPs, false for a shared conv torso or core (it would run twice).
        self.separate_critic = not self.image and self.core is None

    @property
    def recurrent(self) -> bool:
        return self.core is not None

    def forward(self, obs: torch.Tensor, encode: bool = False) -> tuple[torch.Tensor, ...]:
        """obs [N, *obs_shape] -> (distribution params [N, D], value [N]), and with
        ``encode`` the state's encoding (``encode``) from the same pass."""
        if self.core is not None:
            raise TypeError("a recurrent ActorCritic acts with step(obs, state) and learns "
                            "with unroll(obs_t, state, first_t)")
        h = self._features(obs)
        if self.image:
            out = (self._params(self.pi(h), obs), self.v(h).squeeze(-1))
            return (*out, h) if encode else out
        encoded, pi = self.pi.hidden_and_out(h)
        out = (self._params(pi, obs), self.v(h).squeeze(-1))
        return (*out, encoded) if encode else out

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [N, *obs_shape] -> the policy's encoding of each state [N, F], what elite and
        attentive replay compare (``walle_ray/buffers/ranked.py``): the conv torso's output
        for frames, the torso before the core for a recurrent model (it needs no state), and
        the actor MLP's last hidden layer for vectors."""
        if self.core is not None:
            return self._torso(obs)
        h = self._features(obs)
        return h if self.image else self.pi.hidden(h)

    def initial_state(self, batch: int, device=None) -> torch.Tensor:
        """The state at an episode's start: zeros [batch, state_size] (width 0 without a core)."""
        return torch.zeros(batch, self.state_size, device=device)

    def step(self, obs: torch.Tensor, state: torch.Tensor,
             encode: bool = False) -> tuple[torch.Tensor, ...]:
        """One step of a recurrent policy: obs [B, *obs_shape], state [B, S] -> (params
        [B, D], value [B], next state [B, S]), and with ``encode`` the states' encoding."""
        x = self._torso(obs)
        out, state = self.core(x, state)
        step = (self._params(self.pi(out), obs), self.v(out).squeeze(-1), state)
        return (*step, x) if encode else step

    def unroll(self, obs_t: torch.Tensor, state: torch.Tensor,
               first_t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A fragment: obs_t [T, B, *obs_shape] from ``state`` [B, S], the state zeroed
        before step t where ``first_t`` [T, B] -> (params [T, B, D], values [T, B], the
        state after each step [T, B, S]). The torso runs once over all T x B observations."""
        T, B = obs_t.shape[:2]
        x_t = self._torso(obs_t.reshape(T * B, *obs_t.shape[2:])).view(T, B, -1)
        out_t, states_t = self.core.unroll(x_t, state, first_t)
        return self._params(self.pi(out_t), obs_t), self.v(out_t).squeeze(-1), states_t

    def _torso(self, obs: torch.Tensor) -> torch.Tensor:
        """A recurrent model's features before its core."""
        x = self._features(obs)
        return x if self.image else self.torso_mlp.activation(self.torso_mlp(x))

    def policy(self, obs: torch.Tensor, encode: bool = False):
        """Distribution params alone: for vector observations the critic MLP is not run,
        which a sampler uses to act step by step and compute the values of a whole fragment
        in one batch afterwards (``separate_critic``). With ``encode``, (params, encoding)."""
        h = self._features(obs)
        if not encode:
            return self._params(self.pi(h), obs)
        if self.image:
            return self._params(self.pi(h), obs), h
        encoded, pi = self.pi.hidden_and_out(h)
        return self._params(pi, obs), encoded

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

    def _params(self, out: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """The head's parameters from the policy layer's output ``out`` [..., D] for ``obs``
        [..., *obs_shape]: a Gaussian's log-stds joined on, forbidden actions' logits masked."""
        if self.gaussian:
            return torch.cat([out, self.log_std.expand_as(out)], dim=-1)
        return masked(self.mask, out, obs)

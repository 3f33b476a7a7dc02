"""ES's policy: a deterministic MLP whose parameters travel as one flat vector."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from walle_ray.models.masking import action_mask, masked
from walle_ray.models.normalizer import RunningNorm
from walle_ray.models.weights import NumpyWeights

_ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu}


class ESPolicy(NumpyWeights, nn.Module):
    """obs -> action: an MLP of ``hidden`` widths; the argmax of its logits for Discrete
    actions, its tanh scaled to the bounds for a 1-D Box. Observations pass through a
    running normaliser when ``normalize_obs`` (statistics merged from every sampler's
    episodes by the learner, and sent with the weights).

    ``act_batched(obs, params)`` acts for B envs each with its own parameter vector [B, P]:
    one batched matrix product per layer, so a sampler evaluates B perturbations per step.
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, hidden: list[int],
                 activation: str = "tanh", normalize_obs: bool = False):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"ES policies use tanh or relu, not {activation!r}")
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.mask = action_mask(obs_space, action_space)  # env.action_mask (models/masking.py)
        in_dim = int(np.prod(obs_space.shape))
        out = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        sizes = [in_dim, *hidden, out]
        self.layers = nn.ModuleList(nn.Linear(sizes[i], sizes[i + 1]) for i in range(len(sizes) - 1))
        self.activation = _ACTIVATIONS[activation]
        self.obs_norm = RunningNorm(tuple(obs_space.shape)) if normalize_obs else None
        if not self.discrete:
            low = torch.as_tensor(action_space.low, dtype=torch.float32)
            high = torch.as_tensor(action_space.high, dtype=torch.float32)
            self.register_buffer("scale", (high - low) / 2, persistent=False)
            self.register_buffer("center", (high + low) / 2, persistent=False)
        self.shapes = [(layer.out_features, layer.in_features) for layer in self.layers]

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flat_params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.parameters()])

    def _inputs(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.reshape(obs.shape[0], -1).float()
        return x if self.obs_norm is None else self.obs_norm(x)

    def _action(self, out: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return masked(self.mask, out, obs).argmax(-1)
        return self.center + self.scale * torch.tanh(out)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions [N] (Discrete) or [N, d] (Box) of the unperturbed policy."""
        x = self._inputs(obs)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < last:
                x = self.activation(x)
        return self._action(x, obs)

    def act_batched(self, obs: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """Actions for B envs, env b acting with the flat parameters ``params[b]`` (in the
        order of ``parameters()``: each layer's weight, then its bias)."""
        x = self._inputs(obs).unsqueeze(-1)  # [B, in, 1]
        at, last = 0, len(self.shapes) - 1
        for i, (out, inp) in enumerate(self.shapes):
            w = params[:, at: at + out * inp].view(-1, out, inp)
            at += out * inp
            b = params[:, at: at + out].unsqueeze(-1)
            at += out
            x = torch.baddbmm(b, w, x)
            if i < last:
                x = self.activation(x)
        return self._action(x.squeeze(-1), obs)


def make_model(obs_space: gym.Space, action_space: gym.Space, cfg) -> ESPolicy:
    return ESPolicy(obs_space, action_space, list(cfg.model.hidden), cfg.model.activation,
                    bool(cfg.env.normalize_obs))

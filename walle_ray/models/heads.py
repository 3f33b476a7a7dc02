"""Action heads: how distribution parameters become actions, log-probs, entropies and KLs."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import gymnasium as gym
import torch
from torch.distributions import Bernoulli, Categorical, Independent, Normal, kl_divergence
from torch.nn import functional as F

# Arguments are produced by our own networks; validating them on every call costs more than
# the sampler's whole forward pass.
torch.distributions.Distribution.set_default_validate_args(False)


class ActionHead(ABC):
    """Maps flat distribution parameters [..., D] to a torch distribution."""

    param_dim: int

    @abstractmethod
    def dist(self, params: torch.Tensor) -> torch.distributions.Distribution:
        """The distribution these parameters describe."""

    @abstractmethod
    def mode(self, params: torch.Tensor) -> torch.Tensor:
        """The most likely action (greedy evaluation)."""

    @abstractmethod
    def act(self, params: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(action, its log-probability), without building a distribution object: the
        sampler's per-step path. Same values as ``dist(params)``'s sample and log_prob."""

    def kl(self, p_params: torch.Tensor, q_params: torch.Tensor) -> torch.Tensor:
        """KL(p || q) per row."""
        return kl_divergence(self.dist(p_params), self.dist(q_params))

    @torch.no_grad()
    def implied_kl(self, target_params: torch.Tensor, behaviour_params: torch.Tensor,
                   rho_bar: float, samples: int = 32) -> torch.Tensor:
        """KL(pi || pi_rho) per row, pi_rho(a) ∝ min(rho_bar * mu(a), pi(a)): how far the
        target policy pi is from the policy that V-trace with behaviour mu evaluates (LASER's
        divergence). This estimate draws ``samples`` actions from pi:
        E_pi[log pi - log min(rho_bar mu, pi)] + log E_pi[min(rho_bar mu / pi, 1)]."""
        pi, mu = self.dist(target_params), self.dist(behaviour_params)
        action = pi.sample((samples,))
        logp_pi, logp_mu = pi.log_prob(action), mu.log_prob(action)
        log_min = torch.minimum(logp_mu + math.log(rho_bar), logp_pi)
        log_z = torch.logsumexp(log_min - logp_pi, 0) - math.log(samples)
        return (logp_pi - log_min).mean(0) + log_z


def gumbel_max(logp: torch.Tensor) -> torch.Tensor:
    """A sample of the softmax over the last axis: argmax(logits + Gumbel noise). The uniform
    draw is kept above 0, which ``rand_like`` can return: there the noise would be -inf and a
    state allowing one action could pick a masked one (``models/masking.py``)."""
    u = torch.rand_like(logp).clamp_(min=torch.finfo(logp.dtype).tiny)
    return (logp - torch.log(-torch.log(u))).argmax(-1)


class CategoricalHead(ActionHead):
    """Discrete actions; params are logits."""

    def __init__(self, n: int):
        self.param_dim = n

    def dist(self, params):
        return Categorical(logits=params)

    def mode(self, params):
        return params.argmax(-1)

    @torch.no_grad()
    def implied_kl(self, target_params, behaviour_params, rho_bar, samples=32):
        """Exact over the actions (see ``ActionHead.implied_kl``)."""
        logp_pi = torch.log_softmax(target_params, -1)
        log_min = torch.minimum(torch.log_softmax(behaviour_params, -1) + math.log(rho_bar), logp_pi)
        log_implied = log_min - torch.logsumexp(log_min, -1, keepdim=True)
        return (logp_pi.exp() * (logp_pi - log_implied)).sum(-1)

    def act(self, params, deterministic=False):
        logp = torch.log_softmax(params, -1)
        if deterministic:
            action = logp.argmax(-1)
        else:
            action = gumbel_max(logp)
        return action, logp.gather(-1, action[..., None])[..., 0]


class GaussianHead(ActionHead):
    """Continuous actions; params are mean and log-std concatenated on the last axis."""

    def __init__(self, dim: int):
        self.dim = dim
        self.param_dim = 2 * dim

    def dist(self, params):
        mean, log_std = params.split(self.dim, dim=-1)
        return Independent(Normal(mean, log_std.exp()), 1)

    def mode(self, params):
        return params[..., : self.dim]

    def act(self, params, deterministic=False):
        mean, log_std = params.split(self.dim, dim=-1)
        noise = torch.zeros_like(mean) if deterministic else torch.randn_like(mean)
        action = mean + log_std.exp() * noise
        logp = (-0.5 * noise ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return action, logp


class MultiCategoricalHead(ActionHead):
    """MultiDiscrete actions: k independent categoricals, one per component. Params are the
    k components' logits concatenated (``sum(nvec)`` of them); actions are [..., k] int64.

    Components of unequal size are padded to the largest with logits so negative that their
    probability is exactly 0, so every method works on one [..., k, max(nvec)] tensor."""

    def __init__(self, nvec):
        self.nvec = [int(n) for n in nvec]
        self.param_dim = sum(self.nvec)
        width, offsets = max(self.nvec), [0]
        for n in self.nvec[:-1]:
            offsets.append(offsets[-1] + n)
        column = torch.arange(width)
        # index[i, j]: the param column of component i's action j (0 where padded)
        self._pad = column[None, :] >= torch.tensor(self.nvec)[:, None]
        self._index = torch.where(self._pad, 0, torch.tensor(offsets)[:, None] + column[None, :])
        self._padded = bool(self._pad.any())

    def _logits(self, params: torch.Tensor) -> torch.Tensor:
        """params [..., sum(nvec)] -> logits [..., k, max(nvec)]."""
        logits = params[..., self._index.to(params.device)]
        if self._padded:  # finite, not -inf: 0 * logit stays 0 in entropies and KLs
            logits = logits.masked_fill(self._pad.to(params.device), -1e9)
        return logits

    def dist(self, params):
        return Independent(Categorical(logits=self._logits(params)), 1)

    def mode(self, params):
        return self._logits(params).argmax(-1)

    def act(self, params, deterministic=False):
        logp = torch.log_softmax(self._logits(params), -1)
        if deterministic:
            action = logp.argmax(-1)
        else:  # per component
            action = gumbel_max(logp)
        return action, logp.gather(-1, action[..., None])[..., 0].sum(-1)

    def kl(self, p_params, q_params):
        """Exact: the components' categorical KLs summed."""
        logp = torch.log_softmax(self._logits(p_params), -1)
        logq = torch.log_softmax(self._logits(q_params), -1)
        return (logp.exp() * (logp - logq)).sum((-2, -1))


class BernoulliHead(ActionHead):
    """MultiBinary actions: one independent bit per component; params are one logit per bit,
    actions are [..., n] float32 0/1 (the env gets them in its space's dtype)."""

    def __init__(self, n: int):
        self.param_dim = n

    def dist(self, params):
        return Independent(Bernoulli(logits=params), 1)

    def mode(self, params):
        return (params > 0).to(params.dtype)

    def act(self, params, deterministic=False):
        if deterministic:
            action = self.mode(params)
        else:
            action = (torch.rand_like(params) < torch.sigmoid(params)).to(params.dtype)
        # Bernoulli.log_prob's own formula, so the values match it exactly
        logp = -F.binary_cross_entropy_with_logits(params, action, reduction="none").sum(-1)
        return action, logp

    def kl(self, p_params, q_params):
        """Exact: the bits' KLs summed, from log-sigmoids (no 0 * log 0)."""
        p = torch.sigmoid(p_params)
        on = F.logsigmoid(p_params) - F.logsigmoid(q_params)
        off = F.logsigmoid(-p_params) - F.logsigmoid(-q_params)
        return (p * on + (1 - p) * off).sum(-1)


# What ``make_action_head`` accepts, for error messages (check_policy_spaces).
SUPPORTED_ACTION_SPACES = "Discrete, a 1-D Box, a 1-D MultiDiscrete or a 1-D MultiBinary"


def make_action_head(space: gym.Space) -> ActionHead:
    """The head for an action space; TypeError for one it cannot act in."""
    one_d = len(getattr(space, "shape", None) or ()) == 1
    if isinstance(space, gym.spaces.Discrete):
        return CategoricalHead(int(space.n))
    if isinstance(space, gym.spaces.Box) and one_d:
        return GaussianHead(int(space.shape[0]))
    if isinstance(space, gym.spaces.MultiDiscrete) and one_d:
        return MultiCategoricalHead(space.nvec.tolist())
    if isinstance(space, gym.spaces.MultiBinary) and one_d:
        return BernoulliHead(int(space.shape[0]))
    raise TypeError(f"action space {space} is not supported: use {SUPPORTED_ACTION_SPACES}")

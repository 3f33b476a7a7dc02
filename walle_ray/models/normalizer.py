"""Running mean and variance, merged from batch moments so learners can all-reduce them."""

from __future__ import annotations

import torch
from torch import nn


class RunningNorm(nn.Module):
    """Normalises inputs by running statistics kept as buffers (saved with the weights)."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.clip = clip
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = self.mean.to(x.dtype)
        std = torch.sqrt(self.var + self.eps).to(x.dtype)
        return torch.clamp((x - mean) / std, -self.clip, self.clip)

    def moments(self, x: torch.Tensor) -> torch.Tensor:
        """[count, sum..., sum of squares...] of a batch whose trailing dims are this shape."""
        x = x.reshape(-1, self.mean.numel()).to(torch.float64)
        n = torch.tensor([float(x.shape[0])], dtype=torch.float64)
        return torch.cat([n, x.sum(0).reshape(-1), (x * x).sum(0).reshape(-1)])

    @torch.no_grad()
    def update_from_moments(self, moments: torch.Tensor) -> None:
        """Merge a batch's (possibly all-reduced) moments into the running statistics."""
        d = self.mean.numel()
        n, s, ss = moments[0], moments[1:1 + d], moments[1 + d:]
        if n <= 0:  # nothing new counted (e.g. a batch of replayed rows only)
            return
        batch_mean = s / n
        batch_var = torch.clamp(ss / n - batch_mean ** 2, min=0.0)
        total = self.count + n
        delta = batch_mean - self.mean.reshape(-1)
        new_mean = self.mean.reshape(-1) + delta * n / total
        m2 = self.var.reshape(-1) * self.count + batch_var * n + delta ** 2 * self.count * n / total
        self.mean.copy_(new_mean.reshape(self.mean.shape))
        self.var.copy_((m2 / total).reshape(self.var.shape))
        self.count.copy_(total)

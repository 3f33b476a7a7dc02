"""Optimizers and learning-rate schedules shared by the algorithms."""

from __future__ import annotations

import torch


ADAM_EPS = 1e-8  # Adam's own default, for the algorithms that take no eps setting


def make_optimizer(params, name: str, lr: float, eps: float, alpha: float = 0.99) -> torch.optim.Optimizer:
    """``adam`` (PyTorch's fused kernel), ``amsgrad`` (Adam that divides by the largest
    second-moment estimate so far, not the latest: after a quiet stretch of small gradients a
    sudden large one takes a step of the usual size, not one many times it) or ``rmsprop``
    (foreach kernels): one call steps all parameters."""
    if name in ("adam", "amsgrad"):
        return torch.optim.Adam(params, lr=lr, eps=eps, amsgrad=name == "amsgrad", fused=True)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, alpha=alpha, eps=eps, foreach=True)
    raise ValueError(f"unknown optimizer {name!r}; use adam, amsgrad or rmsprop")


def scheduled_lr(base: float, schedule: str, env_steps: int, total_env_steps: int) -> float:
    """``constant``, or ``linear`` decay to 0 at the step budget."""
    if schedule == "linear":
        return base * max(0.0, 1.0 - env_steps / total_env_steps)
    return base


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr

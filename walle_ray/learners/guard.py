"""Gradient steps that refuse NaN and inf: a bad loss or gradient never reaches the weights."""

from __future__ import annotations

import math
import sys

import torch

from walle_ray.learners.collective import Collective
from walle_ray.pulse import PULSE


class NonFiniteUpdate(RuntimeError):
    """A loss or gradient was NaN or inf and ``learner.on_nonfinite=stop``."""


def clip_grad_norm(params: list, max_norm: float) -> torch.Tensor:
    """The 2-norm of all the gradients, which are scaled down to ``max_norm`` when above it:
    ``torch.nn.utils.clip_grad_norm_``'s arithmetic without its per-call wrappers, which
    cost a small MLP's minibatch step more than the clipping itself (docs/performance.md,
    "PPO's learner step")."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    if math.isfinite(max_norm):
        torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


class NonFiniteGuard:
    """Backward, average over learners, clip, and step only when the loss and the gradient
    norm are finite on every learner (so all learners skip together and stay identical).

    A bad step is skipped and counted (``skip``), or raises NonFiniteUpdate (``stop``); either
    way the message names the loss terms that went bad.
    """

    def __init__(self, mode: str = "skip"):
        self.mode = mode
        self.skipped = 0

    def step(self, optimizer: torch.optim.Optimizer, params: list, loss: torch.Tensor,
             collective: Collective, max_norm: float, terms: dict | None = None) -> float:
        """One optimizer step on ``loss``; returns the gradient norm (NaN when skipped)."""
        PULSE.beat()  # a loss to step on is progress (docs/faults.md, "Stalled roles")
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        collective.all_reduce_grads(params)
        norm = clip_grad_norm(params, max_norm if max_norm > 0 else math.inf)
        finite = bool(torch.isfinite(norm)) and bool(torch.isfinite(loss.detach()))
        if collective.all_reduce_min(torch.tensor([float(finite)])).item():
            optimizer.step()
            return float(norm)
        optimizer.zero_grad(set_to_none=False)
        self.skipped += 1
        bad = [name for name, value in (terms or {}).items() if not math.isfinite(float(value))]
        if not bool(torch.isfinite(loss.detach())):
            bad.append("loss")
        if not bool(torch.isfinite(norm)):
            bad.append("gradient norm")
        what = ", ".join(bad) or "values on another learner"
        if self.mode == "stop":
            raise NonFiniteUpdate(f"non-finite {what} in a learner update; the run stops with its "
                                  "last checkpoint (learner.on_nonfinite=skip skips such batches)")
        if self.skipped == 1 or self.skipped % 100 == 0:
            print(f"walle_ray: learner: non-finite {what}; skipped the step ({self.skipped} so far; "
                  "learner.on_nonfinite=stop stops the run instead)", file=sys.stderr, flush=True)
        return float("nan")

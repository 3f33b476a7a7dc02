"""What value-based updates (DQN, DDPG, TD3) share: target networks, joined replay batches
and the new priorities they send back.

Learners broadcast rank 0's weights after building their update rule, so an update copies
its online network into the target at its first step (``hard_update``): the target begins
from the weights every learner trains.
"""

from __future__ import annotations

import copy
from typing import Sequence

import numpy as np
import torch
from torch import nn

from walle_ray.batch import Priorities, ReplayBatch


def make_target(online: nn.Module) -> nn.Module:
    """A frozen copy of ``online``."""
    return copy.deepcopy(online).requires_grad_(False)


@torch.no_grad()
def hard_update(target: nn.Module, online: nn.Module) -> None:
    """target <- online."""
    target.load_state_dict(online.state_dict())


@torch.no_grad()
def polyak_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * online, every parameter in one foreach call."""
    torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)


def batch_tensors(batches: Sequence[ReplayBatch], names: Sequence[str], device: torch.device,
                  dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """The named fields of several replay batches joined along N, as tensors on ``device``
    (cast to ``dtype`` when given)."""
    out = []
    for name in names:
        x = torch.as_tensor(np.concatenate([np.asarray(getattr(b, name)) for b in batches]))
        out.append(x.to(device) if dtype is None else x.to(device, dtype))
    return out


class PriorityFeedback:
    """Mixin for replay updates: the new priorities of the last batch, handed out once
    (``Update.memory_feedback``)."""

    feedback: Priorities | None = None

    def set_feedback(self, batches: Sequence[ReplayBatch], td: torch.Tensor, send: bool) -> None:
        """Keep |td| as the batches' new priorities when ``send`` (prioritized replay, and a
        step the guard did not skip: a skipped step's TD errors are not finite)."""
        self.feedback = (Priorities(index=np.concatenate([b.index for b in batches]),
                                    priority=td.abs().cpu().numpy().astype(np.float32))
                         if send else None)

    def memory_feedback(self) -> Priorities | None:
        """The last update's new priorities for the shard that served its batch, once."""
        feedback, self.feedback = self.feedback, None
        return feedback

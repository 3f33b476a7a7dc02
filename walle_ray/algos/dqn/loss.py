"""The DQN loss: n-step double-Q targets and an importance-weighted Huber loss."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def q_targets(reward: torch.Tensor, discount: torch.Tensor, next_q_target: torch.Tensor,
              next_q_online: torch.Tensor | None) -> torch.Tensor:
    """reward + discount * Q_target(s', a*), with a* = argmax of the online net's Q(s', .) when
    given (double Q), else of the target net's own. discount is gamma^k, or 0 after a terminal."""
    chooser = next_q_online if next_q_online is not None else next_q_target
    best = chooser.argmax(dim=-1, keepdim=True)
    return reward + discount * next_q_target.gather(-1, best).squeeze(-1)


def dqn_loss(q: torch.Tensor, action: torch.Tensor, target: torch.Tensor, weight: torch.Tensor,
             huber_delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of weight * Huber(target - Q(s, a)); returns the loss and the TD errors."""
    q_taken = q.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
    td = target.detach() - q_taken
    per_sample = F.huber_loss(q_taken, target.detach(), reduction="none", delta=huber_delta)
    return (weight * per_sample).mean(), td.detach()

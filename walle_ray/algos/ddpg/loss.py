"""DDPG and TD3 losses as pure functions: TD targets, the weighted critic loss, the actor loss."""

from __future__ import annotations

import torch


def critic_targets(reward: torch.Tensor, discount: torch.Tensor, next_q: torch.Tensor) -> torch.Tensor:
    """reward + discount * Q'(s', mu'(s')), all [N]; discount is gamma^k, or 0 after a terminal."""
    return reward + discount * next_q


def twin_critic_targets(reward: torch.Tensor, discount: torch.Tensor, next_q1: torch.Tensor,
                        next_q2: torch.Tensor) -> torch.Tensor:
    """TD3's clipped double-Q target: bootstrap from the smaller of the two target critics."""
    return critic_targets(reward, discount, torch.minimum(next_q1, next_q2))


def smooth_target_action(action: torch.Tensor, noise: torch.Tensor, noise_clip: torch.Tensor,
                         low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """TD3's target policy smoothing: action + clip(noise, +-noise_clip), kept in [low, high].

    ``noise`` [N, act_dim] is drawn by the caller (so tests can fix it); ``noise_clip``,
    ``low`` and ``high`` broadcast over the action dimensions.
    """
    noisy = action + torch.maximum(torch.minimum(noise, noise_clip), -noise_clip)
    return torch.maximum(torch.minimum(noisy, high), low)


def critic_loss(q: torch.Tensor, target: torch.Tensor, weight: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """mean(weight * (target - Q(s, a))^2), all [N]; returns the loss and the TD errors.

    ``weight`` holds prioritized replay's importance-sampling weights (ones when uniform);
    the TD errors carry no gradient and become the sampled transitions' new priorities.
    """
    td = target.detach() - q
    return (weight * td.pow(2)).mean(), td.detach()


def actor_loss(q_of_actor: torch.Tensor) -> torch.Tensor:
    """-mean Q(s, mu(s)): the deterministic policy gradient ascends the critic."""
    return -q_of_actor.mean()

"""The offline losses: behaviour cloning and MARWIL's advantage-weighted likelihood."""

from __future__ import annotations

import torch


def bc_loss(logp: torch.Tensor, entropy: torch.Tensor, ent_coef: float) -> tuple[torch.Tensor, dict]:
    """Negative mean log-likelihood of the recorded actions, less an entropy bonus."""
    policy_loss = -logp.mean()
    ent = entropy.mean()
    return policy_loss - ent_coef * ent, {"policy_loss": policy_loss.detach(), "entropy": ent.detach()}


def marwil_weights(adv: torch.Tensor, beta: float, adv_sq: torch.Tensor,
                   max_weight: float | None) -> torch.Tensor:
    """exp(beta * A / c), c = sqrt(``adv_sq``), clipped to ``max_weight`` (None: not
    clipped); no gradient."""
    with torch.no_grad():
        weight = torch.exp(beta * adv / torch.sqrt(adv_sq + 1e-8))
        return weight if max_weight is None else weight.clamp(max=max_weight)


def marwil_loss(logp: torch.Tensor, entropy: torch.Tensor, v: torch.Tensor, ret: torch.Tensor,
                weight: torch.Tensor, vf_coef: float, ent_coef: float) -> tuple[torch.Tensor, dict]:
    """-mean(weight * log pi(a|s)) + vf_coef * 0.5 * mean((V(s) - R)^2) - ent_coef * entropy.
    With weights of 1 and ``vf_coef`` 0 this is ``bc_loss``."""
    policy_loss = -(weight * logp).mean()
    value_loss = 0.5 * (v - ret).pow(2).mean()
    ent = entropy.mean()
    loss = policy_loss + vf_coef * value_loss - ent_coef * ent
    return loss, {"policy_loss": policy_loss.detach(), "value_loss": value_loss.detach(),
                  "entropy": ent.detach(), "weight_mean": weight.mean(), "weight_max": weight.max()}

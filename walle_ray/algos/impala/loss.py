"""IMPALA losses as pure functions: V-trace actor-critic, CLEAR cloning, LASER mask."""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of x over the entries where mask is 1 (all entries when mask is None)."""
    if mask is None:
        return x.mean()
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def impala_loss(logp_t: torch.Tensor, entropy_t: torch.Tensor, v_t: torch.Tensor,
                vs_t: torch.Tensor, pg_adv_t: torch.Tensor, *, baseline_coef: float,
                ent_coef: float, mask_t: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-E[log pi * A_pg] + baseline_coef * 0.5 E[(vs - V)^2] - ent_coef * E[H].

    All [T, B]; vs_t and pg_adv_t are V-trace outputs (no gradient). ``mask_t`` (LASER)
    drops steps from the policy and value terms.
    """
    policy = -masked_mean(logp_t * pg_adv_t, mask_t)
    value = 0.5 * masked_mean((vs_t - v_t) ** 2, mask_t)
    entropy = entropy_t.mean()
    loss = policy + baseline_coef * value - ent_coef * entropy
    return loss, {"policy_loss": policy.detach(), "value_loss": value.detach(),
                  "entropy": entropy.detach()}


def clear_loss(kl_t: torch.Tensor, v_t: torch.Tensor, stored_v_t: torch.Tensor,
               replayed_t: torch.Tensor, *, policy_coef: float, value_coef: float
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CLEAR's behaviour cloning on replayed steps (Rolnick et al. 2019).

    kl_t: KL(stored behaviour || current policy) per step; stored_v_t: the value the
    behaviour network predicted; replayed_t: 1 on replayed steps. Returns 0 with no replay.
    """
    policy = masked_mean(kl_t, replayed_t)
    value = masked_mean((v_t - stored_v_t) ** 2, replayed_t)
    loss = policy_coef * policy + value_coef * value
    return loss, {"clear_policy": policy.detach(), "clear_value": value.detach()}


def laser_mask(kl_t: torch.Tensor, threshold: float | None) -> torch.Tensor | None:
    """LASER's trust region (Schmitt et al. 2020): keep steps whose behaviour policy is
    within ``threshold`` KL of the current one; None when LASER is off."""
    if threshold is None:
        return None
    return (kl_t <= threshold).to(kl_t.dtype)

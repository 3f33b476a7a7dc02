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
                ent_coef: float, mask_t: torch.Tensor | None = None,
                learn_t: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-E[log pi * A_pg] + baseline_coef * 0.5 E[(vs - V)^2] - ent_coef * E[H].

    All [T, B]; vs_t and pg_adv_t are V-trace outputs (no gradient). ``mask_t`` drops steps
    from the policy and value terms (LASER's mask, with burn-in's steps folded in by the
    caller); ``learn_t`` (burn-in's: 0 on the steps a replayed row re-derives its recurrent
    state over) drops them from the entropy's mean too, so no term learns from burn-in
    steps, as R2D2 leaves them out of the loss.
    """
    policy = -masked_mean(logp_t * pg_adv_t, mask_t)
    value = 0.5 * masked_mean((vs_t - v_t) ** 2, mask_t)
    entropy = masked_mean(entropy_t, learn_t)
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


def laser_mask(divergence_t: torch.Tensor, threshold: float | None) -> torch.Tensor | None:
    """LASER's trust region (Schmitt et al. 2020, section 4): 1 on steps to keep, 0 on steps
    to reject; None when LASER is off.

    ``divergence_t`` is the paper's test, KL(pi || pi_rho) per step (``ActionHead.implied_kl``):
    the KL from the current policy pi to the policy V-trace actually evaluates when acting
    with behaviour mu and truncating at rho_bar, pi_rho ∝ min(rho_bar mu, pi). It is not
    KL(mu || pi): where a behaviour puts more mass than pi on an action, V-trace's truncation
    removes the excess anyway, so the test depends on mu only where rho_bar mu < pi, that is,
    on how much of pi the behaviour fails to cover.
    A rejected step is dropped entirely, as in the paper: ``vtrace`` zeroes its weights, so
    it adds no TD error and cuts the trace of earlier steps (their targets bootstrap from
    its value), and ``impala_loss`` leaves it out of the policy and value terms.
    """
    if threshold is None:
        return None
    return (divergence_t <= threshold).to(divergence_t.dtype)

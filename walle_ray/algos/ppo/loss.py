"""PPO losses as pure functions of a minibatch and the network outputs."""

from __future__ import annotations

import torch


def value_loss(v: torch.Tensor, v_target: torch.Tensor, old_v: torch.Tensor | None = None,
               vf_clip: float | None = None) -> torch.Tensor:
    """0.5 * mean squared error; with ``vf_clip`` the pessimistic of clipped and unclipped."""
    loss = (v - v_target) ** 2
    if vf_clip is not None and old_v is not None:
        v_clipped = old_v + torch.clamp(v - old_v, -vf_clip, vf_clip)
        loss = torch.maximum(loss, (v_clipped - v_target) ** 2)
    return 0.5 * loss.mean()


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                  v: torch.Tensor, v_target: torch.Tensor, entropy: torch.Tensor, *,
                  clip: float, vf_coef: float, ent_coef: float,
                  old_v: torch.Tensor | None = None,
                  vf_clip: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate: -mean(min(rho * A, clip(rho, 1-eps, 1+eps) * A)) + value - entropy.

    All inputs are [N]; returns the scalar loss and its named terms (detached).
    """
    log_rho = logp - old_logp
    rho = log_rho.exp()
    surrogate = torch.minimum(rho * adv, torch.clamp(rho, 1 - clip, 1 + clip) * adv)
    policy = -surrogate.mean()
    value = value_loss(v, v_target, old_v, vf_clip)
    ent = entropy.mean()
    loss = policy + vf_coef * value - ent_coef * ent
    with torch.no_grad():
        terms = {"policy_loss": policy.detach(), "value_loss": value.detach(), "entropy": ent.detach(),
                 "approx_kl": ((rho - 1) - log_rho).mean(),
                 "clip_frac": ((rho - 1).abs() > clip).float().mean()}
    return loss, terms


def ppo_kl_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, kl: torch.Tensor,
                v: torch.Tensor, v_target: torch.Tensor, entropy: torch.Tensor, *,
                beta: float, vf_coef: float, ent_coef: float,
                old_v: torch.Tensor | None = None,
                vf_clip: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-penalised surrogate: -mean(rho * A) + beta * mean(KL(behaviour || current)) + value - entropy.

    ``kl`` is the per-row KL from the behaviour distribution to the current one, [N].
    """
    rho = (logp - old_logp).exp()
    policy = -(rho * adv).mean()
    kl_mean = kl.mean()
    value = value_loss(v, v_target, old_v, vf_clip)
    ent = entropy.mean()
    loss = policy + beta * kl_mean + vf_coef * value - ent_coef * ent
    with torch.no_grad():
        terms = {"policy_loss": policy.detach(), "value_loss": value.detach(),
                 "entropy": ent.detach(), "kl": kl_mean.detach(), "kl_penalty": beta * kl_mean.detach()}
    return loss, terms


def adapt_kl_beta(beta: float, kl: float, kl_target: float) -> float:
    """Double the penalty when KL overshoots 1.5 x target, halve it below target / 1.5."""
    if kl > 1.5 * kl_target:
        return min(beta * 2.0, 1e4)
    if kl < kl_target / 1.5:
        return max(beta / 2.0, 1e-4)
    return beta

"""V-trace off-policy corrected value targets and policy-gradient advantages (IMPALA)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class VTrace:
    """V-trace outputs, all [T, B]."""

    vs_t: torch.Tensor  # value targets
    pg_adv_t: torch.Tensor  # policy-gradient advantages (with their own clipped weights)
    rho_t: torch.Tensor  # truncated importance weights min(rho_bar, pi/mu)


@torch.no_grad()
def vtrace(log_rho_t: torch.Tensor, r_t: torch.Tensor, v_t: torch.Tensor, bootstrap_v: torch.Tensor,
           terminated_t: torch.Tensor, truncated_t: torch.Tensor, final_v_t: torch.Tensor,
           gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0, pg_rho_bar: float = 1.0,
           lam: float = 1.0, mask_t: torch.Tensor | None = None) -> VTrace:
    """V-trace (Espeholt et al. 2018) on time-major [T, B] tensors.

    log_rho_t: log pi(a_t|x_t) - log mu(a_t|x_t); v_t: current value estimates;
    bootstrap_v [B]: value after the fragment's last step. A terminal step has discount 0;
    a truncated step bootstraps from ``final_v_t`` (its final observation's value). Both cut
    the trace, since the next row belongs to a new episode. ``mask_t`` (LASER) zeroes the
    weights, so masked steps neither carry the trace nor produce an advantage.
    """
    rho = torch.exp(log_rho_t)
    rho_t = torch.clamp(rho, max=rho_bar)
    c_t = lam * torch.clamp(rho, max=c_bar)
    pg_rho_t = torch.clamp(rho, max=pg_rho_bar)
    if mask_t is not None:
        rho_t, c_t, pg_rho_t = rho_t * mask_t, c_t * mask_t, pg_rho_t * mask_t
    discount_t = gamma * (1.0 - terminated_t.to(v_t.dtype))
    trace_t = discount_t * (1.0 - truncated_t.to(v_t.dtype))
    v_tp1 = torch.cat([v_t[1:], bootstrap_v[None]], dim=0)
    v_tp1 = torch.where(truncated_t, final_v_t, v_tp1)
    delta_t = rho_t * (r_t + discount_t * v_tp1 - v_t)
    acc = torch.zeros_like(bootstrap_v)
    diffs = []
    for t in range(v_t.shape[0] - 1, -1, -1):
        acc = delta_t[t] + trace_t[t] * c_t[t] * acc
        diffs.append(acc)
    vs_t = v_t + torch.stack(diffs[::-1])
    vs_tp1 = torch.cat([vs_t[1:], bootstrap_v[None]], dim=0)
    vs_tp1 = torch.where(truncated_t, final_v_t, vs_tp1)
    pg_adv_t = pg_rho_t * (r_t + discount_t * vs_tp1 - v_t)
    return VTrace(vs_t=vs_t, pg_adv_t=pg_adv_t, rho_t=rho_t)

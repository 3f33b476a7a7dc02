"""One IMPALA update: forward the batch, V-trace, loss, synced gradients, step."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

from walle_ray.algos.impala.config import IMPALAConfig
from walle_ray.algos.impala.loss import clear_loss, impala_loss, laser_mask
from walle_ray.batch import Rollout, concat_rollouts
from walle_ray.buffers.mixed import update_rows
from walle_ray.learners.collective import Collective
from walle_ray.learners.optim import make_optimizer, scheduled_lr, set_lr
from walle_ray.learners.reward_scale import update_obs_norm
from walle_ray.learners.update_rule import UpdateRule
from walle_ray.models import ActorCritic
from walle_ray.ops import vtrace


class IMPALAUpdate(UpdateRule):
    """One call is one gradient step on one batch."""

    def __init__(self, cfg: IMPALAConfig, model: ActorCritic, collective: Collective,
                 normalize_reward: bool, total_env_steps: int, device: torch.device,
                 burn_in: int = 0):
        """``burn_in``: ``model.burn_in``, the steps of each replayed row that re-derive its
        recurrent state (``_unroll``)."""
        optimizer = make_optimizer(model.parameters(), cfg.optimizer, cfg.lr, cfg.eps,
                                   cfg.rmsprop_alpha)
        super().__init__(model, collective, optimizer, normalize_reward, total_env_steps, device)
        self.cfg = cfg
        self.burn_in = burn_in
        # The share of each update's rows that is replayed (``algo.replay``).
        rows = update_rows([r.ratio for r in cfg.replay], cfg.batch_size)
        self.replay_share = Fraction(sum(n for r, n in zip(cfg.replay, rows) if r.type != "queue"),
                                     cfg.batch_size)

    def update(self, rollouts: list[Rollout], env_steps: int) -> dict[str, float]:
        cfg, dev = self.cfg, self.device
        batch = concat_rollouts(rollouts)
        T, B = batch.reward_t.shape
        # Replayed rows were counted when they were fresh; the statistics count each row once.
        fresh_b = ~batch.replayed_b
        reward = (self.reward_scaler(batch, self.collective, fresh_b) if self.reward_scaler
                  else batch.reward_t)
        t = lambda x: torch.as_tensor(np.asarray(x)).to(dev)  # noqa: E731
        truncated_t = t(batch.truncated_t)
        burn_t = None  # replayed rows' burn-in steps, left out of the loss
        if getattr(self.model, "recurrent", False):
            params_t, v_t, boot, final_v, burn_t = self._unroll(batch, t)
        else:
            # One forward pass values the steps, the fragment's next observation (the
            # bootstrap) and the final observations of truncated episodes, all with this network.
            obs = torch.cat([t(batch.obs_t).reshape(T * B, *batch.obs_t.shape[2:]),
                             t(batch.last_obs), t(batch.final_obs)])
            params, values = self.model(obs)
            params_t, v_t = params[: T * B].view(T, B, -1), values[: T * B].view(T, B)
            boot, final_v = values[T * B: T * B + B].detach(), values[T * B + B:].detach()
        final_v_t = torch.zeros_like(v_t.detach()).masked_scatter_(truncated_t, final_v)
        head = self.model.head
        dist = head.dist(params_t)
        action_t = t(batch.action_t)
        logp_t = dist.log_prob(action_t)
        behaviour_t = t(batch.dist_t)
        kl_t = head.kl(behaviour_t, params_t)  # KL(behaviour || current), [T, B]: CLEAR, metrics
        laser_t = None
        if cfg.laser_kl_threshold is not None:
            laser_t = laser_mask(head.implied_kl(params_t.detach(), behaviour_t, cfg.rho_bar),
                                 cfg.laser_kl_threshold)
        mask_t = burn_t
        if laser_t is not None:
            mask_t = laser_t if burn_t is None else laser_t * burn_t
        vt = vtrace(logp_t.detach() - t(batch.logp_t), t(reward), v_t.detach(), boot,
                    t(batch.terminated_t), truncated_t, final_v_t, cfg.gamma,
                    rho_bar=cfg.rho_bar, c_bar=cfg.c_bar, pg_rho_bar=cfg.pg_rho_bar,
                    lam=cfg.vtrace_lambda, mask_t=mask_t)
        loss, terms = impala_loss(logp_t, dist.entropy(), v_t, vt.vs_t, vt.pg_adv_t,
                                  baseline_coef=cfg.baseline_coef, ent_coef=cfg.ent_coef,
                                  mask_t=mask_t, learn_t=burn_t)
        # Learner shards may take a mix's rows unevenly (``buffers/mixed.batch_counts``):
        # terms that are means over part of a shard's steps are weighed by that part against
        # its share, so the all-reduced step is one learner's on all the rows. Burn-in leaves
        # a replayed row's first steps out of the V-trace terms, CLEAR clones replayed rows.
        # (A mix with no replay type takes no weights: its batches are as they come.)
        replayed, expected = int(batch.replayed_b.sum()), self.replay_share * B
        burn = min(self.burn_in, T - 1) if getattr(self.model, "recurrent", False) else 0
        learned = Fraction(T * B - burn * replayed) / (T * B - burn * expected) if expected else 1
        if learned != 1:
            loss = loss * float(learned)
        replayed_t = t(batch.replayed_b).to(v_t.dtype).expand(T, B)
        if (cfg.clear_policy_coef or cfg.clear_value_coef) and bool(replayed_t.any()):
            # CLEAR clones the replayed steps that are learned from, not the burned-in ones.
            cloned_t = replayed_t if burn_t is None else replayed_t * burn_t
            extra, clear_terms = clear_loss(kl_t, v_t, t(batch.v_t), cloned_t,
                                            policy_coef=cfg.clear_policy_coef,
                                            value_coef=cfg.clear_value_coef)
            cloned = Fraction(replayed) / expected if expected else 1
            loss = loss + (extra if cloned == 1 else extra * float(cloned))
            terms.update(clear_terms)
        lr = scheduled_lr(cfg.lr, cfg.lr_schedule, env_steps, self.total_env_steps)
        set_lr(self.optimizer, lr)
        grad_norm = self.guard.step(self.optimizer, list(self.model.parameters()), loss,
                                    self.collective, cfg.max_grad_norm, terms)
        update_obs_norm(self.model, batch, self.collective, fresh_b)
        out = {k: float(v) for k, v in terms.items()}
        if burn_t is not None:
            out["burn_in_frac"] = 1.0 - float(burn_t.mean())
        out.update(loss=float(loss.detach()), grad_norm=float(grad_norm), lr=lr,
                   rho_mean=float(vt.rho_t.mean() if mask_t is None  # over the steps learned from
                                   else vt.rho_t.sum() / mask_t.sum().clamp(min=1.0)),
                   kl=float(kl_t.detach().mean()),
                   replayed_frac=float(replayed_t.mean()),
                   laser_kept=1.0 if laser_t is None else float(laser_t.mean()))
        return out

    def _unroll(self, batch: Rollout, t) -> tuple:
        """A recurrent model over the batch's fragments, each from the state its sampler
        stored: (params_t, v_t, bootstrap values, final observations' values, burn-in mask).

        The bootstrap value of ``last_obs`` starts from the state after the last step (zero
        where an episode ended there), a truncated episode's final observation from the
        state after its last step. With ``model.burn_in`` N, replayed rows re-derive their
        state over their first N steps: the gradient does not reach back past step N and
        those steps are left out of the loss (R2D2, Kapturowski et al. 2019); the mask is
        None when no row is burned in."""
        T, B = batch.reward_t.shape
        obs_t, state, first_t = t(batch.obs_t), t(batch.state_b), t(batch.first_t())
        n = min(self.burn_in, T - 1) if bool(batch.replayed_b.any()) else 0
        if n:
            replayed = t(batch.replayed_b)
            head_params, head_v, head_states = self.model.unroll(obs_t[:n], state, first_t[:n])
            # No term of the loss (entropy and CLEAR included) learns from a burn-in step.
            head_params = torch.where(replayed[None, :, None], head_params.detach(), head_params)
            head_v = torch.where(replayed[None, :], head_v.detach(), head_v)
            carried = torch.where(replayed[:, None], head_states[-1].detach(), head_states[-1])
            params_t, v_t, states_t = self.model.unroll(obs_t[n:], carried, first_t[n:])
            params_t, v_t = torch.cat([head_params, params_t]), torch.cat([head_v, v_t])
            states_t = torch.cat([head_states, states_t])
            burn_t = torch.ones(T, B, device=v_t.device)
            burn_t[:n, replayed] = 0.0
        else:
            params_t, v_t, states_t = self.model.unroll(obs_t, state, first_t)
            burn_t = None
        ended = t(batch.terminated_t[-1] | batch.truncated_t[-1])
        with torch.no_grad():
            _, values, _ = self.model.step(
                torch.cat([t(batch.last_obs), t(batch.final_obs)]),
                torch.cat([states_t[-1] * ~ended[:, None], states_t[t(batch.truncated_t)]]))
        return params_t, v_t, values[:B], values[B:], burn_t

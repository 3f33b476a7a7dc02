"""One offline update on a learner: BC's likelihood, or MARWIL's weighted by advantages."""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from walle_ray.algos.imitation.config import BCConfig, MARWILConfig
from walle_ray.algos.imitation.loss import bc_loss, marwil_loss, marwil_weights
from walle_ray.batch import OfflineBatch
from walle_ray.learners.collective import Collective
from walle_ray.learners.optim import make_optimizer, scheduled_lr, set_lr
from walle_ray.learners.reward_scale import merge_obs
from walle_ray.learners.update_rule import UpdateRule
from walle_ray.models import RunningNorm


def advance_adv_sq(adv_sq: float | None, batch_sq: float, rate: float) -> float:
    """MARWIL's running c^2 after a batch whose mean squared advantage is ``batch_sq``: that
    batch's where there is none yet, else a step of ``rate`` towards it."""
    return batch_sq if adv_sq is None else adv_sq + rate * (batch_sq - adv_sq)


class OfflineUpdate(UpdateRule):
    """A gradient step on recorded steps (``OfflineBatch``; several when the learner is
    packed, ``topology.pack``).

    MARWIL (a ``MARWILConfig``) completes each row's return with the value of its episode's
    last observation where a time limit cut the episode, weights the log-likelihood by
    exp(beta * (R - V(s)) / c) and fits V to R. With beta 0 the weights are all 1 and it is
    BC: no value is fitted (RLlib's choice), so neither the value's gradient through a shared
    torso nor its share of the gradient clip moves the policy. With ``env.normalize_reward`` the value head
    learns returns divided by their running std, so its loss has the same scale on every env.
    The observation normaliser (``env.normalize_obs``) follows the recorded observations.
    """

    def __init__(self, cfg: BCConfig | MARWILConfig, model, collective: Collective,
                 normalize_reward: bool, total_env_steps: int, device: torch.device):
        optimizer = make_optimizer(model.parameters(), "adam", cfg.lr, cfg.adam_eps)
        super().__init__(model, collective, optimizer, False, total_env_steps, device)
        self.cfg = OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg
        self.marwil = isinstance(self.cfg, MARWILConfig)
        self.return_norm = RunningNorm(()) if self.marwil and normalize_reward else None
        # MARWIL's c^2: algo.adv_norm_init, or the first batch's mean A^2 where that is null
        self.adv_sq = getattr(self.cfg, "adv_norm_init", None)

    def update(self, batches: list[OfflineBatch], env_steps: int) -> dict[str, float]:
        cfg, dev = self.cfg, self.device
        cat = lambda name: torch.as_tensor(np.concatenate([getattr(b, name) for b in batches])).to(dev)  # noqa: E731
        obs, action = cat("obs"), cat("action")
        lr = scheduled_lr(cfg.lr, cfg.lr_schedule, env_steps, self.total_env_steps)
        set_lr(self.optimizer, lr)
        if self.marwil and cfg.beta > 0:
            params, v = self.model(obs)
            ret, scale = self._returns(cat("ret"), cat("tail"), cat("final_obs"))
            adv = ret - v.detach()
            sq = float(self.collective.all_reduce_mean(adv.pow(2).mean().reshape(1).cpu())[0])
            self.adv_sq = advance_adv_sq(self.adv_sq, sq, cfg.adv_norm_rate)
            weight = marwil_weights(adv, cfg.beta, torch.tensor(self.adv_sq, device=dev), cfg.max_weight)
            dist = self.model.head.dist(params)
            loss, terms = marwil_loss(dist.log_prob(action), dist.entropy(), v, ret, weight,
                                      cfg.vf_coef, cfg.ent_coef)
            terms.update(adv_rms=torch.tensor(self.adv_sq ** 0.5), return_scale=torch.tensor(scale))
        else:
            policy = getattr(self.model, "policy", None)
            params = policy(obs) if policy is not None else self.model(obs)[0]
            dist = self.model.head.dist(params)
            loss, terms = bc_loss(dist.log_prob(action), dist.entropy(), cfg.ent_coef)
        grad_norm = self.guard.step(self.optimizer, list(self.model.parameters()), loss,
                                    self.collective, cfg.max_grad_norm, terms)
        merge_obs(self.model, obs, self.collective)  # the recorded observations
        out = {k: float(v) for k, v in terms.items()}
        out.update(lr=lr, grad_norm=float(grad_norm))
        return out

    @torch.no_grad()
    def _returns(self, ret: torch.Tensor, tail: torch.Tensor,
                 final_obs: torch.Tensor) -> tuple[torch.Tensor, float]:
        """R = ret / scale + tail * V(final_obs), in the value head's units; and the scale."""
        scale = 1.0
        if self.return_norm is not None:
            moments = self.collective.all_reduce_sum(self.return_norm.moments(ret.cpu()))
            self.return_norm.update_from_moments(moments)
            scale = float(torch.sqrt(self.return_norm.var + 1e-8))
        bootstrap = self.model.value(final_obs) if bool((tail > 0).any()) else torch.zeros_like(ret)
        return ret / scale + tail * bootstrap, scale

    def state_dict(self) -> dict:
        state = {**super().state_dict(), "adv_sq": self.adv_sq}
        if self.return_norm is not None:
            state["return_norm"] = self.return_norm.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.adv_sq = state.get("adv_sq")
        if self.return_norm is not None and "return_norm" in state:
            self.return_norm.load_state_dict(state["return_norm"])

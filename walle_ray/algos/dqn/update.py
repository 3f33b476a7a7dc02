"""One DQN update: targets from a target network, a weighted Huber step, new priorities."""

from __future__ import annotations

import math

import torch

from walle_ray.algos.dqn.config import DQNConfig
from walle_ray.algos.dqn.loss import dqn_loss, q_targets
from walle_ray.batch import ReplayBatch
from walle_ray.learners.collective import Collective
from walle_ray.learners.guard import NonFiniteGuard
from walle_ray.learners.optim import make_optimizer
from walle_ray.learners.targets import (PriorityFeedback, batch_tensors, hard_update, make_target,
                                       polyak_update)
from walle_ray.models.q_network import QNetwork


class DQNUpdate(PriorityFeedback):
    """One call is one gradient step; the target network follows every ``target_update_every``
    updates (or by Polyak averaging with ``tau``)."""

    def __init__(self, cfg: DQNConfig, model: QNetwork, collective: Collective, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.collective = collective
        self.device = device
        self.target = make_target(model)
        self.optimizer = make_optimizer(model.parameters(), "adam", cfg.lr, cfg.adam_eps)
        self.guard = NonFiniteGuard()
        self.updates = 0

    def update(self, batches: list[ReplayBatch], env_steps: int) -> dict:
        cfg = self.cfg
        if self.updates == 0:  # the target starts from the weights every learner trains
            hard_update(self.target, self.model)
        obs, action, reward, discount, next_obs, weight = batch_tensors(
            batches, ("obs", "action", "reward", "discount", "next_obs", "weight"), self.device)
        n = obs.shape[0]
        q_all = self.model(torch.cat([obs, next_obs]) if cfg.double_q else obs)
        q = q_all[:n]
        with torch.no_grad():
            next_q_target = self.target(next_obs)
            next_q_online = q_all[n:].detach() if cfg.double_q else None
            target = q_targets(reward, discount, next_q_target, next_q_online)
        loss, td = dqn_loss(q, action, target, weight.float(), cfg.huber_delta)
        grad_norm = self.guard.step(self.optimizer, list(self.model.parameters()), loss,
                                    self.collective, cfg.max_grad_norm, {"loss": loss.detach()})
        self.updates += 1
        self._follow_target()
        q_taken = q.detach().gather(-1, action.long().unsqueeze(-1))
        out = {"loss": float(loss.detach()), "q_mean": float(q_taken.mean()),
               "target_mean": float(target.mean()), "td_error_mean": float(td.abs().mean()),
               "grad_norm": float(grad_norm)}
        # Uniform shards have no use for priorities.
        self.set_feedback(batches, td, cfg.prioritized and math.isfinite(grad_norm))
        return out

    def _follow_target(self) -> None:
        if self.cfg.tau > 0:
            polyak_update(self.target, self.model, self.cfg.tau)
        elif self.updates % self.cfg.target_update_every == 0:
            hard_update(self.target, self.model)

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "target": self.target.state_dict(),
                "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.target.load_state_dict(state["target"])
        self.updates = int(state["updates"])

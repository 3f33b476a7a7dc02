"""One DDPG / TD3 update: a critic step every call; actor and target steps every policy_delay."""

from __future__ import annotations

import math

import torch
from torch import nn

from walle_ray.algos.ddpg.config import DDPGConfig
from walle_ray.algos.ddpg.loss import (actor_loss, critic_loss, critic_targets,
                                       smooth_target_action, twin_critic_targets)
from walle_ray.batch import ReplayBatch
from walle_ray.learners.collective import Collective
from walle_ray.learners.guard import NonFiniteGuard
from walle_ray.learners.optim import ADAM_EPS, make_optimizer
from walle_ray.learners.targets import (PriorityFeedback, batch_tensors, hard_update, make_target,
                                       polyak_update)
from walle_ray.models.deterministic import DeterministicActorCritic


class DDPGUpdate(PriorityFeedback):
    """One call is one critic step on the concatenated batches; every ``policy_delay`` calls
    the actor steps too and the target networks move ``tau`` towards the online ones."""

    def __init__(self, cfg: DDPGConfig, model: DeterministicActorCritic, collective: Collective,
                 device: torch.device):
        self.cfg = cfg
        self.model = model
        self.collective = collective
        self.device = device
        self.target = make_target(model)
        self.actor_params = list(model.actor.parameters())
        self.critic_params = list(model.critics.parameters())
        actor_lr = cfg.lr if cfg.actor_lr is None else cfg.actor_lr
        critic_lr = cfg.lr if cfg.critic_lr is None else cfg.critic_lr
        self.actor_optimizer = make_optimizer(self.actor_params, "adam", actor_lr, ADAM_EPS)
        self.critic_optimizer = make_optimizer(self.critic_params, "adam", critic_lr, ADAM_EPS)
        self.guard = NonFiniteGuard()
        self.updates = 0

    def update(self, batches: list[ReplayBatch], env_steps: int) -> dict:
        """One gradient step; returns its metrics as floats."""
        cfg, model = self.cfg, self.model
        if self.updates == 0:  # the targets start from the weights every learner trains
            hard_update(self.target, model)
        obs, action, reward, discount, next_obs, weight = batch_tensors(
            batches, ("obs", "action", "reward", "discount", "next_obs", "weight"), self.device,
            torch.float32)
        target = self._targets(reward, discount, next_obs)
        qs = model.q_both(obs, action)
        losses, tds = zip(*(critic_loss(q, target, weight) for q in qs))
        loss = sum(losses)
        td = tds[0]
        out = {"critic_loss": float(loss.detach()),
               "critic_grad_norm": self._step(self.critic_optimizer, self.critic_params, loss,
                                              "critic_loss"),
               "q_mean": float(qs[0].detach().mean()), "target_q_mean": float(target.mean()),
               "td_error_mean": float(td.abs().mean())}
        self.updates += 1
        if self.updates % cfg.policy_delay == 0:
            pi_loss = actor_loss(model.q(obs, model.act(obs)))
            out.update(actor_loss=float(pi_loss.detach()),
                       actor_grad_norm=self._step(self.actor_optimizer, self.actor_params, pi_loss,
                                                  "actor_loss"))
            polyak_update(self.target, model, cfg.tau)
        # The first critic's TD errors; uniform shards have no use for priorities.
        self.set_feedback(batches, td, cfg.prioritized and math.isfinite(out["critic_grad_norm"]))
        return out

    @torch.no_grad()
    def _targets(self, reward: torch.Tensor, discount: torch.Tensor,
                 next_obs: torch.Tensor) -> torch.Tensor:
        """n-step TD targets from the target networks, with TD3's smoothing and clipped double Q
        where configured."""
        cfg, target = self.cfg, self.target
        next_action = target.act(next_obs)
        if cfg.target_noise > 0:
            scale = target.action_scale
            noise = torch.randn_like(next_action) * (cfg.target_noise * scale)
            next_action = smooth_target_action(next_action, noise, cfg.target_noise_clip * scale,
                                               target.action_low, target.action_high)
        next_q = target.q_both(next_obs, next_action)
        if len(next_q) == 2:
            return twin_critic_targets(reward, discount, *next_q)
        return critic_targets(reward, discount, next_q[0])

    def _step(self, optimizer: torch.optim.Optimizer, params: list[nn.Parameter],
              loss: torch.Tensor, name: str) -> float:
        """Backward, average gradients over learners, clip, step (unless anything is
        non-finite); returns the gradient norm."""
        return self.guard.step(optimizer, params, loss, self.collective, self.cfg.max_grad_norm,
                               {name: loss.detach()})

    def state_dict(self) -> dict:
        return {"actor_optimizer": self.actor_optimizer.state_dict(),
                "critic_optimizer": self.critic_optimizer.state_dict(),
                "target": self.target.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.target.load_state_dict(state["target"])
        self.updates = int(state["updates"])

"""One ES update: centred ranks of every evaluated perturbation, the noise they weight, an
Adam step with weight decay, the observation statistics merged."""

from __future__ import annotations

import numpy as np
import torch

from walle_ray.algos.es.config import ESConfig
from walle_ray.algos.es.model import ESPolicy
from walle_ray.algos.es.ops import es_gradient, noise_table
from walle_ray.algos.es.sampler import Evaluations
from walle_ray.learners.collective import Collective
from walle_ray.learners.optim import ADAM_EPS, make_optimizer
from walle_ray.learners.update_rule import UpdateRule
from walle_ray.pulse import PULSE


class ESUpdate(UpdateRule):
    """The learner's side of ES. It rebuilds the samplers' noise table from
    ``algo.noise_seed`` (the same values, so offsets are all that travel) and steps the
    policy's parameters with Adam along ``-g + l2_coef * theta``, g the rank-weighted noise
    sum (``ops.es_gradient``)."""

    def __init__(self, cfg: ESConfig, model: ESPolicy, collective: Collective,
                 total_env_steps: int, device: torch.device):
        optimizer = make_optimizer(model.parameters(), "adam", cfg.lr, ADAM_EPS)
        super().__init__(model, collective, optimizer, False, total_env_steps, device)
        self.cfg = cfg
        self.table = noise_table(cfg.noise_size, cfg.noise_seed)

    def update(self, batches: list[Evaluations], env_steps: int) -> dict[str, float]:
        cfg, model = self.cfg, self.model
        offsets = np.concatenate([b.offset for b in batches])
        pos = np.concatenate([b.return_pos for b in batches])
        neg = np.concatenate([b.return_neg for b in batches])
        theta = model.flat_params()
        g = torch.from_numpy(es_gradient(self.table, offsets, pos, neg, theta.numel())).to(
            theta.device, torch.float32)
        grad = -g + cfg.l2_coef * theta
        at = 0
        for p in model.parameters():
            p.grad = grad[at: at + p.numel()].view_as(p).to(p.device).clone()
            at += p.numel()
        self.optimizer.step()
        PULSE.beat()  # docs/faults.md, "Stalled roles"
        step = model.flat_params() - theta
        if model.obs_norm is not None:
            moments = torch.from_numpy(sum(b.obs_moments for b in batches))
            model.obs_norm.update_from_moments(moments.to(model.obs_norm.mean.device))
        both = np.concatenate([pos, neg])
        return {"return_mean": float(both.mean()), "return_max": float(both.max()),
                "return_std": float(both.std()), "pairs": float(len(offsets)),
                "grad_norm": float(g.norm()), "theta_norm": float(theta.norm()),
                "update_ratio": float(step.norm() / theta.norm().clamp(min=1e-12)),
                "episode_steps_mean": float(np.mean(np.concatenate(
                    [np.concatenate([b.length_pos, b.length_neg]) for b in batches])))}

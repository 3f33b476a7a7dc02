"""Reward scaling by the running std of the discounted return (all-reduced across learners)."""

from __future__ import annotations

import numpy as np
import torch

from walle_ray.batch import Rollout
from walle_ray.learners.collective import Collective
from walle_ray.models import RunningNorm


class RewardScaler:
    """Divides rewards by the std of the samplers' running discounted returns."""

    def __init__(self) -> None:
        self.norm = RunningNorm(())

    def __call__(self, batch: Rollout, collective: Collective,
                 counted_b: np.ndarray | None = None) -> np.ndarray:
        """The batch's rewards, scaled; the statistics count only the rows where
        ``counted_b`` [B] is true (all when None), so replayed rows count once, when fresh."""
        return_t = batch.return_t if counted_b is None else batch.return_t[:, counted_b]
        moments = collective.all_reduce_sum(self.norm.moments(torch.from_numpy(return_t)))
        self.norm.update_from_moments(moments)
        scale = float(torch.sqrt(self.norm.var + 1e-8))
        return (batch.reward_t / scale).astype(np.float32)

    def state_dict(self) -> dict:
        return self.norm.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.norm.load_state_dict(state)


@torch.no_grad()
def update_obs_norm(model, batch: Rollout, collective: Collective,
                    counted_b: np.ndarray | None = None) -> None:
    """Merge the batch's observations into the model's normaliser (if it has one), from the
    rows where ``counted_b`` [B] is true (all when None).

    Called after an update, so the update saw the statistics the samplers acted with.
    """
    if model.obs_norm is None:
        return
    obs_t = np.asarray(batch.obs_t) if counted_b is None else np.asarray(batch.obs_t)[:, counted_b]
    merge_obs(model, torch.from_numpy(obs_t.reshape(-1, *batch.obs_t.shape[2:])), collective)


@torch.no_grad()
def merge_obs(model, obs: torch.Tensor, collective: Collective) -> None:
    """Merge observations [N, *obs_shape] (on any device) into the model's normaliser, if it
    has one, with the moments summed over every learner."""
    norm = getattr(model, "obs_norm", None)
    if norm is not None:
        moments = collective.all_reduce_sum(norm.moments(obs.cpu()))
        norm.update_from_moments(moments.to(norm.mean.device))

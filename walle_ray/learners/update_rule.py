"""What every algorithm's update shares: model, optimizer, reward scaling, saved state."""

from __future__ import annotations

import torch

from walle_ray.learners.collective import Collective
from walle_ray.learners.guard import NonFiniteGuard
from walle_ray.learners.reward_scale import RewardScaler
from walle_ray.models import ActorCritic


class UpdateRule:
    """Base of the algorithms' update objects; subclasses implement ``update``."""

    def __init__(self, model: ActorCritic, collective: Collective, optimizer: torch.optim.Optimizer,
                 normalize_reward: bool, total_env_steps: int, device: torch.device):
        self.model = model
        self.collective = collective
        self.optimizer = optimizer
        self.reward_scaler = RewardScaler() if normalize_reward else None
        self.total_env_steps = total_env_steps
        self.device = device
        self.guard = NonFiniteGuard()

    def memory_feedback(self) -> None:
        """Policy-gradient updates send nothing back to their memories."""
        return None

    def state_dict(self) -> dict:
        state = {"optimizer": self.optimizer.state_dict()}
        if self.reward_scaler is not None:
            state["return_norm"] = self.reward_scaler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.reward_scaler is not None and "return_norm" in state:
            self.reward_scaler.load_state_dict(state["return_norm"])

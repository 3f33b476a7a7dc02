"""Torch networks and action heads."""

from walle_ray.models.heads import ActionHead, make_action_head
from walle_ray.models.normalizer import RunningNorm
from walle_ray.models.factory import make_actor_critic
from walle_ray.models.policy import ActorCritic

__all__ = ["ActionHead", "ActorCritic", "RunningNorm", "make_action_head", "make_actor_critic"]

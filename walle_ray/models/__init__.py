"""Torch networks and action heads."""

from walle_ray.models.heads import ActionHead, make_action_head
from walle_ray.models.normalizer import RunningNorm
from walle_ray.models.policy import ActorCritic, make_actor_critic

__all__ = ["ActionHead", "ActorCritic", "RunningNorm", "make_action_head", "make_actor_critic"]

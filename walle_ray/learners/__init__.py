"""Learner role and the gradient sync between learners."""

from walle_ray.learners.collective import Collective, TorchCollective
from walle_ray.learners.learner import Learner

__all__ = ["Collective", "Learner", "TorchCollective"]

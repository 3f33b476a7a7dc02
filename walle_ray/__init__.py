"""walle_ray: a Ray-based actor-learner framework for reinforcement learning."""

__version__ = "0.1.0"

"""Sampler and parameter-server roles, as plain classes."""

from walle_ray.actors.param_server import ParameterServer
from walle_ray.actors.sampler import Sampler

__all__ = ["ParameterServer", "Sampler"]

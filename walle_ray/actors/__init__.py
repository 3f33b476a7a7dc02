"""Sampler and parameter-server roles, as plain classes.

Import them from their modules (``walle_ray.actors.sampler``, ``walle_ray.actors.param_server``):
a parameter-server process then never loads torch or the environments.
"""

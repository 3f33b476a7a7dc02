"""Pure return math on time-major arrays [T, B]."""

from walle_ray.ops.gae import gae, next_values
from walle_ray.ops.vtrace import VTrace, vtrace

__all__ = ["VTrace", "gae", "next_values", "vtrace"]

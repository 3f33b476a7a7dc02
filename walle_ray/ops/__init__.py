"""Pure return math on time-major arrays [T, B]."""

from walle_ray.ops.gae import gae, next_values

__all__ = ["gae", "next_values"]

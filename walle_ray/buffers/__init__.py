"""Memory roles."""

from walle_ray.buffers.fifo import FIFOMemory

__all__ = ["FIFOMemory"]

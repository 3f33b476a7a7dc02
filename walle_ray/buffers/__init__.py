"""Memory roles (``walle_ray.buffers.fifo``), importable without torch."""

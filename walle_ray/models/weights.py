"""How a network's weights travel: numpy arrays through the Ray object store."""

from __future__ import annotations

import numpy as np
import torch


class NumpyWeights:
    """Mixin for ``nn.Module`` networks that samplers and learners exchange."""

    def get_weights(self) -> dict[str, np.ndarray]:
        """State dict as numpy arrays: what travels through the Ray object store."""
        return {k: v.detach().cpu().numpy() for k, v in self.state_dict().items()}

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Load arrays from ``get_weights`` (copied: object-store arrays are read-only)."""
        self.load_state_dict({k: torch.as_tensor(np.asarray(v).copy()) for k, v in weights.items()})

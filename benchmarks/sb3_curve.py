"""The learning curve of a Stable-Baselines3 run, written as the peer benchmarks read it
(``vs_peers.py``, ``action_masking.py``): one JSON line per rollout with the seconds since its
training loop started, the env steps and the mean return of the last 20 episodes; the run
stops once that mean reaches ``target``."""

from __future__ import annotations

import json
import time

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback


class Curve(BaseCallback):
    def __init__(self, out: str, target: float):
        super().__init__()
        self.file = open(out, "w")
        self.target = target

    def _on_training_start(self):
        self.t0 = time.perf_counter()

    def _on_rollout_end(self):
        episodes = [e["r"] for e in self.model.ep_info_buffer]
        mean = float(np.mean(episodes)) if episodes else None
        self.file.write(json.dumps({"wall_s": time.perf_counter() - self.t0,
                                    "env_steps": self.num_timesteps, "return": mean}) + "\n")
        self.file.flush()
        if mean is not None and len(episodes) >= 20 and mean >= self.target:
            self.model._stop = True

    def _on_step(self):
        return not getattr(self.model, "_stop", False)

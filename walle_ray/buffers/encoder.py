"""The current policy in a memory's process: what elite and attentive replay rank with
(``walle_ray/buffers/ranked.py``). Imported only by memories that rank, so the others stay
free of torch."""

from __future__ import annotations

import threading

import numpy as np
import torch

from walle_ray.batch import concat_rollouts


class PolicyEncoder:
    """The run's actor-critic, built in this process on first use and given each newer
    version of the learner's weights; it encodes states (``ActorCritic.encode``) and
    measures how far the current policy's outputs moved from the behaviour's.

    ``sections``: the run's env and model sections (``algos.spec.role_sections``), and
    ``make_model(obs_space, action_space, sections)`` the algorithm's network; the spaces
    come from one env made here, as a sampler's do.
    """

    CHUNK = 1024  # states per forward pass, to bound the activations' memory

    def __init__(self, sections, make_model):
        from walle_ray.envs import env_spaces

        obs_space, action_space = env_spaces(sections.env)
        self.model = make_model(obs_space, action_space, sections)
        self.model.eval()
        self.version = -1
        # Weights arrive on one thread of the memory's process while another may be ranking.
        self.lock = threading.Lock()

    def set_weights(self, weights, version: int) -> None:
        with self.lock:
            if version > self.version:
                self.model.set_weights(weights)
                self.version = version

    @torch.inference_mode()
    def encode(self, obs_t: np.ndarray) -> np.ndarray:
        """obs_t [T, N, *obs_shape] -> the current policy's encodings [T, N, F]."""
        with self.lock:
            return self._encode(obs_t)

    def _encode(self, obs_t: np.ndarray) -> np.ndarray:
        T, N = obs_t.shape[:2]
        flat = torch.from_numpy(np.ascontiguousarray(obs_t.reshape(T * N, *obs_t.shape[2:])))
        out = torch.cat([self.model.encode(flat[i: i + self.CHUNK])
                         for i in range(0, T * N, self.CHUNK)])
        return out.reshape(T, N, -1).numpy()

    @torch.inference_mode()
    def policy_kl(self, rows: list, at=slice(None)) -> np.ndarray:
        """KL(behaviour || current policy) at the steps ``at`` of ``rows`` [T', N]; a
        recurrent policy is unrolled over every step from each row's stored state."""
        with self.lock:
            return self._policy_kl(rows, at)

    def _policy_kl(self, rows: list, at) -> np.ndarray:
        batch = concat_rollouts(rows)
        if getattr(self.model, "recurrent", False):
            params_t = self.model.unroll(torch.from_numpy(batch.obs_t), torch.from_numpy(batch.state_b),
                                         torch.from_numpy(batch.first_t()))[0][at]
        else:
            obs_t = torch.from_numpy(np.ascontiguousarray(batch.obs_t[at]))
            T, N = obs_t.shape[:2]
            flat = obs_t.reshape(T * N, *obs_t.shape[2:])
            params_t = torch.cat([self.model.policy(flat[i: i + self.CHUNK])
                                  for i in range(0, T * N, self.CHUNK)]).view(T, N, -1)
        return self.model.head.kl(torch.from_numpy(batch.dist_t[at]), params_t).numpy()

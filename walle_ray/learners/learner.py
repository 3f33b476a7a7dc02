"""The learner role: the model, the algorithm's update and the version counter."""

from __future__ import annotations

import copy
import time
import warnings
from typing import Any, Callable

import numpy as np
import torch
from omegaconf import DictConfig

from walle_ray.batch import OfflineBatch, Rollout, Transitions
from walle_ray.contracts import Update
from walle_ray.learners.collective import Collective, TorchCollective


# Batches arrive as read-only numpy views of the Ray object store; learners only read them.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class Learner:
    """Owns the network and applies the configured algorithm's update to fragments."""

    def __init__(self, cfg: DictConfig, obs_space, action_space,
                 make_model: Callable[..., Any], make_update: Callable[..., Update],
                 device: str = "cpu"):
        """``make_model(obs_space, action_space, cfg)`` and ``make_update(cfg, model,
        collective, device)`` are the algorithm's (``Algorithm.learner_spec``)."""
        torch.manual_seed(cfg.run.seed)
        self.cfg = cfg
        self.device = torch.device(device)
        self.model = make_model(obs_space, action_space, cfg).to(self.device)
        self.collective: Collective = Collective()
        self.update_rule: Update = make_update(cfg, self.model, self.collective, self.device)
        self.update_rule.guard.mode = cfg.learner.on_nonfinite
        self.version = 0
        # With algo.overlap the episodes a run stops at were played a version before the
        # learner's: the state before each update is kept so that ``rewind`` can return to it
        # and the checkpoint holds the weights that played them.
        self.keeps_previous = (bool(cfg.algo.get("overlap", False))
                               and cfg.run.get("stop_at_return") is not None)
        self.previous: dict | None = None

    def join_group(self, address: str, port: int, rank: int, world_size: int,
                   backend: str | None = None) -> None:
        """Form the torch.distributed group with the other learners; rank 0's weights win.
        The backend is NCCL on GPUs and gloo on CPUs unless ``backend`` names one."""
        backend = backend or ("nccl" if self.device.type == "cuda" else "gloo")
        self.collective = TorchCollective(address, port, rank, world_size, backend,
                                          self.cfg.learner.group_timeout_s)
        self.update_rule.collective = self.collective
        self.collective.broadcast_(list(self.model.state_dict().values()))

    def weights(self) -> tuple[int, dict[str, np.ndarray]]:
        return self.version, self.model.get_weights()

    def update(self, rollouts: list[Rollout] | list[Transitions] | list[OfflineBatch],
               env_steps: int) -> dict:
        """One algorithm update on these fragments (or replay batches); returns its metrics.
        What goes back to the memory that served them is ``memory_feedback()``."""
        cpu0 = time.process_time()
        for r in rollouts:
            r.check()
        if self.keeps_previous:  # cloned where it lives: no copy to the host each update
            self.previous = copy.deepcopy({"model": self.model.state_dict(),
                                           "update": self.update_rule.state_dict(),
                                           "version": self.version})
        self.model.train()
        metrics = self.update_rule.update(rollouts, env_steps)
        self.version += 1
        # Recorded data (``OfflineBatch``) was acted by no version of these weights: no lag.
        # Replayed rows are old by design; the lag of the fresh rows is the pipeline's.
        lags = np.concatenate([fresh_lags(r, self.version - 1) for r in rollouts
                               if getattr(r, "version_b", None) is not None] or [np.zeros(1)])
        lags = lags if len(lags) else np.zeros(1)
        # sync_wait_s: time in the all-reduces since the last update, the caller's (a train
        # call's "has every learner a batch?") included, so the bottleneck report sees it all.
        metrics.update(version=self.version, policy_lag_mean=float(lags.mean()),
                       policy_lag_max=float(lags.max()),
                       nonfinite_skipped=self.update_rule.guard.skipped,
                       sync_wait_s=self.collective.take_wait_s(),
                       learn_cpu_s=time.process_time() - cpu0)
        return metrics

    def memory_feedback(self):
        """What the last update sends back to the memory that served its batch (new
        priorities for replay shards), or None (``Update.memory_feedback``)."""
        return self.update_rule.memory_feedback()

    def state_dict(self) -> dict:
        """Network, update rule and version, on the CPU: the driver that writes the checkpoint
        may have no GPU, and a CUDA tensor sent to it would need one to be read."""
        return to_cpu({"model": self.model.state_dict(), "update": self.update_rule.state_dict(),
                       "version": self.version})

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.update_rule.load_state_dict(state["update"])
        self.version = int(state["version"])

    def rewind(self) -> None:
        """Return to the state (weights, optimizer, version) before the last update, where it
        was kept (``keeps_previous``); once."""
        if self.previous is not None:
            self.load_state_dict(self.previous)
            self.previous = None

    def close(self) -> None:
        self.collective.close()


def fresh_lags(batch, version: int) -> np.ndarray:
    """Policy versions between the weights that acted each row and ``version``, over the rows
    that were not replayed (all rows of a batch that marks none: ``replayed_b``)."""
    lags = version - np.asarray(batch.version_b)
    replayed = getattr(batch, "replayed_b", None)
    return lags if replayed is None else lags[~np.asarray(replayed, bool)]


def to_cpu(tree):
    """``tree`` (dicts, lists and tuples of tensors and plain values) with every tensor on
    the CPU."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_cpu(v) for v in tree)
    return tree

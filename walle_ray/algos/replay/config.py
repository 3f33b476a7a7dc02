"""Settings every replay-based algorithm has: the shards, n-step returns, the rate of learning."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class ReplayConfig:
    """Replay shards (one per memory actor), n-step transitions and the learner's pace."""

    gamma: float = 0.99  # discount
    n_step: int = 3  # rewards summed per transition before bootstrapping
    batch_size: int = 256  # transitions per learner update
    capacity: int = 100_000  # transitions the replay holds, split across its shards (FIFO eviction)
    learning_starts: int = 1_000  # transitions held (split across shards) before batches are served
    prioritized: bool = True  # proportional prioritized replay; false: uniform
    priority_alpha: float = 0.6  # priority exponent
    priority_beta: float = 0.4  # importance-sampling exponent at the start
    beta_anneal_updates: int = 0  # batches per shard over which beta rises to 1; 0: fixed
    priority_eps: float = 1e-6  # added to |TD error|, so no transition is never sampled
    replay_ratio: Optional[float] = None  # transitions sampled per transition inserted; null: free-running (Ape-X)
    max_lead: int = 0  # transitions samplers may run ahead of replay_ratio; 0: 2 batches
    fragment_length: int = 32  # env steps per env in one sampler fragment
    fragments_per_call: int = 4  # fragments a sampler collects per driver call (reporting grain)
    updates_per_call: int = 16  # updates a learner runs per driver call (reporting grain)
    prefetch: int = 2  # batch requests each learner keeps in flight
    publish_every: int = 8  # learner updates between weight publishes to the samplers
    lr: float = 1e-3  # learning rate (Adam)
    max_grad_norm: float = 10.0  # global gradient-norm clip; 0: off

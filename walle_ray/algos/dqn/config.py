"""DQN and Ape-X settings: double and dueling Q, n-step targets, epsilon-greedy exploration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from walle_ray.algos.replay.config import ReplayConfig


@dataclass
class DQNConfig(ReplayConfig):
    """DQN over one or more replay shards; epsilon annealed on every sampler."""

    name: str = "dqn"  # shown in run names and metrics
    double_q: bool = True  # the online net picks the bootstrap action, the target net values it
    dueling: bool = True  # Q = V + A - mean(A)
    hidden: List[int] = field(default_factory=lambda: [256, 256])  # MLP widths (vector observations)
    activation: str = "relu"  # relu | tanh
    huber_delta: float = 1.0  # Huber loss threshold on the TD error
    target_update_every: int = 500  # learner updates between hard target-network copies
    tau: float = 0.0  # Polyak factor per update instead of hard copies; 0: hard copies
    exploration: str = "anneal"  # anneal: every sampler anneals epsilon | apex: fixed per-sampler epsilons
    epsilon_start: float = 1.0  # anneal: epsilon at the first step
    epsilon_final: float = 0.05  # anneal: epsilon after epsilon_anneal_steps
    epsilon_anneal_steps: int = 20_000  # anneal: env steps of the whole run over which epsilon falls
    apex_epsilon: float = 0.4  # apex: sampler i of N acts with apex_epsilon ** (1 + apex_alpha * i / (N - 1))
    apex_alpha: float = 7.0  # apex: spread of the per-sampler epsilons
    adam_eps: float = 1.5e-4  # Adam epsilon


@dataclass
class APEXConfig(DQNConfig):
    """Ape-X DQN: many samplers with fixed epsilons feed prioritized shards; learners run free."""

    name: str = "apex"
    exploration: str = "apex"
    replay_ratio: Optional[float] = None
    n_step: int = 3
    batch_size: int = 512
    learning_starts: int = 20_000
    target_update_every: int = 2_500
    lr: float = 1e-4
    max_grad_norm: float = 40.0
    priority_beta: float = 0.4
    beta_anneal_updates: int = 50_000

"""DDPG, TD3 and Ape-X DDPG settings: the actor-critic, its targets, and exploration noise."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from walle_ray.algos.replay.config import ReplayConfig


@dataclass
class DDPGConfig(ReplayConfig):
    """Deterministic policy gradient over uniform replay (Lillicrap et al. 2016).

    Defaults follow the TD3 paper's DDPG re-implementation (Fujimoto et al. 2018): 1-step
    targets, batches of 256, one update per env step (``replay_ratio`` 256 transitions
    sampled per transition inserted), a buffer that keeps a whole benchmark run, no gradient
    clipping. ``learning_starts`` equals ``random_steps``, so with one memory actor learning
    begins as the random phase ends, as the paper's ``start_timesteps`` does.
    """

    name: str = "ddpg"  # shown in run names and metrics
    n_step: int = 1
    batch_size: int = 256
    capacity: int = 1_000_000
    learning_starts: int = 10_000
    prioritized: bool = False
    replay_ratio: Optional[float] = 256.0
    max_grad_norm: float = 0.0
    actor_lr: Optional[float] = None  # actor's learning rate (Adam); null: lr
    critic_lr: Optional[float] = None  # critics' learning rate (Adam); null: lr
    tau: float = 0.005  # Polyak factor of the target networks per target update
    twin_critics: bool = False  # two critics, targets from the smaller (TD3's clipped double Q)
    policy_delay: int = 1  # critic updates per actor and target update
    target_noise: float = 0.0  # std of the target-action smoothing noise, as a fraction of the half-range
    target_noise_clip: float = 0.5  # clip of that noise, as a fraction of the half-range
    exploration: str = "gaussian"  # gaussian: independent noise per step | ou: Ornstein-Uhlenbeck per env
    exploration_noise: float = 0.1  # std of the exploration noise, as a fraction of the half-range
    ou_theta: float = 0.15  # ou: pull of the noise back towards 0 per step
    random_steps: int = 10_000  # env steps of uniform random actions in all, split evenly over the samplers
    hidden: List[int] = field(default_factory=lambda: [256, 256])  # MLP widths of actor and critics
    activation: str = "relu"  # relu | tanh


@dataclass
class TD3Config(DDPGConfig):
    """TD3: twin critics, delayed actor updates and target-action smoothing."""

    name: str = "td3"
    twin_critics: bool = True
    policy_delay: int = 2
    target_noise: float = 0.2


@dataclass
class APEXDDPGConfig(DDPGConfig):
    """Ape-X DDPG (Horgan et al. 2018): prioritized shards, 3-step targets, free-running learners."""

    name: str = "apex_ddpg"
    prioritized: bool = True
    n_step: int = 3
    replay_ratio: Optional[float] = None

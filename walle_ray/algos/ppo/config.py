"""PPO settings (clipped objective, and WALL-E's adaptive KL penalty as ``algo=ppo_kl``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class PPOConfig:
    """Proximal policy optimisation, synchronous: collect a batch, then several epochs on it."""

    name: str = "ppo"  # shown in run names and metrics
    objective: str = "clip"  # clip: clipped surrogate | kl_penalty: adaptive KL penalty
    batch_size: int = 2048  # env steps per iteration, split across samplers and their envs
    minibatch_size: int = 64  # rows per gradient step
    epochs: int = 10  # passes over each batch
    lr: float = 3e-4  # Adam learning rate
    lr_schedule: str = "constant"  # constant | linear (to 0 at run.total_env_steps)
    adam_eps: float = 1e-5  # Adam epsilon
    gamma: float = 0.99  # discount
    gae_lambda: float = 0.95  # GAE trace decay
    clip: float = 0.2  # surrogate clip range (objective=clip)
    vf_clip: Optional[float] = None  # clip the value update around the behaviour value; None: off
    vf_coef: float = 0.5  # value loss weight
    ent_coef: float = 0.0  # entropy bonus weight
    max_grad_norm: float = 0.5  # global gradient-norm clip
    normalize_advantages: bool = True  # zero mean, unit std per minibatch
    kl_target: float = 0.01  # objective=kl_penalty: KL the penalty coefficient is adapted around
    kl_beta_init: float = 1.0  # objective=kl_penalty: initial penalty coefficient
    kl_early_stop: float = 4.0  # objective=kl_penalty: stop the epochs when KL > this x kl_target
    overlap: bool = False  # collect the next batch while the learner updates (policy lag 1)
    # torch.compile each minibatch's forward pass and loss: seconds of compiling at the first
    # update for cheaper gradient steps after (docs/performance.md, "Compiling PPO's step")
    compile: bool = False

"""IMPALA settings: V-trace, the optimizer, replay mixing, CLEAR and LASER."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class ReplaySpec:
    """One memory type in each memory actor, and its share of every learner batch."""

    # queue: on-policy FIFO, consumed once | uniform: replay buffer | elite, attentive:
    # replay buffers that rank candidates with the current policy (walle_ray/buffers/ranked.py)
    type: str = "queue"
    ratio: float = 1.0  # share of each update's rows (algo.batch_size); the ratios sum to 1
    # rows held, the whole run's, split across the memories; 0: four batches of its rows
    capacity: int = 0
    start_rows: int = 0  # rows held (the whole run's, split across memories) before it serves
    # elite and attentive only:
    dist_function: str = "ln_norm"  # ln_norm | cosine | kl (elite: KL of the policy's outputs)
    p: float = 2.0  # the order of ln_norm
    lambda_batch_multiplier: float = 1.0  # candidates drawn per row served (1: uniform)
    alpha_annealing_factor: float = 1.0  # the multiplier falls to 1 over this many runs
    reference_rows: int = 16  # attentive: the latest rows whose last states are the reference
    steps: int = 0  # steps of each row a distance reads, evenly spaced; 0: all (the cost: docs/replay.md)
    # which ranked candidates a batch keeps: nearest | spread | least_served |
    # least_served_in_group (the platform's strategy1 to strategy4; docs/replay.md)
    strategy: str = "nearest"
    replacement: bool = False  # draw the candidates with repeats, as the platform does


@dataclass
class IMPALAConfig:
    """Importance-weighted actor-learner: samplers and learners run asynchronously.

    The losses are means over the T x B steps of a batch, not sums as in the paper's code, so
    the optimizer defaults are those of mean-reduced actor-critics (A2C's RMSProp epsilon and
    gradient clip), not the paper's 0.01 and 40, which assume gradients T x B times larger.
    """

    name: str = "impala"  # shown in run names and metrics
    fragment_length: int = 20  # unroll length T of each fragment
    batch_size: int = 32  # rows (single-env trajectories of T steps) per learner update
    optimizer: str = "rmsprop"  # rmsprop | adam | amsgrad
    lr: float = 6e-4  # learning rate
    lr_schedule: str = "linear"  # constant | linear (to 0 at run.total_env_steps)
    rmsprop_alpha: float = 0.99  # RMSProp smoothing constant
    eps: float = 1e-5  # optimizer epsilon (added to RMSProp's root mean square)
    gamma: float = 0.99  # discount
    rho_bar: float = 1.0  # V-trace: truncation of the importance weights in the value targets
    c_bar: float = 1.0  # V-trace: truncation of the trace coefficients
    pg_rho_bar: float = 1.0  # V-trace: truncation of the policy-gradient importance weights
    vtrace_lambda: float = 1.0  # V-trace: extra trace decay
    baseline_coef: float = 0.5  # value loss weight
    ent_coef: float = 0.01  # entropy bonus weight
    max_grad_norm: float = 0.5  # global gradient-norm clip of the mean loss's gradient
    replay: List[ReplaySpec] = field(default_factory=lambda: [ReplaySpec()])  # memory mix
    clear_policy_coef: float = 0.0  # CLEAR: KL(behaviour || current) on replayed rows; 0: off
    clear_value_coef: float = 0.0  # CLEAR: (V - stored V)^2 on replayed rows; 0: off
    # LASER: drop steps whose KL(current || the policy V-trace evaluates) is above this; null: off
    laser_kl_threshold: Optional[float] = None
    fragments_per_call: int = 4  # fragments a sampler collects per driver call (reporting grain)
    updates_per_call: int = 8  # updates a learner runs per driver call (reporting grain)
    prefetch: int = 2  # batch requests each learner keeps in flight
    publish_every: int = 1  # learner updates between weight publishes to the samplers

"""Settings of the offline algorithms: behaviour cloning and MARWIL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class BCConfig:
    """Behaviour cloning: the policy that makes the recorded actions most likely."""

    name: str = "bc"  # shown in run names and metrics
    batch_size: int = 256  # recorded steps per update, split across the learners
    lr: float = 1e-3  # Adam's learning rate
    lr_schedule: str = "constant"  # constant | linear (to 0 at run.total_env_steps)
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0  # global gradient-norm clip; 0: off
    ent_coef: float = 0.0  # entropy bonus weight (keeps a Gaussian's spread from collapsing)
    updates_per_call: int = 50  # updates a learner runs per driver call (reporting grain)
    prefetch: int = 2  # batch requests each learner keeps in flight
    publish_every: int = 50  # updates between weight publishes (evaluation reads them)


@dataclass
class MARWILConfig(BCConfig):
    """Monotonic advantage re-weighted imitation learning (Wang et al. 2018): each recorded
    action's log-likelihood is weighted by exp(beta * A / c), A = R - V(s) from a value
    baseline learned on the same data, c the running root mean square of A. beta = 0 is BC."""

    name: str = "marwil"
    beta: float = 1.0  # advantage temperature; 0: behaviour cloning
    gamma: float = 0.99  # discount of the recorded returns R
    vf_coef: float = 1.0  # value loss weight
    # c^2 at the start; null: the first batch's mean A^2. RLlib's MARWIL starts at 100 and moves
    # at 1e-8 without a clip: algo.adv_norm_init=100 algo.adv_norm_rate=1e-8 algo.max_weight=null
    adv_norm_init: Optional[float] = None
    adv_norm_rate: float = 1e-3  # how fast c^2 follows the batches' mean A^2
    max_weight: Optional[float] = 20.0  # weights exp(beta * A / c) are clipped to this; null: no clip

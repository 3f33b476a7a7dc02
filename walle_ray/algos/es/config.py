"""ES settings: population, noise, step size, weight decay, the shared noise table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ESConfig:
    """Evolution strategies (Salimans et al. 2017): samplers evaluate antithetic Gaussian
    perturbations of the policy's parameters, the learner moves the parameters along the
    perturbations weighted by the centred ranks of their returns."""

    name: str = "es"  # shown in run names and metrics
    pairs: int = 32  # antithetic pairs (2 episodes each) per iteration, over all samplers
    noise_std: float = 0.02  # sigma: the perturbations' standard deviation
    lr: float = 0.01  # Adam's step size on the rank-weighted noise sum
    l2_coef: float = 0.005  # weight decay: l2_coef * theta is added to the step's gradient
    noise_size: int = 25_000_000  # floats in the shared noise table (100 MB at the default)
    noise_seed: int = 123  # the table's seed: the learner rebuilds the same table from it
    action_noise_std: float = 0.0  # Gaussian noise on continuous actions while evaluating

"""PPO losses on a 3-row batch whose numbers were worked out by hand."""

import math

import pytest
import torch

from walle_ray.algos.ppo.loss import adapt_kl_beta, ppo_clip_loss, ppo_kl_loss, value_loss

RHO = [1.5, 0.5, 1.1]
ADV = torch.tensor([1.0, -2.0, 0.5])
V = torch.tensor([1.0, 2.0, 3.0])
TARGET = torch.tensor([1.5, 2.0, 2.0])
ENTROPY = torch.tensor([0.5, 0.5, 0.8])
LOGP = torch.tensor([math.log(r) for r in RHO])
OLD_LOGP = torch.zeros(3)


def test_clipped_surrogate_by_hand():
    loss, terms = ppo_clip_loss(LOGP, OLD_LOGP, ADV, V, TARGET, ENTROPY, clip=0.2,
                                vf_coef=0.5, ent_coef=0.01)
    # min(rho A, clip(rho) A): 1.2, -1.6, 0.55 -> mean 0.05
    assert terms["policy_loss"].item() == pytest.approx(-0.05, abs=1e-6)
    # 0.5 * mean([0.25, 0, 1])
    assert terms["value_loss"].item() == pytest.approx(1.25 / 6, abs=1e-6)
    assert terms["entropy"].item() == pytest.approx(0.6, abs=1e-6)
    assert loss.item() == pytest.approx(-0.05 + 0.5 * 1.25 / 6 - 0.01 * 0.6, abs=1e-6)
    assert terms["clip_frac"].item() == pytest.approx(2 / 3)
    kl = sum((r - 1) - math.log(r) for r in RHO) / 3
    assert terms["approx_kl"].item() == pytest.approx(kl, abs=1e-6)


def test_clip_removes_the_gradient_of_clipped_rows():
    logp = LOGP.clone().requires_grad_(True)
    loss, _ = ppo_clip_loss(logp, OLD_LOGP, ADV, V, TARGET, ENTROPY, clip=0.2, vf_coef=0.0,
                            ent_coef=0.0)
    loss.backward()
    # rows 1 and 2 are clipped (their min picks the constant clipped term); row 3 is not
    assert logp.grad[0].item() == 0.0 and logp.grad[1].item() == 0.0
    assert logp.grad[2].item() == pytest.approx(-1.1 * 0.5 / 3, abs=1e-6)


def test_kl_penalty_by_hand():
    kl = torch.tensor([0.1, 0.2, 0.3])
    loss, terms = ppo_kl_loss(LOGP, OLD_LOGP, ADV, kl, V, TARGET, ENTROPY, beta=2.0,
                              vf_coef=0.5, ent_coef=0.01)
    # -mean(rho A) = -(1.5 - 1.0 + 0.55) / 3
    assert terms["policy_loss"].item() == pytest.approx(-0.35, abs=1e-6)
    assert terms["kl"].item() == pytest.approx(0.2, abs=1e-6)
    assert terms["kl_penalty"].item() == pytest.approx(0.4, abs=1e-6)
    assert loss.item() == pytest.approx(-0.35 + 0.4 + 0.5 * 1.25 / 6 - 0.006, abs=1e-6)


def test_clipped_value_loss_takes_the_pessimistic_error():
    old_v = torch.tensor([1.0, 1.5, 2.5])
    # clipped values 1.0, 1.7, 2.7 -> errors 0.25, 0.09, 0.49; max with 0.25, 0, 1
    assert value_loss(V, TARGET, old_v, 0.2).item() == pytest.approx(0.5 * 1.34 / 3, abs=1e-6)


@pytest.mark.parametrize("kl,want", [(0.02, 2.0), (0.005, 0.5), (0.01, 1.0)])
def test_kl_coefficient_adapts_around_target(kl, want):
    assert adapt_kl_beta(1.0, kl, 0.01) == want

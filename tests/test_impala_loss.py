"""IMPALA, CLEAR and LASER terms on hand-computed examples."""

import pytest
import torch

from walle_ray.algos.impala.loss import clear_loss, impala_loss, laser_mask

LOGP = torch.tensor([[-1.0, -2.0]])
ADV = torch.tensor([[2.0, -1.0]])
V = torch.tensor([[1.0, 0.0]])
VS = torch.tensor([[2.0, 1.0]])
ENT = torch.tensor([[0.5, 0.7]])


def test_actor_critic_terms_by_hand():
    loss, terms = impala_loss(LOGP, ENT, V, VS, ADV, baseline_coef=0.5, ent_coef=0.01)
    assert terms["policy_loss"].item() == pytest.approx(0.0)  # -mean(-2, 2)
    assert terms["value_loss"].item() == pytest.approx(0.5)  # 0.5 * mean(1, 1)
    assert loss.item() == pytest.approx(0.0 + 0.25 - 0.006)


def test_laser_mask_drops_far_off_policy_steps_from_the_loss():
    kl = torch.tensor([[0.1, 0.5]])
    mask = laser_mask(kl, 0.3)
    assert mask.tolist() == [[1.0, 0.0]]
    assert laser_mask(kl, None) is None
    loss, terms = impala_loss(LOGP, ENT, V, VS, ADV, baseline_coef=0.5, ent_coef=0.01, mask_t=mask)
    assert terms["policy_loss"].item() == pytest.approx(2.0)  # only -(-1 * 2) counts
    assert terms["value_loss"].item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx(2.0 + 0.25 - 0.006)


def test_clear_clones_policy_and_value_on_replayed_steps_only():
    kl = torch.tensor([[0.1, 0.2], [0.3, 0.4]])
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    stored = torch.tensor([[0.5, 2.0], [3.0, 3.0]])
    replayed = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    loss, terms = clear_loss(kl, v, stored, replayed, policy_coef=0.01, value_coef=0.005)
    assert terms["clear_policy"].item() == pytest.approx(0.2)  # mean(0.1, 0.3)
    assert terms["clear_value"].item() == pytest.approx(0.125)  # mean(0.25, 0)
    assert loss.item() == pytest.approx(0.01 * 0.2 + 0.005 * 0.125)


def test_clear_policy_gradient_pulls_towards_the_behaviour():
    from torch.distributions import Categorical, kl_divergence

    logits = torch.zeros(1, 1, 2, requires_grad=True)
    behaviour = torch.tensor([[[2.0, 0.0]]])
    kl = kl_divergence(Categorical(logits=behaviour), Categorical(logits=logits))
    loss, _ = clear_loss(kl, torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1),
                         policy_coef=1.0, value_coef=0.0)
    loss.backward()
    assert logits.grad[0, 0, 0] < 0 < logits.grad[0, 0, 1]  # raise the behaviour's favourite

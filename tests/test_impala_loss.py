"""IMPALA, CLEAR and LASER terms on hand-computed examples."""

import math

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


def test_laser_divergence_is_kl_from_pi_to_the_policy_vtrace_evaluates():
    """KL(pi || pi_rho), pi_rho ∝ min(rho_bar mu, pi) (Schmitt et al. 2020), worked by hand."""
    from walle_ray.models.heads import ActionHead, CategoricalHead, GaussianHead

    head = CategoricalHead(2)
    pi, mu = torch.tensor([[0.5, 0.5]]).log(), torch.tensor([[0.9, 0.1]]).log()
    # min(mu, pi) = [0.5, 0.1] -> pi_rho = [5/6, 1/6]
    want = 0.5 * math.log(0.5 / (5 / 6)) + 0.5 * math.log(0.5 / (1 / 6))
    assert head.implied_kl(pi, mu, 1.0).item() == pytest.approx(want, rel=1e-5)
    assert head.implied_kl(pi, pi, 1.0).item() == pytest.approx(0.0, abs=1e-6)
    # Behaviour mass above pi is truncated away: with rho_bar = 2, mu = [0.3, 0.7] covers
    # pi = [0.5, 0.5] (2 mu >= pi everywhere), so V-trace evaluates pi itself.
    assert head.implied_kl(pi, torch.tensor([[0.3, 0.7]]).log(), 2.0).item() == pytest.approx(0.0, abs=1e-6)
    assert head.kl(torch.tensor([[0.3, 0.7]]).log(), pi).item() > 0.05  # KL(mu || pi) is not
    # The sampled estimate (continuous heads) agrees with the exact sum.
    torch.manual_seed(0)
    logits_pi, logits_mu = torch.randn(4, 5), torch.randn(4, 5)
    exact = CategoricalHead(5).implied_kl(logits_pi, logits_mu, 1.0)
    sampled = ActionHead.implied_kl(CategoricalHead(5), logits_pi, logits_mu, 1.0, samples=200_000)
    torch.testing.assert_close(sampled, exact, rtol=0.02, atol=0.005)
    gauss = GaussianHead(2)
    same = torch.tensor([[0.1, -0.2, -0.5, 0.0]])
    assert gauss.implied_kl(same, same, 1.0).abs().item() < 1e-6


def test_the_entropy_bonus_averages_over_the_steps_learned_from():
    """``learn_t`` (burn-in) leaves steps out of the entropy's mean, not only the policy's."""
    from walle_ray.algos.impala.loss import impala_loss

    zeros = torch.zeros(2, 2)
    entropy_t = torch.tensor([[1.0, 1.0], [3.0, 3.0]])
    learn_t = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    _, terms = impala_loss(zeros, entropy_t, zeros, zeros, zeros, baseline_coef=0.5,
                           ent_coef=0.01, mask_t=learn_t, learn_t=learn_t)
    assert terms["entropy"].item() == pytest.approx(7 / 3)
    _, terms = impala_loss(zeros, entropy_t, zeros, zeros, zeros, baseline_coef=0.5, ent_coef=0.01)
    assert terms["entropy"].item() == pytest.approx(2.0)

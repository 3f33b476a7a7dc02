"""V-trace against a slow reference loop and against n-step returns on-policy."""

import numpy as np
import pytest
import torch

from walle_ray.ops import vtrace


def reference_vtrace(log_rho, r, v, boot, term, trunc, final_v, gamma, rho_bar, c_bar, pg_bar,
                     lam=1.0, mask=None):
    """Per env, per step, from the paper's definition with episode ends cutting the sums;
    ``lam`` scales every trace coefficient c; a masked step (LASER) has rho = c = 0."""
    T, B = r.shape
    vs = np.zeros((T, B))
    adv = np.zeros((T, B))
    keep = np.ones((T, B)) if mask is None else mask
    rho = np.exp(log_rho)

    def v_next(t, b, values):
        if term[t, b]:
            return 0.0
        if trunc[t, b]:
            return final_v[t, b]
        return values[t + 1, b] if t + 1 < T else boot[b]

    for b in range(B):
        for s in range(T):
            total, c_prod = v[s, b], 1.0
            for t in range(s, T):
                rho_t = min(rho_bar, rho[t, b]) * keep[t, b]
                disc = 0.0 if term[t, b] else gamma
                delta = rho_t * (r[t, b] + disc * v_next(t, b, v) - v[t, b])
                total += (gamma ** (t - s)) * c_prod * delta
                if term[t, b] or trunc[t, b]:
                    break
                c_prod *= lam * min(c_bar, rho[t, b]) * keep[t, b]
            vs[s, b] = total
        for t in range(T):
            disc = 0.0 if term[t, b] else gamma
            adv[t, b] = min(pg_bar, rho[t, b]) * keep[t, b] * (r[t, b] + disc * v_next(t, b, vs) - v[t, b])
    return vs, adv


def sample(seed, T=9, B=4, both=False):
    """Random inputs; with ``both`` some steps are terminal and truncated at once (a time
    limit reached on the terminal step: no bootstrap)."""
    rng = np.random.default_rng(seed)
    term = rng.random((T, B)) < 0.15
    trunc = rng.random((T, B)) < 0.1
    trunc = trunc | term & (rng.random((T, B)) < 0.5) if both else trunc & ~term
    return dict(log_rho=rng.normal(0, 0.7, (T, B)), r=rng.normal(size=(T, B)),
                v=rng.normal(size=(T, B)), boot=rng.normal(size=B), term=term, trunc=trunc,
                final_v=np.where(trunc, rng.normal(size=(T, B)), 0.0))


def run(d, gamma, rho_bar, c_bar, pg_bar, lam=1.0, mask=None):
    t = {k: torch.as_tensor(v) for k, v in d.items()}
    return vtrace(t["log_rho"], t["r"], t["v"], t["boot"], t["term"], t["trunc"], t["final_v"],
                  gamma, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_bar, lam=lam,
                  mask_t=None if mask is None else torch.as_tensor(mask))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("lam", [0.0, 0.5, 0.9])
def test_lambda_below_one_matches_reference_loop(seed, lam):
    d = sample(seed, both=True)
    assert (d["term"] & d["trunc"]).any() and (d["trunc"] & ~d["term"]).any()
    out = run(d, 0.95, 1.0, 0.8, 1.0, lam=lam)
    vs, adv = reference_vtrace(d["log_rho"], d["r"], d["v"], d["boot"], d["term"], d["trunc"],
                               d["final_v"], 0.95, 1.0, 0.8, 1.0, lam=lam)
    np.testing.assert_allclose(out.vs_t.numpy(), vs, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(out.pg_adv_t.numpy(), adv, rtol=1e-6, atol=1e-8)


def test_terminal_and_truncated_step_does_not_bootstrap():
    T, B, gamma = 2, 1, 0.9
    yes = torch.tensor([[True], [False]])
    out = vtrace(torch.zeros(T, B), torch.tensor([[1.0], [2.0]]), torch.tensor([[0.5], [0.5]]),
                 torch.tensor([9.0]), yes, yes, torch.tensor([[100.0], [0.0]]), gamma)
    assert out.vs_t[0, 0].item() == pytest.approx(1.0)  # neither 100 (final) nor v_1 flows in
    assert out.pg_adv_t[0, 0].item() == pytest.approx(1.0 - 0.5)


@pytest.mark.parametrize("seed", range(3))
def test_masked_steps_cut_the_trace_of_earlier_steps(seed):
    d = sample(seed, both=True)
    mask = (np.random.default_rng(seed + 10).random(d["r"].shape) > 0.3).astype(np.float64)
    out = run(d, 0.95, 1.0, 1.0, 1.0, lam=0.9, mask=mask)
    vs, adv = reference_vtrace(d["log_rho"], d["r"], d["v"], d["boot"], d["term"], d["trunc"],
                               d["final_v"], 0.95, 1.0, 1.0, 1.0, lam=0.9, mask=mask)
    np.testing.assert_allclose(out.vs_t.numpy(), vs, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(out.pg_adv_t.numpy(), adv, rtol=1e-6, atol=1e-8)


def test_masking_a_middle_step_stops_the_earlier_target_at_its_value():
    # On-policy, no episode end: unmasked, v_0's target sums all three rewards; with step 1
    # masked it is r_0 + gamma * v_1, and step 1 itself keeps its value as the target.
    T, B, gamma = 3, 1, 0.5
    r = torch.tensor([[1.0], [2.0], [4.0]])
    v = torch.tensor([[0.0], [3.0], [0.0]])
    no = torch.zeros(T, B, dtype=torch.bool)
    args = (torch.zeros(T, B), r, v, torch.tensor([8.0]), no, no, torch.zeros(T, B), gamma)
    full = vtrace(*args)
    assert full.vs_t[0, 0].item() == pytest.approx(1 + 0.5 * 2 + 0.25 * 4 + 0.125 * 8)
    masked = vtrace(*args, mask_t=torch.tensor([[1.0], [0.0], [1.0]]))
    assert masked.vs_t[0, 0].item() == pytest.approx(1 + 0.5 * 3.0)
    assert masked.vs_t[1, 0].item() == pytest.approx(3.0) and masked.pg_adv_t[1, 0].item() == 0.0
    assert masked.vs_t[2, 0].item() == pytest.approx(4 + 0.5 * 8)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("bars", [(1.0, 1.0, 1.0), (0.8, 0.5, 2.0), (10.0, 10.0, 10.0)])
def test_matches_reference_loop(seed, bars):
    d = sample(seed)
    out = run(d, 0.95, *bars)
    vs, adv = reference_vtrace(d["log_rho"], d["r"], d["v"], d["boot"], d["term"], d["trunc"],
                               d["final_v"], 0.95, *bars)
    np.testing.assert_allclose(out.vs_t.numpy(), vs, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(out.pg_adv_t.numpy(), adv, rtol=1e-6, atol=1e-8)


def test_on_policy_equals_n_step_bootstrapped_return():
    T, B, gamma = 6, 3, 0.9
    rng = np.random.default_rng(1)
    r, v, boot = rng.normal(size=(T, B)), rng.normal(size=(T, B)), rng.normal(size=B)
    no = np.zeros((T, B), bool)
    out = run(dict(log_rho=np.zeros((T, B)), r=r, v=v, boot=boot, term=no, trunc=no,
                   final_v=np.zeros((T, B))), gamma, 1.0, 1.0, 1.0)
    for t in range(T):
        n_step = sum(gamma ** (k - t) * r[k] for k in range(t, T)) + gamma ** (T - t) * boot
        np.testing.assert_allclose(out.vs_t[t].numpy(), n_step, rtol=1e-10)


def test_terminal_step_target_is_reward_and_mask_zeroes_advantage():
    T, B = 3, 1
    r = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
    v = torch.zeros(T, B, dtype=torch.float64)
    term = torch.tensor([[False], [True], [False]])
    no = torch.zeros(T, B, dtype=torch.bool)
    out = vtrace(torch.zeros(T, B, dtype=torch.float64), r, v, torch.tensor([5.0], dtype=torch.float64),
                 term, no, torch.zeros(T, B, dtype=torch.float64), 0.5)
    assert out.vs_t[1, 0].item() == pytest.approx(2.0)
    assert out.vs_t[0, 0].item() == pytest.approx(1.0 + 0.5 * 2.0)
    assert out.vs_t[2, 0].item() == pytest.approx(3.0 + 0.5 * 5.0)
    mask = torch.tensor([[1.0], [0.0], [1.0]], dtype=torch.float64)
    masked = vtrace(torch.zeros(T, B, dtype=torch.float64), r, v, torch.tensor([5.0], dtype=torch.float64),
                    term, no, torch.zeros(T, B, dtype=torch.float64), 0.5, mask_t=mask)
    assert masked.pg_adv_t[1, 0].item() == 0.0 and masked.vs_t[1, 0].item() == 0.0

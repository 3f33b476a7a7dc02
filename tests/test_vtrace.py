"""V-trace against a slow reference loop and against n-step returns on-policy."""

import numpy as np
import pytest
import torch

from walle_ray.ops import vtrace


def reference_vtrace(log_rho, r, v, boot, term, trunc, final_v, gamma, rho_bar, c_bar, pg_bar):
    """Per env, per step, from the paper's definition with episode ends cutting the sums."""
    T, B = r.shape
    vs = np.zeros((T, B))
    adv = np.zeros((T, B))
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
                rho_t = min(rho_bar, rho[t, b])
                disc = 0.0 if term[t, b] else gamma
                delta = rho_t * (r[t, b] + disc * v_next(t, b, v) - v[t, b])
                total += (gamma ** (t - s)) * c_prod * delta
                if term[t, b] or trunc[t, b]:
                    break
                c_prod *= min(c_bar, rho[t, b])
            vs[s, b] = total
        for t in range(T):
            disc = 0.0 if term[t, b] else gamma
            adv[t, b] = min(pg_bar, rho[t, b]) * (r[t, b] + disc * v_next(t, b, vs) - v[t, b])
    return vs, adv


def sample(seed, T=9, B=4):
    rng = np.random.default_rng(seed)
    term = rng.random((T, B)) < 0.15
    trunc = (rng.random((T, B)) < 0.1) & ~term
    return dict(log_rho=rng.normal(0, 0.7, (T, B)), r=rng.normal(size=(T, B)),
                v=rng.normal(size=(T, B)), boot=rng.normal(size=B), term=term, trunc=trunc,
                final_v=np.where(trunc, rng.normal(size=(T, B)), 0.0))


def run(d, gamma, rho_bar, c_bar, pg_bar):
    t = {k: torch.as_tensor(v) for k, v in d.items()}
    return vtrace(t["log_rho"], t["r"], t["v"], t["boot"], t["term"], t["trunc"], t["final_v"],
                  gamma, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_bar)


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

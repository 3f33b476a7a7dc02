"""GAE against a slow reference loop, across terminal, truncated and fragment edges."""

import numpy as np
import pytest

from walle_ray.ops import gae, next_values


def reference_gae(r, v, last_v, term, trunc, final_v, gamma, lam):
    """One env at a time, one step at a time, the textbook way."""
    T, B = r.shape
    adv = np.zeros((T, B))
    for b in range(B):
        running = 0.0
        for t in reversed(range(T)):
            if term[t, b]:
                nxt, cont = 0.0, 0.0
            elif trunc[t, b]:
                nxt, cont = final_v[t, b], 0.0
            else:
                nxt = v[t + 1, b] if t + 1 < T else last_v[b]
                cont = 1.0
            delta = r[t, b] + gamma * nxt - v[t, b]
            running = delta + gamma * lam * cont * running
            adv[t, b] = running
    return adv


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_reference_loop(seed):
    rng = np.random.default_rng(seed)
    T, B = 17, 5
    r = rng.normal(size=(T, B)).astype(np.float32)
    v = rng.normal(size=(T, B)).astype(np.float32)
    last_v = rng.normal(size=B).astype(np.float32)
    term = rng.random((T, B)) < 0.1
    trunc = (rng.random((T, B)) < 0.1) & ~term
    final_v = np.where(trunc, rng.normal(size=(T, B)), 0).astype(np.float32)
    v_tp1 = next_values(v, last_v, trunc, final_v)
    adv, target = gae(r, v, v_tp1, term, trunc, 0.97, 0.9)
    want = reference_gae(r, v, last_v, term, trunc, final_v, 0.97, 0.9)
    np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(target, want + v, rtol=1e-5, atol=1e-5)


def test_terminal_step_target_is_the_reward():
    r = np.array([[1.0], [2.0]], np.float32)
    v = np.array([[0.5], [0.7]], np.float32)
    term = np.array([[False], [True]])
    trunc = np.zeros_like(term)
    v_tp1 = next_values(v, np.array([100.0], np.float32), trunc, np.zeros_like(v))
    adv, target = gae(r, v, v_tp1, term, trunc, 0.9, 1.0)
    assert target[1, 0] == pytest.approx(2.0)  # no bootstrap from the next (new) episode
    assert adv[0, 0] == pytest.approx(1.0 + 0.9 * 0.7 - 0.5 + 0.9 * (2.0 - 0.7))


def test_truncated_step_bootstraps_from_its_final_observation():
    r = np.array([[1.0], [1.0]], np.float32)
    v = np.array([[0.0], [0.0]], np.float32)
    trunc = np.array([[True], [False]])
    term = np.zeros_like(trunc)
    final_v = np.array([[10.0], [0.0]], np.float32)
    v_tp1 = next_values(v, np.array([3.0], np.float32), trunc, final_v)
    adv, _ = gae(r, v, v_tp1, term, trunc, 0.5, 1.0)
    assert adv[0, 0] == pytest.approx(1.0 + 0.5 * 10.0)  # final obs value, trace cut
    assert adv[1, 0] == pytest.approx(1.0 + 0.5 * 3.0)  # fragment edge bootstraps from last_v


def test_lambda_one_no_ends_is_discounted_return_minus_value():
    T = 6
    r = np.ones((T, 1), np.float32)
    v = np.zeros((T, 1), np.float32)
    no = np.zeros((T, 1), bool)
    v_tp1 = next_values(v, np.array([2.0], np.float32), no, np.zeros_like(v))
    adv, _ = gae(r, v, v_tp1, no, no, 0.9, 1.0)
    want = sum(0.9 ** k for k in range(T)) + 0.9 ** T * 2.0
    assert adv[0, 0] == pytest.approx(want, rel=1e-5)

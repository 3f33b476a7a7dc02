"""The replay sampler's n-step transitions against a reference loop, across episode ends."""

import numpy as np
import pytest
from omegaconf import OmegaConf

from walle_ray.actors.sampler import Sampler
from walle_ray.algos.replay import replay_sampler_args
from walle_ray.algos.dqn.config import DQNConfig
from walle_ray.config import EnvConfig, ModelConfig

LENGTH = 5  # CountingEnv: obs = step in episode, reward 1 per step, ends after LENGTH steps
GAMMA = 0.5


class FixedExplorer:
    """Always action 1; priority = the transition's reward, so the test can see it passed."""

    def __init__(self, obs_space, action_space, cfg, index, num_samplers, seed, greedy=False):
        self.steps_seen = []

    def set_weights(self, weights):
        pass

    def act(self, obs, env_steps):
        self.steps_seen.append(env_steps)
        return np.ones(len(obs), np.int64)

    def td_error(self, obs, action, reward, discount, next_obs):
        return reward.copy()

    def stats(self):
        return {"epsilon": 0.0}


def reference(n: int, truncate: bool) -> list[tuple[float, float, float, float]]:
    """(obs, reward, discount, next_obs) of each step of one episode, computed one by one."""
    out = []
    for s in range(LENGTH):
        k = min(n, LENGTH - s)
        reward = sum(GAMMA ** i for i in range(k))
        if s + k < LENGTH:
            out.append((s, reward, GAMMA ** n, s + n))
        elif truncate:
            out.append((s, reward, GAMMA ** k, LENGTH))  # bootstrap from the final observation
        else:
            out.append((s, reward, 0.0, None))  # terminal: nothing to bootstrap from
    return out


def make(n: int, truncate: bool, T: int, envs: int = 2) -> Sampler:
    env = EnvConfig(name="counting", id="walle/Counting-v0", envs_per_sampler=envs,
                    kwargs={"length": LENGTH, "truncate": truncate})
    algo = OmegaConf.to_object(OmegaConf.structured(DQNConfig(n_step=n, gamma=GAMMA)))
    return Sampler(*replay_sampler_args(env, ModelConfig(), algo, FixedExplorer, T, index=0,
                                        num_samplers=1))


@pytest.mark.parametrize("truncate", [False, True])
@pytest.mark.parametrize("n,T", [(1, 4), (3, 4), (3, 7), (6, 3)])
def test_n_step_transitions_match_reference(n, T, truncate):
    sampler = make(n, truncate, T)
    sampler.set_weights({}, version=2)
    got = []
    for _ in range(6):
        batch, stats = sampler.collect()
        batch.check()
        assert stats["transitions"] == batch.num_steps and stats["env_steps"] == 2 * T
        assert (batch.version_b == 2).all() and batch.action.dtype == np.int64
        np.testing.assert_allclose(batch.priority, batch.reward)
        got += list(zip(batch.obs[:, 0], batch.reward, batch.discount, batch.next_obs[:, 0]))
    episodes = 6 * T // LENGTH
    want = reference(n, truncate)
    # Both envs run in lockstep, so each transition appears twice; order within a step may vary.
    per_env = {}
    for obs, reward, discount, next_obs in got:
        per_env.setdefault(int(obs), []).append((reward, discount, next_obs))
    for obs, reward, discount, next_obs in want:
        rows = per_env[obs]
        assert len(rows) >= 2 * episodes
        for r, d, nxt in rows:
            assert r == pytest.approx(reward) and d == pytest.approx(discount)
            if next_obs is not None:
                assert nxt == next_obs
    # Nothing is emitted before its n rewards (or its episode's end) are in.
    total_steps = 2 * 6 * T
    assert len(got) <= total_steps and len(got) >= total_steps - 2 * (n - 1)


def test_explorer_sees_this_samplers_step_count():
    sampler = make(3, False, T=4, envs=3)
    sampler.collect()
    sampler.collect()
    assert sampler.policy.explorer.steps_seen == [0, 3, 6, 9, 12, 15, 18, 21]

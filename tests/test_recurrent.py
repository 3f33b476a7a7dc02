"""Recurrent policies (model.core): the state a sampler carries and stores, the learner's
unroll against the sampler's own outputs, and a memory task only a recurrent policy solves."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from walle_ray.algos.spec import fragment_sampler
from walle_ray.config import EnvConfig, ModelConfig
from walle_ray.envs.testing import register_test_envs
from walle_ray.models.policy import ActorCritic, Core

from conftest import make_cfg, make_learner, run_cli

register_test_envs()


def sampler(core="lstm", env_id="walle/Counting-v0", envs=2, steps=5, bf16="auto", **env_kwargs):
    """A policy-gradient sampler with a small recurrent model, ``steps`` per fragment."""
    env = EnvConfig(id=env_id, envs_per_sampler=envs, kwargs=env_kwargs)
    model = ModelConfig(hidden=[8], core=core, core_size=6, bf16=bf16)
    return fragment_sampler(env, model, steps, 0.99, 0, 0)


def random_weights(s, seed=0):
    torch.manual_seed(seed)
    weights = {k: np.random.default_rng(seed).normal(0, 0.5, v.shape).astype(np.float32)
               for k, v in s.policy.model.get_weights().items()}
    s.set_weights(weights, 0)
    return weights


def test_each_fragment_stores_the_state_the_last_one_left_zero_after_an_episode_end():
    s = sampler(steps=5, envs=1, length=10)  # an episode ends with every second fragment
    random_weights(s)
    first, _ = s.collect()
    assert first.state_b.shape == (1, 12) and not first.state_b.any()  # zeros at the start
    after_first = s.policy.core_state(1)
    assert after_first.any()
    second, _ = s.collect()  # steps 5..9: the episode of 10 steps ends at its last step
    np.testing.assert_array_equal(second.state_b, after_first)
    assert second.terminated_t[-1, 0]
    third, _ = s.collect()
    assert not third.state_b.any()  # reset after the episode's end


def test_the_learners_unroll_reproduces_the_samplers_outputs():
    s = sampler(steps=16, envs=3, length=10)  # an episode ends inside the fragment
    weights = random_weights(s)
    s.collect()
    rollout, _ = s.collect()
    assert rollout.state_b.any() and rollout.first_t().any()
    model = ActorCritic(s.env.observation_space, s.env.action_space,
                        ModelConfig(hidden=[8], core="lstm", core_size=6))
    model.set_weights(weights)
    with torch.no_grad():
        params, v, states = model.unroll(torch.as_tensor(rollout.obs_t),
                                         torch.as_tensor(rollout.state_b),
                                         torch.as_tensor(rollout.first_t()))
        logp = model.head.dist(params).log_prob(torch.as_tensor(rollout.action_t))
    np.testing.assert_allclose(logp.numpy(), rollout.logp_t, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v.numpy(), rollout.v_t, rtol=1e-5, atol=1e-6)
    # The bootstrap value: the state after the last step, zeroed where an episode ended.
    done = rollout.terminated_t[-1] | rollout.truncated_t[-1]
    last_state = states[-1] * torch.as_tensor(~done)[:, None]
    with torch.no_grad():
        last_v = model.step(torch.as_tensor(rollout.last_obs), last_state)[1]
    np.testing.assert_allclose(last_v.numpy(), rollout.last_v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bf16, tolerance", [(False, 1e-5), (True, 2e-2)])
def test_a_conv_torso_with_a_core_unrolls_as_it_acted(bf16, tolerance):
    """Frames through the conv torso into a GRU, in float32 and under bfloat16 autocast
    (where the torso's batch of T x B frames may round differently from one step's)."""
    s = sampler(core="gru", env_id="walle/Frames-v0", steps=12, length=8, num_actions=3,
                size=42, bf16=bf16)
    model = s.policy.model
    weights = random_weights(s)
    s.collect()
    rollout, _ = s.collect()
    assert rollout.state_b.shape == (2, 6) and rollout.first_t().any()
    model.set_weights(weights)
    with torch.no_grad():
        params, v, _ = model.unroll(torch.as_tensor(rollout.obs_t), torch.as_tensor(rollout.state_b),
                                    torch.as_tensor(rollout.first_t()))
        logp = model.head.dist(params).log_prob(torch.as_tensor(rollout.action_t))
    np.testing.assert_allclose(logp.numpy(), rollout.logp_t, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(v.numpy(), rollout.v_t, rtol=tolerance, atol=tolerance)


def test_truncated_episodes_are_valued_from_their_own_state():
    s = sampler(steps=16, envs=2, length=10, truncate=True)
    weights = random_weights(s)
    rollout, _ = s.collect()
    assert rollout.truncated_t.any()
    model = ActorCritic(s.env.observation_space, s.env.action_space,
                        ModelConfig(hidden=[8], core="lstm", core_size=6))
    model.set_weights(weights)
    with torch.no_grad():
        _, _, states = model.unroll(torch.as_tensor(rollout.obs_t), torch.as_tensor(rollout.state_b),
                                    torch.as_tensor(rollout.first_t()))
        final_v = model.step(torch.as_tensor(rollout.final_obs),
                             states[torch.as_tensor(rollout.truncated_t)])[1]
    np.testing.assert_allclose(final_v.numpy(), rollout.final_v_t[rollout.truncated_t],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_core_forgets_its_state_where_an_episode_starts(kind):
    core = Core(kind, 4, 3)
    x_t = torch.randn(5, 2, 4)
    state = torch.randn(2, core.state_size)
    first_t = torch.zeros(5, 2, dtype=torch.bool)
    first_t[3, 1] = True
    out_t, states_t = core.unroll(x_t, state, first_t)
    # Column 1 from step 3 on equals a fresh unroll of its last two steps from zeros.
    fresh, _ = core.unroll(x_t[3:, 1:], torch.zeros(1, core.state_size),
                           torch.zeros(2, 1, dtype=torch.bool))
    torch.testing.assert_close(out_t[3:, 1:], fresh)
    assert states_t.shape == (5, 2, core.state_size)


def test_a_recurrent_model_refuses_a_stateless_forward():
    s = sampler()
    with pytest.raises(TypeError, match="step"):
        s.policy.model(torch.zeros(2, 1))


@pytest.mark.parametrize("overrides, message", [
    (["model.core=rnn"], "model.core: got 'rnn'"),
    (["algo=dqn", "env=cartpole", "model.core=lstm"], "algo=dqn has no recurrent networks"),
    (["model.burn_in=4"], "model.burn_in: applies to a recurrent core"),
    (["model.core=lstm", "model.core_size=0"], "model.core_size: must be positive"),
    (["algo=impala", "model.core=lstm", "model.burn_in=4"], "algo=impala replays none"),
    (["algo=impala", "model.core=lstm", "model.burn_in=20", "algo.fragment_length=20",
      "algo.replay=[{type: queue, ratio: 0.5}, {type: uniform, ratio: 0.5}]"],
     "leaves no step of a 20-step fragment"),
])
def test_bad_core_settings_are_refused(overrides, message):
    from walle_ray.algos import validate
    from walle_ray.config import ConfigError

    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        validate(make_cfg(*overrides))


def recall_return(tmp_path, *overrides) -> float:
    run_cli(*overrides, "env.id=walle/Recall-v0", "env.name=recall",
            "run.stop_at_return=0.9", "run.return_window=100", f"hydra.run.dir={tmp_path}",
            timeout=600)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return records[-1]["return"]


RECALL_PPO = ["algo=ppo", "topology=2a1m1l", "env.envs_per_sampler=8", "algo.batch_size=512",
              "algo.minibatch_size=128", "algo.epochs=4", "algo.lr=3e-3", "algo.ent_coef=0.01",
              "model.hidden=[32]", "run.total_env_steps=150000"]


RECALL_IMPALA = ["algo=impala", "topology=2a1m1l", "env.envs_per_sampler=4",
                 "algo.fragment_length=12", "algo.batch_size=16", "algo.optimizer=adam",
                 "algo.lr=2e-3", "algo.eps=1e-8", "algo.lr_schedule=constant", "model.hidden=[32]",
                 "run.total_env_steps=200000"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", [RECALL_PPO, RECALL_IMPALA], ids=["ppo", "impala"])
def test_an_lstm_remembers_what_a_feed_forward_policy_cannot(tmp_path, algo):
    """Recall shows its cue 5 steps before it asks for it: an LSTM policy learns to answer
    (return 1), a feed-forward one cannot do better than chance (return 0)."""
    assert recall_return(tmp_path / "lstm", *algo, "model.core=lstm", "model.core_size=32") >= 0.9
    # The control's outcome owes nothing to the topology: it runs in one process.
    control = [a for a in algo if not a.startswith("topology=")]
    assert recall_return(tmp_path / "mlp", *control, "topology=local",
                         "run.total_env_steps=20000") < 0.5
    # Evaluation and load_policy keep the state through each episode (of the weights that
    # reached the target: the resumed run below trains them further).
    import walle_ray

    assert walle_ray.evaluate(tmp_path / "lstm", episodes=10)["return_mean"] >= 0.8
    policy = walle_ray.load_policy(tmp_path / "lstm")
    correct = 0
    for cue in (0, 1) * 5:
        policy.reset()
        obs = np.zeros((1, 3), np.float32)
        obs[0, cue] = 1.0
        for _ in range(5):  # the cue, then the empty steps
            policy.act(obs)
            obs = np.zeros((1, 3), np.float32)
        obs[0, 2] = 1.0  # the question
        correct += int(policy.act(obs)[0] == cue)
    assert correct >= 8
    if "algo=impala" in algo:  # a recurrent run resumes (its samplers start from zero states)
        steps = json.loads((tmp_path / "lstm" / "metrics.jsonl").read_text().splitlines()[-1])["env_steps"]
        out = run_cli(f"run.resume={tmp_path / 'lstm'}", "run.stop_at_return=null",
                      f"run.total_env_steps={steps + 2048}", timeout=300).stdout
        assert f"resumed at {steps} env steps" in out


def impala_learner(burn_in: int):
    cfg = make_cfg("algo=impala", "env.id=walle/Counting-v0", "+env.kwargs.length=10",
                   "model.hidden=[8]", "model.core=lstm", "model.core_size=6",
                   f"model.burn_in={burn_in}", "algo.rho_bar=1e9", "algo.c_bar=1e9",
                   "algo.ent_coef=0.5", "algo.clear_policy_coef=1.0", "algo.clear_value_coef=1.0")
    return make_learner(cfg)


def replayed_rollout():
    s = sampler(steps=8, envs=4, length=10)
    random_weights(s)
    s.collect()
    rollout, _ = s.collect()
    rollout.replayed_b[:2] = True  # rows 0 and 1 come from a replay buffer
    return rollout


@pytest.mark.parametrize("burn_in, teaches", [(3, False), (0, True)])
def test_burned_in_steps_of_replayed_rows_teach_nothing(burn_in, teaches):
    """With model.burn_in=3 the first 3 steps of replayed rows only warm the state up: what
    their rewards, stored behaviour and values say changes nothing in the update, through
    V-trace, the entropy bonus or CLEAR (it would without burn-in)."""
    rollout = replayed_rollout()
    changed = {}
    for name in ("reward_t", "dist_t", "v_t"):
        value = getattr(rollout, name).copy()
        value[:3, :2] += 5.0
        changed[name] = value
    other = dataclasses.replace(rollout, **changed)
    weights = []
    for batch in (rollout, other):
        learner = impala_learner(burn_in)
        metrics = learner.update([batch], 0)
        weights.append(learner.model.get_weights())
    if burn_in:
        assert metrics["burn_in_frac"] == pytest.approx(3 * 2 / (8 * 4))
    same = all(np.array_equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert same != teaches


def test_the_mean_importance_weight_is_over_the_steps_learned_from():
    """A batch played by the learner's own weights has every importance weight 1; burned-in
    steps are not learned from, so they do not pull ``rho_mean`` below it."""
    learner = impala_learner(3)
    s = sampler(steps=8, envs=4, length=10)
    s.set_weights(learner.model.get_weights(), 0)
    s.collect()
    rollout, _ = s.collect()
    rollout.replayed_b[:2] = True
    metrics = learner.update([rollout], 0)
    assert metrics["burn_in_frac"] > 0 and metrics["rho_mean"] == pytest.approx(1.0, abs=1e-4)


def test_burned_in_steps_leave_the_entropy_and_clear_means():
    """R2D2 drops burn-in steps from the loss: the entropy bonus and CLEAR's cloning average
    over the steps that are learned from, so neither is diluted by the burned-in ones."""
    import torch

    rollout = replayed_rollout()
    reference = impala_learner(3)  # the same start: its unroll gives the update's outputs
    t = lambda x: torch.as_tensor(np.asarray(x))  # noqa: E731
    with torch.no_grad():
        params_t, v_t, _, _, burn_t = reference.update_rule._unroll(rollout, t)
        head = reference.model.head
        entropy_t = head.dist(params_t).entropy()
        kl_t = head.kl(t(rollout.dist_t), params_t)
    cloned_t = burn_t * t(rollout.replayed_b).float().expand_as(burn_t)
    metrics = impala_learner(3).update([rollout], 0)
    assert burn_t.mean() < 1  # some steps are burned in
    assert metrics["entropy"] == pytest.approx(float((entropy_t * burn_t).sum() / burn_t.sum()),
                                               rel=1e-5)
    assert metrics["clear_policy"] == pytest.approx(float((kl_t * cloned_t).sum() / cloned_t.sum()),
                                                    rel=1e-5)
    clear_value = ((v_t - t(rollout.v_t)) ** 2 * cloned_t).sum() / cloned_t.sum()
    assert metrics["clear_value"] == pytest.approx(float(clear_value), rel=1e-5)


def test_sequences_unrolled_from_their_start_states_give_the_full_unroll():
    """``chunk_sequences``: each sequence's start state is the full unroll's state there, so
    unrolling the sequences gives the full unroll's outputs step for step; 10 steps in
    sequences of 4 pad the last one, and the padding is masked out."""
    from walle_ray.algos.ppo.update import chunk_sequences

    s = sampler(steps=10, envs=3, length=4)
    random_weights(s)
    s.collect()
    rollout, _ = s.collect()
    model = s.policy.model
    obs_t, first_t = torch.as_tensor(rollout.obs_t), torch.as_tensor(rollout.first_t())
    state_b = torch.as_tensor(rollout.state_b)
    with torch.no_grad():
        params_t, v_t, _ = model.unroll(obs_t, state_b, first_t)
        starts, valid, (obs_c, first_c, params_c, v_c) = chunk_sequences(
            model, state_b, 4, obs_t, first_t, params_t, v_t)
        params_s, v_s, _ = model.unroll(obs_c, starts, first_c)
    assert obs_c.shape[:2] == (4, 3 * 3) and int(valid.sum()) == 10 * 3
    assert not valid[2:, 2].any() and valid[:2, 2].all()  # column 0's third sequence: 2 real steps
    torch.testing.assert_close(params_s[valid], params_c[valid])
    torch.testing.assert_close(v_s[valid], v_c[valid])


def test_recurrent_ppo_takes_the_gradient_steps_of_a_feed_forward_net():
    """Fragments of 32 steps from 4 envs, minibatches of 16 steps: with sequences of 8, two
    sequences a minibatch and 8 steps an epoch, as without a core (whole columns made 4)."""
    cfg = make_cfg("algo=ppo", "~preset", "env.id=walle/Counting-v0", "+env.kwargs.length=10",
                   "model.hidden=[8]", "model.core=lstm", "model.core_size=6", "model.seq_len=8",
                   "algo.minibatch_size=16", "algo.epochs=2")
    learner = make_learner(cfg)
    s = sampler(steps=32, envs=4, length=10)
    s.set_weights(learner.model.get_weights(), 0)
    rollout, _ = s.collect()
    metrics = learner.update([rollout], 0)
    assert metrics["grad_steps"] == 2 * (32 * 4) // 16

"""A user's own network (``model._target_``) from a package outside walle_ray
(tests/fixtures/my_pkg/nets.py): each family's passes the start-of-run check and runs one
update on the roles ``topology=local`` builds; PPO with one trains through the command line,
in one process and on Ray, and its checkpoint evaluates; broken ones are refused in one line."""


import pytest

from walle_ray.algos import algorithm_for
from walle_ray.algos import validate
from walle_ray.config import ConfigError
from walle_ray.contracts import ActorCriticNet, DeterministicNet, QNet
from walle_ray.envs import env_spaces
from walle_ray.models.user import UserNetwork, check_user_model, load_target
from walle_ray.topology import parse_topology

from conftest import make_cfg, make_learner, run_cli
from test_algorithm_presets import check_eval_policy, fill_and_sample

CORRIDOR = ["env.id=my_pkg.envs:Corridor-v0", "~preset"]
CONTINUOUS = ["env.id=walle/Continuous-v0", "~preset", "++env.kwargs={obs_dim: 3, act_dim: 2}"]
SMALL = ["topology=local", "env.envs_per_sampler=2"]
FAMILIES = {
    "ppo-discrete": ["algo=ppo", "model._target_=my_pkg.nets:MyActorCritic", *CORRIDOR,
                     "algo.batch_size=16", "algo.minibatch_size=8", "env.normalize_obs=true"],
    "ppo_kl-gaussian": ["algo=ppo_kl", "model._target_=my_pkg.nets.MyActorCritic", *CONTINUOUS,
                        "algo.batch_size=16", "algo.minibatch_size=8"],
    "impala": ["algo=impala", "model._target_=my_pkg.nets:MyActorCritic", *CORRIDOR,
               "algo.batch_size=16", "algo.fragment_length=8"],
    "dqn": ["algo=dqn", "model._target_=my_pkg.nets:MyQNet", "+model.kwargs={width: 16}",
            *CORRIDOR, "algo.batch_size=16", "algo.capacity=256", "algo.learning_starts=16",
            "algo.fragment_length=8"],
    "td3": ["algo=td3", "model._target_=my_pkg.nets:MyDeterministic",
            "+model.kwargs={critics: 2}", *CONTINUOUS, "algo.batch_size=16",
            "algo.capacity=256", "algo.learning_starts=16", "algo.random_steps=8",
            "algo.fragment_length=8"],
    "ddpg": ["algo=ddpg", "model._target_=my_pkg.nets:MyDeterministic", *CONTINUOUS,
             "algo.batch_size=16", "algo.capacity=256", "algo.learning_starts=16",
             "algo.random_steps=8", "algo.fragment_length=8"],
}
PROTOCOLS = {"ppo": ActorCriticNet, "ppo_kl": ActorCriticNet, "impala": ActorCriticNet,
             "dqn": QNet, "td3": DeterministicNet, "ddpg": DeterministicNet}
TINY_RUN = ["algo.batch_size=256", "algo.minibatch_size=64", "run.total_env_steps=1500",
            "model._target_=my_pkg.nets:MyActorCritic", *CORRIDOR]


def checked(*overrides: str):
    """The config, algorithm and spaces of a run, after the checks ``train()`` makes."""
    cfg = make_cfg(*overrides)
    validate(cfg)
    algo = algorithm_for(cfg.algo)
    obs_space, action_space = env_spaces(cfg.env)
    algo.check_spaces(obs_space, action_space)
    check_user_model(algo, obs_space, action_space, cfg)
    return cfg, algo, obs_space, action_space


@pytest.mark.parametrize("family", FAMILIES)
def test_each_familys_user_network_passes_the_check_and_updates(on_path, family):
    cfg, algo, obs_space, action_space = checked(*SMALL, *FAMILIES[family])
    learner = make_learner(cfg, obs_space, action_space)
    assert isinstance(learner.model, UserNetwork)
    assert isinstance(learner.model.net, PROTOCOLS[cfg.algo.name])
    cls, args, kwargs = algo.sampler(cfg, parse_topology("local"), 0)
    sampler = cls(*args, **kwargs)
    try:
        version, weights = learner.weights()
        assert all(k.startswith("net.") or k.startswith(("obs_norm.", "action_"))
                   for k in weights)
        sampler.set_weights(weights, version)
        if algo.memory_spec is None:
            rollout, stats = sampler.collect()
            batches, env_steps = [rollout], stats["env_steps"]
        else:
            _, batch, env_steps = fill_and_sample(algo, cfg, sampler)
            batches = [batch]
        before = {k: v.copy() for k, v in learner.weights()[1].items()}
        metrics = learner.update(batches, env_steps)
        assert metrics["nonfinite_skipped"] == 0
        new_version, new_weights = learner.weights()
        assert any((new_weights[k] != before[k]).any() for k in before if k.startswith("net."))
        sampler.set_weights(new_weights, new_version)
        check_eval_policy(algo, cfg, new_weights)  # as mode=eval rebuilds it from a checkpoint
    finally:
        sampler.close()
        learner.close()


BROKEN = {  # case: (overrides, what the one-line error says)
    "wrong-params": (
        ["model._target_=my_pkg.nets:WrongParams", *CORRIDOR],
        "model._target_: my_pkg.nets:WrongParams returned params of shape (4, 3); algo=ppo on "
        "this env needs (4, 2) (logits for Discrete(2))"),
    "one-critic-for-td3": (
        ["algo=td3", "model._target_=my_pkg.nets:MyDeterministic", *CONTINUOUS],
        "returned Q-values of shape (4, 1); algo=td3 needs (4, 2)"),
    "no-critic": (
        ["algo=ddpg", "model._target_=my_pkg.nets:NoCritic", *CONTINUOUS],
        "my_pkg.nets:NoCritic has no nn.Module attribute 'critic'"),
    "actor-critic-for-dqn": (
        ["algo=dqn", "model._target_=my_pkg.nets:MyActorCritic", *CORRIDOR],
        "returned Q-values as a tuple of 2"),
    "bad-kwarg": (
        ["model._target_=my_pkg.nets:MyActorCritic", "+model.kwargs={wdth: 3}", *CORRIDOR],
        "my_pkg.nets:MyActorCritic(obs_space, action_space, cfg, **{'wdth': 3}) raised TypeError"),
    "no-such-name": (
        ["model._target_=my_pkg.nets:Nothing"],
        "model._target_: module 'my_pkg.nets' has no class or function 'Nothing'"),
    "no-such-module": (
        ["model._target_=my_pkg.nothing:Net"],
        "model._target_: cannot import 'my_pkg.nothing' (ModuleNotFoundError"),
    "not-a-module": (
        ["model._target_=my_pkg.nets:plain_function"],
        "returned a function, not a torch nn.Module"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_network_that_breaks_its_contract_is_refused_in_one_line(on_path, case):
    overrides, message = BROKEN[case]
    with pytest.raises(ConfigError) as err:
        checked("topology=local", *overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_target_must_name_module_and_object():
    with pytest.raises(ConfigError, match=r"^model\._target_: got 'MyNet'; write it as"):
        validate(make_cfg("model._target_=MyNet"))
    with pytest.raises(ConfigError, match=r"^model\._target_: got 'my_pkg:'"):
        load_target("my_pkg:")
    with pytest.raises(ConfigError, match=r"^model\.kwargs: are arguments for your own network"):
        validate(make_cfg("+model.kwargs={width: 8}"))


def test_ppo_with_a_user_network_trains_locally_and_evaluates(on_path, tmp_path):
    run_cli("topology=local", *TINY_RUN, f"hydra.run.dir={tmp_path}", env=on_path, timeout=120)
    checkpoint = tmp_path / "checkpoints" / "last.pt"
    assert checkpoint.is_file()
    out = run_cli("mode=eval", f"run.checkpoint={checkpoint}", "eval.episodes=2",
                  "run.trust_code=true", f"hydra.run.dir={tmp_path}/eval", env=on_path,
                  timeout=120).stdout
    assert "eval my_pkg.envs:Corridor-v0: 2 episodes, return" in out


def test_ppo_with_a_user_network_trains_on_ray(on_path, tmp_path):
    out = run_cli("topology=2a1m1l", *TINY_RUN, f"hydra.run.dir={tmp_path}", env=on_path,
                  timeout=240).stdout
    assert "stopped (budget)" in out
    assert (tmp_path / "checkpoints" / "last.pt").is_file()


def test_a_broken_network_stops_the_command_in_one_line(on_path, tmp_path):
    proc = run_cli("topology=2a1m1l", "model._target_=my_pkg.nets:WrongParams", *CORRIDOR,
                   f"hydra.run.dir={tmp_path}", env=on_path, check=False, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("walle_ray: error:")]
    assert len(lines) == 1 and "returned params of shape (4, 3)" in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "checkpoints").exists()  # refused before any role started

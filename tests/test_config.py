"""Config composition: typos and wrong types are errors that name the key."""

import re

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from walle_ray.algos import validate

from walle_ray.config import ConfigError
from walle_ray.runtime.args import rewrite_args
from walle_ray.config import CONF_DIR

from conftest import make_cfg


def test_default_config_composes_and_validates():
    cfg = make_cfg()
    validate(cfg)
    assert cfg.algo.name == "ppo" and cfg.env.id == "CartPole-v1"
    assert cfg.topology.spec == "2a1m1l"


def test_presets_apply_per_algorithm_and_env():
    cfg = make_cfg("env=halfcheetah")
    assert list(cfg.model.hidden) == [256, 256] and cfg.algo.epochs == 20
    assert make_cfg("env=halfcheetah", "algo.epochs=3").algo.epochs == 3  # overrides win


@pytest.mark.parametrize("override,key", [
    ("algo.lrr=1", "algo.lrr"), ("run.total_env_step=5", "run.total_env_step"),
    ("env.envs_per_sampler=many", "env.envs_per_sampler"), ("algo.lr=fast", "algo.lr"),
])
def test_typos_and_wrong_types_name_the_key(override, key):
    with pytest.raises(ConfigCompositionException) as err:
        make_cfg(override)
    text = str(err.value) + str(err.value.__cause__)
    assert key in text


@pytest.mark.parametrize("override,key", [
    ("run.total_env_steps=0", "run.total_env_steps"), ("env.envs_per_sampler=0", "env.envs_per_sampler"),
    ("algo.gamma=1.5", "algo.gamma"), ("algo.objective=trust", "algo.objective"),
    ("env.obs_size=64", "env.obs_size"), ("topology.spec=3x", "topology"),
    ("algo.minibatch_size=-1", "algo.minibatch_size"), ("mode=play", "mode"),
    ("topology.resources={lerner: {trainer: 1}}", "topology.resources.lerner"),
    ("topology.resources={learner: {trainer: 0}}", "topology.resources.learner.trainer"),
    ("topology.resources={learner: {GPU: 1}}", "topology.resources.learner.GPU"),
    ("topology.resources={learner: 1}", "topology.resources.learner"),
    ("env.max_episode_steps=-1", "env.max_episode_steps"),
    ("env.max_episode_steps=0", "env.max_episode_steps"),
])
def test_out_of_range_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        validate(make_cfg(override))
    assert str(err.value).startswith(key)


def test_a_minibatch_larger_than_the_batch_is_refused():
    for algo in ("ppo", "ppo_kl"):
        with pytest.raises(ConfigError, match=r"^algo\.minibatch_size: got 4096, more than "
                                              r"algo\.batch_size=2048"):
            validate(make_cfg(f"algo={algo}", "algo.batch_size=2048", "algo.minibatch_size=4096"))
        validate(make_cfg(f"algo={algo}", "algo.batch_size=2048", "algo.minibatch_size=2048"))


def test_any_topology_string_is_accepted_on_the_command_line():
    args = rewrite_args(["topology=12a3m2l", "algo=ppo"], CONF_DIR)
    assert args == ["topology.spec=12a3m2l", "algo=ppo"]
    assert rewrite_args(["topology=32a4m4l"], CONF_DIR) == ["topology=32a4m4l"]
    assert make_cfg(*args).topology.spec == "12a3m2l"


def test_a_whole_number_in_scientific_notation_is_an_integer_on_the_command_line():
    args = rewrite_args(["algo=dqn", "algo.capacity=1e6", "run.total_env_steps=2.5e5",
                         "algo.lr=1e-4", "algo.gamma=9.9e-1", "algo.priority_alpha=1.25e1"],
                        CONF_DIR)
    assert args == ["algo=dqn", "algo.capacity=1000000", "run.total_env_steps=250000",
                    "algo.lr=1e-4", "algo.gamma=9.9e-1", "algo.priority_alpha=1.25e1"]
    cfg = make_cfg(*args)
    assert cfg.algo.capacity == 1_000_000 and cfg.run.total_env_steps == 250_000
    assert cfg.algo.lr == 1e-4 and cfg.algo.priority_alpha == 12.5
    assert make_cfg("algo=dqn", *rewrite_args(["algo.lr=1e3"], CONF_DIR)).algo.lr == 1000.0


def test_resume_reuses_the_runs_overrides(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text(
        OmegaConf.to_yaml(OmegaConf.create(["env=halfcheetah", "run.total_env_steps=10"])))
    args = rewrite_args([f"run.resume={tmp_path}", "run.total_env_steps=20"], CONF_DIR)
    assert args == ["env=halfcheetah", f"run.resume={tmp_path}", "run.total_env_steps=20",
                    f"hydra.run.dir={tmp_path}"]


def test_role_resources_the_cluster_lacks_are_refused_before_any_role_starts():
    """Roles asking for a custom resource wait forever where the cluster has too little."""
    from walle_ray.runtime.ray_init import check_role_resources

    asks = {"learner": {"trainer": 1}, "sampler": {"envs": 1}}
    nodes = [{"CPU": 8, "trainer": 1, "envs": 16}, {"CPU": 8, "trainer": 1}]
    check_role_resources(asks, {"learner": 2, "sampler": 16}, nodes)
    for processes, words in (({"learner": 3, "sampler": 1}, "3 learner process(es) ask for 1 "
                              "'trainer' each and the Ray cluster's nodes have 2"),
                             ({"learner": 1, "sampler": 17}, "topology.resources.sampler.envs")):
        with pytest.raises(ConfigError, match=re.escape(words)):
            check_role_resources(asks, processes, nodes)
    with pytest.raises(ConfigError, match="at most 1 on one node"):
        check_role_resources({"learner": {"trainer": 2}}, {"learner": 1}, nodes)


@pytest.mark.parametrize("args,message", [
    (["run.total_env_step=100"], "run.total_env_step: run has no key 'total_env_step'; did you "
                                 "mean run.total_env_steps?"),
    (["+run.total_env_step=100"], "and a key added with + would be read by nothing; did you "
                                  "mean run.total_env_steps?"),
    (["+algo.lrr=1e-3"], "+algo.lrr: algo has no key 'lrr', and a key added"),
    (["algo=impala", "algo.minibatch_size=64"], "algo.minibatch_size: algo has no key"),
    (["runn.seed=1"], "runn.seed: the config has no 'runn'; did you mean run?"),
    (["run.seed=abc"], "run.seed=abc: run.seed takes a whole number, e.g. run.seed=0"),
    (["algo.lr=fast"], "algo.lr=fast: algo.lr takes a number, e.g. algo.lr="),
    (["run.max_wall_s=soon"], "run.max_wall_s takes a number or null"),
    (["eval.video=maybe"], "eval.video takes true or false, e.g. eval.video=false"),
    (["algo=ppoo"], "algo=ppoo: no algo named 'ppoo'; did you mean algo=ppo? (choose from apex,"),
    (["logger=[wandb,tensorbord]"], "no logger named 'tensorbord'; did you mean "
                                    "logger=tensorboard?"),
])
def test_an_override_the_schema_refuses_is_one_line_with_the_nearest_key(args, message):
    from walle_ray.runtime.override_keys import check_overrides

    with pytest.raises(ConfigError) as err:
        check_overrides(rewrite_args(args, [CONF_DIR]), [CONF_DIR])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_overrides_the_schema_allows_or_leaves_to_hydra_pass(tmp_path):
    from walle_ray.runtime.override_keys import check_overrides

    fine = ["algo=ppo_kl", "algo.kl_target=0.02", "algo.minibatch_size=64", "env=pong",
            "+env.kwargs.length=3", "+env.kwargs={a: 1}", "topology.resources.sampler.CPU=1",
            "topology=16a2m2l", "topology=3a1m1l", "run.max_wall_s=null", "run.seed=0,1,2",
            "algo.lr=${algo.ent_coef}", "model.hidden=[32]", "learner.num_gpus=1",
            "run.total_env_steps=1e6", "eval.video=True", "mode=eval", "~preset",
            "hydra.run.dir=x", "--cfg", "job", "logger=[wandb,tensorboard]", "env.id=Acrobot-v1",
            "hydra/job_logging=disabled", "run.total_env_steps=1_000_000", "algo=glob(*)",
            "env=choice(cartpole,taxi)", "eval.video=2"]
    check_overrides(rewrite_args(fine, [CONF_DIR]), [CONF_DIR])
    # an env of the user's config directory, named by a resumed run's search path
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "corridor.yaml").write_text("env:\n  id: CartPole-v1\n")
    with pytest.raises(ConfigError, match="no env named 'corridor'"):
        check_overrides(["env=corridor"], [CONF_DIR])
    check_overrides(["env=corridor", f"hydra.searchpath=[file://{tmp_path}]"], [CONF_DIR])
    check_overrides(["env=corridor"], [CONF_DIR, tmp_path])
    # a group of the user's own (Hydra's experiment pattern)
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "fast.yaml").write_text("# @package _global_\n")
    check_overrides(["+experiment=fast"], [CONF_DIR, tmp_path])
    with pytest.raises(ConfigError, match="no experiment named 'slow'"):
        check_overrides(["+experiment=slow"], [CONF_DIR, tmp_path])


def test_the_api_says_what_is_wrong_with_a_setting(tmp_path):
    import walle_ray

    with pytest.raises(ConfigError, match=r"^run.seed=abc: run.seed takes a whole number"):
        walle_ray.train(run={"seed": "abc"}, run_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_a_run_the_api_refuses_leaves_no_dated_directory(tmp_path, monkeypatch):
    import walle_ray

    monkeypatch.setenv("WALLE_RUNS_DIR", str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match="algo.lr"):
        walle_ray.train(algo={"lr": -1})
    assert not list((tmp_path / "runs").iterdir())


def test_a_primary_config_of_the_users_own_picks_the_algo_whose_keys_are_checked(tmp_path):
    from walle_ray.runtime.override_keys import check_overrides

    (tmp_path / "mine.yaml").write_text(
        "defaults:\n  - config\n  - override algo: impala\n  - _self_\n")
    (tmp_path / "slash.yaml").write_text(
        "defaults:\n  - config\n  - override /algo: impala\n  - _self_\n")
    (tmp_path / "plain.yaml").write_text("defaults:\n  - config\n  - _self_\n")
    (tmp_path / "unknown.yaml").write_text("run:\n  seed: 1\n")
    dirs = [CONF_DIR, tmp_path]
    for flags in (["--config-name", "mine"], ["--config-name=mine"], ["-cn", "mine.yaml"],
                  ["--config-name", "slash"]):
        check_overrides([*flags, "algo.rho_bar=0.9"], dirs)  # IMPALA's key, not PPO's
        with pytest.raises(ConfigError, match="algo.gae_lambda: algo has no key"):
            check_overrides([*flags, "algo.gae_lambda=0.9"], dirs)
    with pytest.raises(ConfigError, match="algo.rho_bar: algo has no key"):
        check_overrides(["--config-name", "plain", "algo.rho_bar=0.9"], dirs)  # ppo, the default
    # a primary config that does not say which algorithm: algo keys are left to Hydra
    check_overrides(["--config-name", "unknown", "algo.rho_bar=0.9"], dirs)
    check_overrides(["--config-name", "unknown", "algo.gae_lambda=0.9"], dirs)

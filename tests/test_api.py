"""The Python API (walle_ray.train, load_policy, evaluate), a user's own config directory,
and the name and settings an env without a config file gets."""

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import yaml

import walle_ray
from walle_ray.config import CONF_DIR
from walle_ray.runtime.args import rewrite_args

from conftest import ROOT, make_cfg, run_cli

SMALL = {"algo": {"batch_size": 256, "minibatch_size": 64}, "run": {"total_env_steps": 1500}}


def test_train_from_python_returns_the_run_and_its_policy_acts_in_a_fresh_process(
        on_path, tmp_path):
    """A user's env and network, trained from Python; the checkpoint acts in another process,
    which imports the user's modules itself once told to trust the checkpoint."""
    result = walle_ray.train(["env.id=my_pkg.envs:Corridor-v0", "topology=local",
                              "model._target_=my_pkg.nets:MyActorCritic"],
                             run_dir=tmp_path / "run", **SMALL)
    assert result.stopped_by == "budget" and result.exit_code == 0
    assert result.run_dir == tmp_path / "run" and result.counters["env_steps"] >= 1500
    last = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert result.metrics["env_steps"] == last["env_steps"] == result.counters["env_steps"]
    config = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert config["env"]["name"] == "corridor" and config["algo"]["batch_size"] == 256

    script = textwrap.dedent(f"""
        import sys, numpy as np, walle_ray
        policy = walle_ray.load_policy({str(result.run_dir)!r}, trust_code=True)
        assert "ray" not in sys.modules
        assert type(policy._acting.model.net).__name__ == "MyActorCritic"
        batch = policy.act(np.zeros((5, 1), np.float32))
        one = policy.act(np.zeros(1, np.float32))
        print(batch.shape, batch.dtype.kind, np.ndim(one), policy.env_steps)
    """)
    path = os.pathsep.join([str(ROOT), on_path["PYTHONPATH"]])  # this source tree's walle_ray
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path}, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["(5,)", "i", "0", str(result.counters["env_steps"])]


def test_load_policy_acts_greedily_and_evaluate_runs_episodes(tmp_path):
    result = walle_ray.train(topology="local", run_dir=tmp_path / "run", logger={"progress": "off"},
                             run={"total_env_steps": 1024}, algo={"batch_size": 512})
    policy = walle_ray.load_policy(result.run_dir / "checkpoints" / "last.pt")
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    np.testing.assert_array_equal(policy.act(obs), policy.act(obs))  # greedy: the same twice
    assert set(policy.act(obs).tolist()) <= {0, 1}
    with pytest.raises(ValueError, match=r"observations of shape \(8, 3\)"):
        policy.act(obs[:, :3])
    report = walle_ray.evaluate(result.run_dir, episodes=2)
    assert report["episodes"] == 2 and len(report["returns"]) == 2 and report["return_mean"] > 0


def test_evaluate_and_load_policy_refuse_bad_input_in_one_line(tmp_path):
    from walle_ray.runtime.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

    result = walle_ray.train(topology="local", run_dir=tmp_path / "run", logger={"progress": "off"},
                             run={"total_env_steps": 256},
                             algo={"batch_size": 256, "minibatch_size": 64, "epochs": 1})
    for episodes in (-1, 0, "3", 2.5, True):
        with pytest.raises(walle_ray.ConfigError,
                           match=rf"^episodes: got {re.escape(repr(episodes))}; use a positive"):
            walle_ray.evaluate(result.run_dir, episodes=episodes)
    assert walle_ray.evaluate(result.run_dir, episodes=np.int64(1))["episodes"] == 1

    good = load_checkpoint(result.run_dir)
    wider = {**good, "config": {**good["config"], "model": {**good["config"]["model"],
                                                             "hidden": [32]}}}
    no_steps = {**good, "counters": {}}
    for name, ckpt, words in (("wider.pt", wider, "its weights do not fit the network its "
                                                  "config describes (RuntimeError: "),
                              ("no_steps.pt", no_steps, "its config, counters or learner state "
                                                        "are incomplete (KeyError: ")):
        path = save_checkpoint(tmp_path / name, {k: v for k, v in ckpt.items()
                                                 if k not in ("format", "walle_ray_version")})
        with pytest.raises(CheckpointError, match=rf"^checkpoint {path} is inconsistent: "
                                                  rf"{re.escape(words)}") as err:
            walle_ray.load_policy(path)
        assert "\n" not in str(err.value)


def test_bad_settings_from_python_raise_config_error_naming_the_key(tmp_path):
    with pytest.raises(walle_ray.ConfigError, match=r"^algo\.lr: must be positive"):
        walle_ray.train(["algo.lr=-1", "topology=local"], run_dir=tmp_path / "a")
    with pytest.raises(walle_ray.ConfigError, match=r"algo\.nope"):
        walle_ray.train(["algo.nope=1"], run_dir=tmp_path / "b")
    assert not (tmp_path / "a" / "checkpoints").exists()


def test_keyword_settings_compose_like_the_command_line(tmp_path):
    from walle_ray.api import _compose, compose_overrides

    settings = {"algo": "impala", "run": {"seed": 3, "max_wall_s": None},
                "env.kwargs": {"faults": [[0, 1]]}, "eval.video": True,
                "model": {"kwargs": {"width": 128}, "_target_": "my_pkg.nets:MyActorCritic"},
                "env": {"wrappers": [{"_target_": "gymnasium.wrappers.ClipReward",
                                      "max_reward": 1.0}]},
                "logger": {"tags": ["a b", "it's"]}}
    overrides = compose_overrides(["topology=local"], settings)
    assert overrides[:4] == ["topology=local", "algo=impala", "run.seed=3", "run.max_wall_s=null"]
    cfg, run_dir, _ = _compose(overrides, None, tmp_path)
    assert run_dir == tmp_path and cfg.algo.name == "impala" and cfg.run.seed == 3
    assert cfg.run.max_wall_s is None and cfg.eval.video is True
    assert cfg.env.kwargs.faults == [[0, 1]] and cfg.model.kwargs.width == 128
    assert cfg.model._target_ == "my_pkg.nets:MyActorCritic"
    assert cfg.env.wrappers[0]["max_reward"] == 1.0 and list(cfg.logger.tags) == ["a b", "it's"]


def test_an_env_without_a_config_file_gets_its_own_name_and_no_other_envs_preset():
    args = rewrite_args(["algo=impala", "env.id=Acrobot-v1"], CONF_DIR)
    assert args == ["algo=impala", "env=custom", "env.id=Acrobot-v1"]
    cfg = make_cfg(*args)
    assert cfg.env.name == "acrobot" and cfg.env.id == "Acrobot-v1"
    assert cfg.algo.batch_size == make_cfg("algo=impala", "env=custom", "env.id=x",
                                           "~preset").algo.batch_size
    assert make_cfg(*rewrite_args(["env.entry_point=my_pkg.envs:Corridor"], CONF_DIR)).env.name \
        == "corridor"
    # naming the env group keeps its file and preset
    assert rewrite_args(["env=cartpole", "env.id=walle/Faulty-v0"], CONF_DIR) == [
        "env=cartpole", "env.id=walle/Faulty-v0"]
    assert make_cfg("env=cartpole", "env.id=walle/Faulty-v0").run.stop_at_return == 475


def _user_config_dir(path):
    (path / "env").mkdir(parents=True)
    (path / "preset").mkdir()
    (path / "topology").mkdir()
    (path / "env" / "corridor.yaml").write_text(
        "name: corridor\nid: my_pkg.envs:Corridor-v0\nenvs_per_sampler: 2\n")
    (path / "preset" / "ppo_corridor.yaml").write_text(
        "# @package _global_\nalgo:\n  batch_size: 256\n  minibatch_size: 64\n"
        "run:\n  total_env_steps: 1024\n")
    (path / "topology" / "inline.yaml").write_text("spec: local\n")
    return path


def test_a_users_config_dir_adds_env_preset_and_topology_and_resume_finds_it(on_path, tmp_path):
    conf = _user_config_dir(tmp_path / "my_conf")
    run_dir = tmp_path / "run"
    out = run_cli("--config-dir", str(conf), "env=corridor", "topology=inline",
                  f"hydra.run.dir={run_dir}", env=on_path).stdout
    assert f"tuned settings from {conf}/preset/ppo_corridor.yaml apply" in out
    assert "ppo corridor local" in out and "stopped (budget) at 1024" in out
    # The stored search path names a directory of files that name code: given again, or trusted.
    proc = run_cli(f"run.resume={run_dir}", env=on_path, check=False, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert (f"puts '{conf}' on the config search path (hydra.searchpath), whose files may name "
            f"code to import; resume with run.trust_code=true if you trust {run_dir}, or give "
            f"--config-dir {conf} again") in proc.stderr
    out = run_cli(f"run.resume={run_dir}", "run.total_env_steps=2048", "run.trust_code=true",
                  env=on_path).stdout
    assert "resumed at 1024 env steps" in out and "stopped (budget) at 2048" in out
    out = run_cli("--config-dir", str(conf), f"run.resume={run_dir}", "run.total_env_steps=3072",
                  env=on_path).stdout
    assert "resumed at 2048 env steps" in out and "stopped (budget) at 3072" in out

    result = walle_ray.train(["env=corridor", "topology=inline"], config_dir=conf,
                             run_dir=tmp_path / "api", logger={"progress": "off"})
    assert result.counters["env_steps"] == 1024


def test_a_config_dir_that_does_not_exist_is_one_line(tmp_path):
    proc = run_cli("--config-dir", str(tmp_path / "nope"), check=False, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"walle_ray: error: --config-dir: {tmp_path / 'nope'} is not a directory" in proc.stderr


def test_a_value_typed_over_several_lines_is_one_override():
    typed = ("algo.replay=[{type: queue, ratio: 0.5}, {type: elite, ratio: 0.5, capacity: 1000,\n"
             "                dist_function: ln_norm, lambda_batch_multiplier: 6}]")
    cfg = make_cfg("algo=impala", *rewrite_args([typed], CONF_DIR))
    assert cfg.algo.replay[1].type == "elite" and cfg.algo.replay[1].lambda_batch_multiplier == 6

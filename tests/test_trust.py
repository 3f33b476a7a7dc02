"""A checkpoint or a run directory from elsewhere is code: its config names envs, wrappers and
networks to import. None of it runs unless the caller trusts the file (``trust_code=True``,
``run.trust_code=true``) or names the same code itself; built-in and registered env ids need
no trust. The marker files show whether the named code ran."""

import re

import numpy as np
import pytest
import torch
import yaml

import walle_ray
from walle_ray.config import CONF_DIR, ConfigError
from walle_ray.runtime.args import rewrite_args
from walle_ray.runtime.checkpoint import CheckpointError, checked_config, save_checkpoint
from walle_ray.runtime.evaluate import evaluate
from walle_ray.runtime.train import train

from conftest import FIXTURES, make_cfg, run_cli

TINY = ["topology=local", "~preset", "algo.batch_size=256", "algo.minibatch_size=64",
        "algo.epochs=1", "run.total_env_steps=512", "env.max_episode_steps=20",
        "logger.progress=off"]
MARKED = "my_pkg.envs:marked_corridor"


def marked_env(marker) -> list[str]:
    """The overrides of a user's env whose constructor creates ``marker``."""
    return [f"env.entry_point={MARKED}", f"+env.kwargs={{marker: '{marker}'}}"]


def error_line(proc) -> str:
    """The one line a refused command prints."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("walle_ray: error:")]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def corridor_run(tmp_path_factory):
    """A tiny run on the marked env, and its marker, removed once the run has made it."""
    base = tmp_path_factory.mktemp("corridor")
    run_dir, marker = base / "run", base / "made"
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(FIXTURES)
        train(make_cfg("env=custom", *marked_env(marker), *TINY), run_dir)
    marker.unlink()
    return run_dir, marker


def crafted(run_dir, out, **env):
    """A copy of the run's checkpoint in ``out`` whose config's env has ``env`` set."""
    payload = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    payload["config"]["env"].update(env)
    return save_checkpoint(out / "checkpoints" / "last.pt", payload)


@pytest.mark.parametrize("how", ["load_policy", "evaluate", "mode=eval", "mode=collect"])
def test_a_checkpoint_naming_code_is_refused_wherever_it_is_loaded(corridor_run, tmp_path, how):
    ran = tmp_path / "ran"
    path = crafted(corridor_run[0], tmp_path, entry_point="os:system",
                   kwargs={"command": f"touch {ran}"})
    if how.startswith("mode="):
        extra = [f"collect.out={tmp_path / 'data'}", "collect.episodes=1"] if how == "mode=collect" else []
        message = error_line(run_cli(how, f"run.checkpoint={path}", *extra,
                                     f"hydra.run.dir={tmp_path / 'r'}", check=False, timeout=120))
    else:
        with pytest.raises(walle_ray.CheckpointError) as err:
            getattr(walle_ray, how)(path)
        message = str(err.value)
    assert f"env.entry_point: checkpoint {path} names 'os:system'" in message
    assert "trust_code=True (run.trust_code=true on the command line)" in message
    assert not ran.exists()


def test_a_trusted_checkpoint_or_the_callers_own_code_is_built(corridor_run, on_path):
    run_dir, marker = corridor_run
    with pytest.raises(CheckpointError, match=rf"^env\.entry_point: .* names '{MARKED}'"):
        walle_ray.load_policy(run_dir)
    assert not marker.exists()
    policy = walle_ray.load_policy(run_dir, trust_code=True)
    assert policy.act(np.zeros(1, np.float32)) in (0, 1) and marker.exists()
    marker.unlink()
    # mode=eval naming the same env itself: the caller's own code
    own = make_cfg("mode=eval", f"run.checkpoint={run_dir}", "eval.episodes=1", "env=custom",
                   *marked_env(marker))
    assert evaluate(own)["episodes"] == 1 and marker.exists()
    marker.unlink()
    other = make_cfg("mode=eval", f"run.checkpoint={run_dir}", "env=custom",
                     "env.entry_point=my_pkg.envs:Corridor")
    with pytest.raises(CheckpointError, match=rf"names '{MARKED}'"):
        evaluate(other)


@pytest.mark.parametrize("env,model,key", [
    ({"imports": ["my_pkg.envs"]}, {}, "env.imports"),
    ({"entry_point": "os:system"}, {}, "env.entry_point"),
    ({"wrappers": [{"_target_": "gymnasium.wrappers.ClipReward", "max_reward": 1.0}]}, {},
     "env.wrappers[0]"),
    ({"id": "os:Evil-v0"}, {}, "env.id"),
    # walle/Faulty-v0 makes the env its base_id names: gymnasium imports a module:EnvId's module
    ({"id": "walle/Faulty-v0", "kwargs": {"base_id": "os:Evil-v0"}}, {}, "env.kwargs.base_id"),
    ({"id": "walle/Faulty-v0", "kwargs": {"base_id": "os:"}}, {}, "env.kwargs.base_id"),
    ({}, {"_target_": "my_pkg.nets:MyActorCritic"}, "model._target_"),
])
def test_each_key_that_names_code_is_refused_unless_trusted(tmp_path, env, model, key):
    path = tmp_path / "last.pt"
    ckpt = {"config": {"env": env, "model": model}}
    with pytest.raises(CheckpointError) as err:
        checked_config(ckpt, path, trust_code=False)
    assert re.match(rf"{re.escape(key)}: checkpoint {path} names '[^']+', code that", str(err.value))
    assert "\n" not in str(err.value)
    assert checked_config(ckpt, path, trust_code=True)["model"] == model


@pytest.mark.parametrize("env", [
    {"name": "os:Evil-v0", "id": "${.name}"},
    {"name": "os:Evil-v0", "id": "\\${.name}"},  # escaped: resolved once, live again
    {"name": "${walle_new_dir:/tmp/x}"},  # a resolver that makes directories
])
def test_a_checkpoint_config_holding_an_interpolation_is_refused_unless_trusted(tmp_path, env):
    """walle_ray writes a run's config resolved: an interpolation in a checkpoint's config
    comes from elsewhere, and resolving it calls a resolver, or names code once resolved."""
    path = tmp_path / "last.pt"
    ckpt = {"config": {"env": env, "model": {}}}
    with pytest.raises(CheckpointError) as err:
        checked_config(ckpt, path, trust_code=False)
    key = next(k for k, v in env.items() if "${" in v)
    assert re.match(rf"env\.{key}: checkpoint {path} holds the interpolation '", str(err.value))
    assert "trust_code=True" in str(err.value)
    if "walle_new_dir" not in env["name"]:
        assert checked_config(ckpt, path, trust_code=True)["env"]["name"] == "os:Evil-v0"


def test_built_in_and_registered_env_ids_need_no_trust(tmp_path):
    for env_id in ("CartPole-v1", "ALE/Pong-v5", "walle/Faulty-v0", "HalfCheetah-v5"):
        config = checked_config({"config": {"env": {"id": env_id}, "model": {}}},
                                tmp_path / "last.pt", trust_code=False)
        assert config["env"]["id"] == env_id


def resume_args(run_dir, stored, *given, dirs=()):
    (run_dir / "overrides.yaml").write_text(yaml.safe_dump(stored))
    return rewrite_args([f"run.resume={run_dir}", *given], [CONF_DIR, *dirs])


def test_resume_keeps_stored_overrides_that_name_no_code_and_refuses_the_rest(tmp_path):
    plain = ["env=cartpole", "algo=impala", "logger=[wandb,tensorboard]", "~preset",
             "topology.spec=2a1m1l", "+env.kwargs={length: 3}", "env.id=CartPole-v1",
             "run.ray_address=auto", "logger.group=${algo.name}_${env.name}"]
    assert resume_args(tmp_path, plain)[:len(plain)] == plain
    # trust is this command's to give, never the file's
    assert "run.trust_code=true" not in resume_args(tmp_path, [*plain, "run.trust_code=true"])
    conf = tmp_path / "my_conf"
    conf.mkdir()
    searchpath = f"hydra.searchpath=[file://{conf}]"
    code = ["env.entry_point=os:system", "env.imports=[os]", "model._target_=os.system",
            "+env.wrappers=[{_target_: os.system}]", "env.id=os:Evil-v0", "env.id=${env.name}",
            "env=../../../tmp/evil", "env={entry_point: 'os:system'}",
            "+hydra.callbacks.x._target_=os.system", "hydra/launcher=evil",
            "+env.kwargs.base_id=os:Evil-v0", "+env.kwargs.base_id=os:",
            "+env.kwargs={base_id: 'os:Evil-v0'}", "+env.kwargs.base_id=${env.name}",
            "algo.lr=${oc.env:HOME}",
            "run.ray_address=ray://cluster.example:10001", "run.ray_address=10.0.0.1:6379",
            "--experimental-rerun=/tmp/config.pickle", searchpath]
    for override in code:
        with pytest.raises(ConfigError) as err:
            resume_args(tmp_path, [*plain, override])
        message = str(err.value)
        assert message.startswith(f"run.resume: {tmp_path / 'overrides.yaml'} ")
        assert f"resume with run.trust_code=true if you trust {tmp_path}" in message, message
        assert override in resume_args(tmp_path, [*plain, override], "run.trust_code=true")
    # the caller's own: the config directory given again, the key given anew
    assert resume_args(tmp_path, [searchpath], dirs=[conf]) == [
        searchpath, f"run.resume={tmp_path}", f"hydra.run.dir={tmp_path}"]
    # with the flag, the overrides stay one run of positionals for argparse
    assert rewrite_args(["--config-dir", str(conf), f"run.resume={tmp_path}"], [CONF_DIR, conf]) \
        == ["--config-dir", str(conf), searchpath, f"run.resume={tmp_path}",
            f"hydra.run.dir={tmp_path}"]
    args = resume_args(tmp_path, ["env.entry_point=os:system"], f"env.entry_point={MARKED}")
    assert f"env.entry_point={MARKED}" in args and "env.entry_point=os:system" not in args
    with pytest.raises(ConfigError, match="is not a list of overrides"):
        resume_args(tmp_path, {"env.entry_point": "os:system"})


def test_resume_runs_no_code_its_stored_overrides_name_unless_trusted(on_path, tmp_path):
    run_dir, marker, ran = tmp_path / "run", tmp_path / "made", tmp_path / "ran"
    run_cli(*marked_env(marker), *TINY, f"hydra.run.dir={run_dir}", env=on_path, timeout=180)
    marker.unlink()
    stored = run_dir / "overrides.yaml"
    mine = stored.read_text()
    # one's own run on one's own env: one line that says what to add
    message = error_line(run_cli(f"run.resume={run_dir}", "run.total_env_steps=1024",
                                 env=on_path, check=False, timeout=120))
    assert f"run.resume: {stored} sets 'env.entry_point={MARKED}', which names code" in message
    assert "run.trust_code=true" in message and "env.entry_point=... on this command line" in message
    # a run directory from elsewhere: os.system through overrides.yaml
    stored.write_text(yaml.safe_dump([
        o.replace(MARKED, "os:system").replace(f"marker: '{marker}'", f"command: 'touch {ran}'")
        for o in yaml.safe_load(mine)]))
    message = error_line(run_cli(f"run.resume={run_dir}", check=False, timeout=120))
    assert "sets 'env.entry_point=os:system'" in message
    assert not marker.exists() and not ran.exists()
    stored.write_text(mine)
    out = run_cli(f"run.resume={run_dir}", "run.total_env_steps=1024", "run.trust_code=true",
                  env=on_path, timeout=180).stdout
    assert "resumed at 512 env steps" in out and marker.exists()

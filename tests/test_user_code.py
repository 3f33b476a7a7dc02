"""A user's own environment, from a package outside walle_ray (tests/fixtures/my_pkg): the
three ways to name it, in one process and through Ray, and the bad inputs."""


import numpy as np
import pytest
from omegaconf import OmegaConf

from walle_ray.config import ConfigError, EnvConfig
from walle_ray.envs import make_vector_env

from conftest import run_cli

FORMS = {
    "module:id": ["env.id=my_pkg.envs:Corridor-v0"],
    "imports": ["env.imports=[my_pkg.envs]", "env.id=Corridor-v0"],
    "entry_point": ["env.entry_point=my_pkg.envs:Corridor", "+env.kwargs={length: 3}"],
}


@pytest.mark.parametrize("form", FORMS)
def test_each_form_makes_the_users_env(on_path, form):
    keys = dict(item.split("=", 1) for item in FORMS[form])
    cfg = EnvConfig(name="corridor", id=keys.get("env.id", "CartPole-v1"), envs_per_sampler=2,
                    imports=["my_pkg.envs"] if form == "imports" else [],
                    entry_point=keys.get("env.entry_point"),
                    kwargs={"length": 3} if form == "entry_point" else {})
    env = make_vector_env(OmegaConf.structured(cfg))
    try:
        obs = env.reset(seed=0)
        assert obs.shape == (2, 1) and env.action_space.n == 2
        out = np.empty_like(obs)
        reward, term, trunc = np.empty(2, np.float32), np.empty(2, bool), np.empty(2, bool)
        env.step(np.ones(2, np.int64), out, reward, term, trunc)
        np.testing.assert_array_equal(out[:, 0], [1, 1])
    finally:
        env.close()


@pytest.mark.parametrize("form,topology", [("module:id", "local"), ("imports", "2a1m1l"),
                                           ("entry_point", "local")])
def test_a_run_trains_on_the_users_env(on_path, tmp_path, form, topology):
    """Every process that builds envs imports the user's module: the driver, and in a Ray
    topology each sampler."""
    out = run_cli(*FORMS[form], f"topology={topology}", "~preset", "algo.batch_size=256",
                  "algo.minibatch_size=64", "run.total_env_steps=1500",
                  f"hydra.run.dir={tmp_path}", env=on_path, timeout=240).stdout
    assert "stopped (budget)" in out
    assert (tmp_path / "checkpoints" / "last.pt").is_file()


@pytest.mark.parametrize("args,message", [
    (["env.imports=[my_pkg.nothing_here]"],
     "env.imports: cannot import 'my_pkg.nothing_here' (ModuleNotFoundError"),
    (["env.id=no_such_pkg.envs:Corridor-v0"], "env.id: cannot import 'no_such_pkg.envs'"),
    (["env.entry_point=my_pkg.envs:Hallway"],
     "env.entry_point: module 'my_pkg.envs' has no class or function 'Hallway'"),
    (["env.entry_point=my_pkg.envs"], "env.entry_point: got 'my_pkg.envs'; write it as"),
])
def test_bad_user_env_names_the_key_in_one_line(on_path, tmp_path, args, message):
    proc = run_cli(*args, f"hydra.run.dir={tmp_path}", env=on_path, check=False, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("walle_ray: error:")]
    assert len(lines) == 1 and message in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_an_entry_point_that_names_nothing_is_refused_in_process(on_path):
    cfg = OmegaConf.structured(EnvConfig(entry_point="my_pkg.envs:Hallway"))
    with pytest.raises(ConfigError, match=r"^env\.entry_point: module 'my_pkg\.envs' has no"):
        make_vector_env(cfg)

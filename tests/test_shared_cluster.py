"""The suite's shared Ray instance (``conftest.SharedCluster``): a run joins it unless the
test changed the environment its roles would see."""

import importlib

import pytest

from conftest import SHARED


def test_what_libraries_set_for_themselves_keeps_runs_joining_and_what_a_test_sets_does_not(
        monkeypatch):
    """Importing what the runs and tests import, or torch's compiler loading a kernel (it
    sets _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR), must not make every later run start its
    own Ray instance, as it once did; a variable a test sets, a PYTHONPATH of its own, or a
    cluster or CPU count of its own named does."""
    if SHARED.failed:
        pytest.skip("the shared instance could not start here")
    for name in ("gymnasium", "ale_py", "mujoco", "torch", "ray", "walle_ray.envs",
                 "walle_ray.runtime.remote", "walle_ray.__main__"):
        importlib.import_module(name)
    monkeypatch.setenv("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", "140505900567584")
    assert SHARED.joins(("algo=ppo", "env=cartpole"), None), SHARED.changed()
    assert not SHARED.joins(("algo=ppo",), {"PYTHONPATH": "/elsewhere"})
    assert not SHARED.joins(("run.ray_address=auto",), None)
    # what only the driver reads, or the instance's own CPU count, keeps a run joining
    assert SHARED.joins(("algo=ppo",), {"WALLE_CACHE_DIR": "/elsewhere"})
    assert SHARED.joins((f"run.ray_num_cpus={SHARED.cpus}",), None)
    assert not SHARED.joins((f"run.ray_num_cpus={SHARED.cpus + 1}",), None)
    monkeypatch.setenv("WALLE_RUNS_DIR", "/elsewhere")  # the driver's alone
    assert SHARED.joins(("algo=ppo",), None)
    monkeypatch.setenv("MY_SETTING", "1")
    assert not SHARED.joins(("algo=ppo",), None)
    assert SHARED.changed() == ["MY_SETTING", "WALLE_RUNS_DIR"]

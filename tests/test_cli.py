"""The real command line: help, composed config, smoke runs (local and Ray), resume, eval, errors."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from conftest import ROOT, make_cfg, run_cli

TINY = ["algo.batch_size=256", "algo.minibatch_size=64", "algo.epochs=2", "run.stop_at_return=null",
        "logger.progress=line", "run.checkpoint_every=2"]


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_help_lists_groups_and_options():
    out = run_cli("--help").stdout
    for text in ("algo: apex, apex_ddpg, bc, ddpg, dqn, es, impala, marwil, ppo, ppo_kl, td3",
                 "env: cartpole, custom, halfcheetah, hopper, othello, pendulum, pong, taxi", "32a4m4l", "local"):
        assert text in out


def test_cfg_job_prints_the_composed_config():
    out = run_cli("--cfg", "job", "env=halfcheetah", "topology=12a3m2l").stdout
    assert "id: HalfCheetah-v5" in out and "spec: 12a3m2l" in out and "hidden:" in out


@pytest.mark.parametrize("topology", ["local", "2a1m1l"])
def test_smoke_run_writes_metrics_and_checkpoint_and_resumes(tmp_path, topology):
    run_dir = tmp_path / "run"
    out = run_cli(f"topology={topology}", "run.total_env_steps=1024", f"hydra.run.dir={run_dir}",
                  *TINY).stdout
    assert f"results in {run_dir}" in out
    assert "tuned settings from conf/preset/ppo_cartpole.yaml apply" in out
    first = metrics(run_dir)
    assert [m["env_steps"] for m in first] == [256, 512, 768, 1024]
    for key in ("return", "collect_s", "learn_s", "collect_share", "learn_share", "env_steps_per_s",
                "episodes", "learn/policy_loss"):
        assert key in first[-1]
    assert (run_dir / "checkpoints" / "last.pt").is_file() and (run_dir / "config.yaml").is_file()

    out = run_cli(f"run.resume={run_dir}", "run.total_env_steps=1536").stdout
    assert "resumed at 1024 env steps" in out
    resumed = metrics(run_dir)[len(first):]
    assert [m["env_steps"] for m in resumed] == [1280, 1536]
    assert [m["iteration"] for m in resumed] == [5, 6]

    ev = run_cli("mode=eval", f"run.checkpoint={run_dir}/checkpoints/last.pt", "eval.episodes=3",
                 f"hydra.run.dir={tmp_path}/eval").stdout
    assert "eval CartPole-v1: 3 episodes, return" in ev and "±" in ev


@pytest.mark.parametrize("args,message", [
    (["env.id=NoSuchEnv-v0"], "unknown environment id 'NoSuchEnv-v0'"),
    (["topology=4a1m"], "'<A>a<M>m<L>l[<P>p]'"),
    (["algo.gamma=2"], "algo.gamma: must be in (0, 1]"),
    (["mode=eval", "run.checkpoint=/nonexistent.pt"], "does not exist"),
    (["learner.num_gpus=1", "topology=local"], "learner.num_gpus"),
    (["algo=dqn", "env=halfcheetah"], "DQN needs a discrete action space (gymnasium Discrete); "
                                      "this env has Box(-1.0, 1.0, (6,), float32)"),
    (["algo=td3", "env=pong"], "TD3 needs a continuous action space (a 1-D gymnasium Box); "
                               "this env has Discrete(6)"),
    (["algo=apex", "algo.replay_ratio=-1"], "algo.replay_ratio: must be positive"),
    (["algo=nosuch"], "algo=nosuch: no algo named 'nosuch' (choose from apex,"),
    (["topology=local", "run.totl_env_steps=5"],
     "run.totl_env_steps: run has no key 'totl_env_steps'; did you mean run.total_env_steps?"),
    (["+run.totl_env_steps=5"], "a key added with + would be read by nothing"),
    (["run.total_env_steps=lots"], "run.total_env_steps=lots: run.total_env_steps takes a whole "
                                   "number, e.g. run.total_env_steps=100000"),
    (["run.total_env_steps=-5"], "run.total_env_steps: must be positive"),
    (["env.envs_per_sampler=0"], "env.envs_per_sampler: must be positive"),
    (["run.max_restarts=-1"], "run.max_restarts: must be zero or positive"),
    (["algo=impala", "algo.replay=[{type: queue, ratio: 0.5}, {type: uniform, ratio: 0.25}]"],
     "algo.replay: the ratios sum to 0.75; they must sum to 1"),
    (["logger=tensorbord"], "no logger named 'tensorbord'; did you mean logger=tensorboard?"),
    (["topology=local", "++env.kwargs={sutton_barto_reward: true, colour: red}"],
     "env.kwargs: CartPole-v1 takes no argument 'colour'; remove env.kwargs.colour"),
])
def test_bad_input_is_a_clear_error_not_a_traceback(args, message):
    proc = run_cli(*args, "hydra.run.dir=/tmp/walle_ray_bad_input", check=False, timeout=120)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_gpus_missing_from_the_cluster_fail_fast(tmp_path):
    t0 = time.monotonic()
    proc = run_cli("learner.num_gpus=1", "topology=1a1m1l", f"hydra.run.dir={tmp_path}", check=False)
    assert proc.returncode == 2 and "the Ray cluster has 0" in proc.stderr
    assert time.monotonic() - t0 < 90


# SIGINT while running: tests/test_multinode.py and tests/test_auto.py end their runs with it.
@pytest.mark.parametrize("sig,when", [(signal.SIGTERM, "running"), (signal.SIGTERM, "starting")])
def test_signal_writes_checkpoint_and_metrics_then_exits(tmp_path, sig, when):
    """The signal goes to the run's whole process group, as Ctrl-C in a terminal or
    ``timeout`` sends it: Ray's local processes must outlive it while the driver saves."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "walle_ray", "topology=2a1m1l", "run.total_env_steps=10000000",
         f"hydra.run.dir={run_dir}", *TINY], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True)
    seen = []
    if when == "starting":  # the roles are being started: the plan line comes just before
        for line in proc.stdout:
            seen.append(line)
            if " CPUs: " in line or "Traceback" in line:
                break
    else:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
                (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 3):
            time.sleep(0.5)
    assert proc.poll() is None, "".join(seen)
    os.killpg(proc.pid, sig)
    t0 = time.monotonic()
    out, _ = proc.communicate(timeout=60)
    out = "".join(seen) + out
    assert time.monotonic() - t0 < 60
    assert proc.returncode == 128 + sig, out
    assert "stopped (signal)" in out and "no final checkpoint" not in out, out
    from walle_ray.runtime.checkpoint import load_checkpoint

    records = metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    last = records[-1] if records else {"env_steps": 0}  # stopped before its first iteration
    assert load_checkpoint(run_dir)["counters"]["env_steps"] == last["env_steps"]
    if when == "starting":
        assert "waiting for the roles to start" in out
    if sig == signal.SIGTERM and when == "running":  # and the run goes on from there
        more = last["env_steps"] + 512
        out = run_cli(f"run.resume={run_dir}", f"run.total_env_steps={more}").stdout
        assert f"resumed at {last['env_steps']} env steps" in out
        assert metrics(run_dir)[-1]["env_steps"] >= more


def test_resuming_with_another_env_or_network_shape_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    run_cli("topology=local", "run.total_env_steps=512", f"hydra.run.dir={run_dir}", *TINY)
    # neither a refused command nor an evaluation leaves a run directory behind
    runs = tmp_path / "runs"
    for command in (["algo.lr=-1"], ["mode=eval", f"run.checkpoint={run_dir}", "eval.episodes=1"]):
        run_cli(*command, env={"WALLE_RUNS_DIR": str(runs)}, check=False, timeout=120)
        assert not list(runs.iterdir()), command
    for change, message in ((["env.id=Acrobot-v1"], "was trained on env.id='CartPole-v1', not 'Acrobot-v1'"),
                            (["model.hidden=[32]"], "does not fit this model")):
        proc = run_cli(f"run.resume={run_dir}", *change, check=False, timeout=120)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert message in proc.stderr and "Traceback" not in proc.stderr


def test_resuming_with_another_algorithm_is_refused_before_any_role_starts():
    from walle_ray.runtime.checkpoint import CheckpointError
    from walle_ray.runtime.start import check_resume

    cfg = make_cfg("algo=impala", "env.action_mask=none")
    ppo = {"config": {"algo": {"name": "ppo"}, "env": {"id": "CartPole-v1", "entry_point": None,
                                                       "action_mask": "none"}}}
    with pytest.raises(CheckpointError, match=r"^checkpoint in runs/x was trained with algo=ppo, "
                                              r"not impala; resume it with algo=ppo"):
        check_resume(cfg, ppo, "runs/x")
    ppo["config"]["algo"]["name"] = "impala"
    check_resume(cfg, ppo, "runs/x")


def test_resuming_with_another_optimizer_is_refused():
    """A CartPole IMPALA run checkpointed while its preset used Adam, resumed now that it
    uses AMSGrad: torch would keep the checkpoint's Adam while the config says AMSGrad."""
    from walle_ray.runtime.checkpoint import CheckpointError
    from walle_ray.runtime.start import check_resume

    cfg = make_cfg("algo=impala", "env=cartpole")
    assert cfg.algo.optimizer == "amsgrad"
    adam = {"config": {"algo": {"name": "impala", "optimizer": "adam"},
                       "env": {"id": "CartPole-v1", "entry_point": None, "action_mask": "auto"}}}
    with pytest.raises(CheckpointError, match=r"^checkpoint in runs/x was trained with "
                                              r"algo\.optimizer=adam, not amsgrad; resume it with "
                                              r"algo\.optimizer=adam$"):
        check_resume(cfg, adam, "runs/x")
    check_resume(make_cfg("algo=impala", "env=cartpole", "algo.optimizer=adam"), adam, "runs/x")


def tree(folder):
    """Every file under ``folder`` (``.hydra/`` too) and its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_two_seeds_started_at_once_under_one_name_get_directories_of_their_own(tmp_path):
    """As two seeds started in the same second do with the default name."""
    name = f"hydra.run.dir=${{walle_new_dir:{tmp_path}/same}}"
    procs = [subprocess.Popen([sys.executable, "-m", "walle_ray", "topology=local",
                               "run.total_env_steps=512", f"run.seed={seed}", name, *TINY],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for seed in (1, 2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    from walle_ray.runtime.checkpoint import load_checkpoint

    dirs = sorted(tmp_path.iterdir())
    assert [d.name for d in dirs] == ["same", "same-2"]
    seeds = set()
    for run_dir in dirs:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert load_checkpoint(run_dir)["config"]["run"]["seed"] == config["run"]["seed"]
        assert [m["env_steps"] for m in metrics(run_dir)] == [256, 512]
        seeds.add(config["run"]["seed"])
    assert seeds == {1, 2}


def test_a_run_directory_given_again_without_resume_is_refused_and_left_intact(tmp_path):
    run_dir = tmp_path / "run"
    run_cli("topology=local", "run.total_env_steps=512", f"hydra.run.dir={run_dir}", *TINY)
    before = tree(run_dir)
    proc = run_cli("topology=local", "run.total_env_steps=512", "run.seed=3",
                   f"hydra.run.dir={run_dir}", *TINY, check=False, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert (f"walle_ray: error: run directory {run_dir} already holds a run (checkpoints, "
            f"config.yaml, metrics.jsonl, overrides.yaml, ...); continue it with "
            f"run.resume={run_dir}, or choose another directory") in proc.stderr
    assert tree(run_dir) == before


def test_resuming_after_a_kill_writes_each_iteration_once(tmp_path):
    """A run killed after its checkpoint at iteration 4 had written iterations 5 and 6 and
    half of 7; the files the resumed run rewrites are replaced whole."""
    run_dir = tmp_path / "run"
    run_cli("topology=local", "run.total_env_steps=1024", f"hydra.run.dir={run_dir}", *TINY)
    first = metrics(run_dir)
    assert [m["iteration"] for m in first] == [1, 2, 3, 4]
    with open(run_dir / "metrics.jsonl", "a") as f:
        for it in (5, 6):
            f.write(json.dumps({**first[-1], "iteration": it, "env_steps": 256 * it}) + "\n")
        f.write('{"iteration": 7, "env_st')
    held = {}
    for name in ("config.yaml", "overrides.yaml", "report.json"):  # as a reader holds them
        held[name] = tmp_path / f"held-{name}"
        os.link(run_dir / name, held[name])
    kept = {name: path.read_bytes() for name, path in held.items()}

    out = run_cli(f"run.resume={run_dir}", "run.total_env_steps=1536").stdout
    assert "resumed at 1024 env steps, iteration 4" in out
    assert "metrics.jsonl: 3 line(s) after the checkpoint dropped" in out
    records = metrics(run_dir)
    assert [m["iteration"] for m in records] == [1, 2, 3, 4, 5, 6]
    assert [m["env_steps"] for m in records] == [256, 512, 768, 1024, 1280, 1536]
    assert {name: path.read_bytes() for name, path in held.items()} == kept
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["run"]["total_env_steps"] == 1536
    assert json.loads((run_dir / "report.json").read_text())["run"]["segments"] == 2


def test_a_signal_during_the_teardown_after_the_run_exits_quietly():
    """After the run has written everything, Ctrl-C during Ray's shutdown at exit (here an
    atexit callback that sleeps) ends the process at once, with the run's exit code."""
    code = ("import atexit, os, signal, threading, time\n"
            "from walle_ray.__main__ import quiet_teardown\n"
            "atexit.register(time.sleep, 20)\n"
            "quiet_teardown(0)\n"
            "threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert time.monotonic() - started < 15

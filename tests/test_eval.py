"""Evaluation: mode=eval on checkpoints of tiny real runs, the reusable Evaluator, MP4 videos."""

import os
import subprocess
import sys

import imageio_ffmpeg
import pytest
from omegaconf import OmegaConf

from walle_ray.runtime.checkpoint import load_checkpoint
from walle_ray.runtime.evaluate import Evaluator, evaluate
from walle_ray.runtime.train import train

from conftest import ROOT, make_cfg

TINY_PPO = ["topology=local", "algo.epochs=1", "algo.minibatch_size=32", "run.stop_at_return=null",
            "logger.progress=off"]


def trained_run(tmp_path_factory, name: str, *overrides: str):
    """The run directory of a tiny real training run."""
    run_dir = tmp_path_factory.mktemp(name)
    train(make_cfg(*overrides), run_dir)
    return run_dir


def evaluator_inputs(run_dir):
    """What training would hand an Evaluator: the run's config and its newest weights."""
    ckpt = load_checkpoint(run_dir)
    weights = {k: v.numpy() for k, v in ckpt["learner"]["model"].items()}
    return OmegaConf.create(ckpt["config"]), weights


def eval_cfg(run_dir, *overrides: str):
    return make_cfg("mode=eval", f"run.checkpoint={run_dir}/checkpoints/last.pt", *overrides)


def mp4_frames(path) -> tuple[tuple[int, int], int]:
    """(width, height) and number of frames of an MP4, checking it is one."""
    assert path.read_bytes()[4:8] == b"ftyp", f"{path} is not an MP4"
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    return tuple(meta["size"]), sum(1 for _ in reader)


@pytest.fixture(scope="module")
def ppo_cartpole(tmp_path_factory):
    return trained_run(tmp_path_factory, "ppo_cartpole", *TINY_PPO, "algo.batch_size=256",
                       "run.total_env_steps=512")


@pytest.mark.parametrize("episodes", [0, -2])
def test_eval_mode_refuses_episodes_below_one(ppo_cartpole, episodes):
    from walle_ray.config import ConfigError

    with pytest.raises(ConfigError, match=rf"^eval.episodes: got {episodes}; use a positive"):
        evaluate(eval_cfg(ppo_cartpole, f"eval.episodes={episodes}"))


def test_eval_mode_reports_exactly_the_requested_episodes(ppo_cartpole, capsys):
    result = evaluate(eval_cfg(ppo_cartpole, "eval.episodes=3"))
    assert result["episodes"] == 3 and len(result["returns"]) == 3 and result["videos"] == []
    assert result["returns"] == result["lengths"]  # CartPole pays 1 per step
    assert "walle_ray: eval CartPole-v1: 3 episodes, return" in capsys.readouterr().out
    assert not (ppo_cartpole / "videos").exists()


def test_eval_mode_writes_one_mp4_per_episode_into_the_run_directory(ppo_cartpole, capsys):
    pytest.importorskip("pygame", reason="classic-control rendering needs pygame")
    result = evaluate(eval_cfg(ppo_cartpole, "eval.episodes=3", "eval.video=true"))
    videos = sorted((ppo_cartpole / "videos").iterdir())
    assert [v.name for v in videos] == ["episode-000.mp4", "episode-001.mp4", "episode-002.mp4"]
    assert result["videos"] == [str(v) for v in videos]
    for video, length in zip(videos, result["lengths"]):
        assert mp4_frames(video) == ((600, 400), length + 1)  # the reset, then every step
    assert f"3 videos in {ppo_cartpole / 'videos'}" in capsys.readouterr().out


def test_evaluator_runs_again_from_a_fresh_reset(ppo_cartpole):
    _, weights = evaluator_inputs(ppo_cartpole)
    evaluator = Evaluator(make_cfg(*TINY_PPO), seed=3)  # as training builds it: from its own config
    try:
        first = evaluator.run(weights, version=1, episodes=2)
        second = evaluator.run(weights, version=2, episodes=3)
    finally:
        evaluator.close()
    assert first["episodes"] == 2 and second["episodes"] == 3 and second["version"] == 2
    # Same seed and a greedy policy: the second run replays the first run's episodes.
    assert second["returns"][:2] == first["returns"]


def test_a_replay_algorithm_checkpoint_runs_through_the_evaluator(tmp_path_factory):
    run_dir = trained_run(tmp_path_factory, "dqn_cartpole", "algo=dqn", "topology=local",
                          "algo.hidden=[32]", "algo.learning_starts=100",
                          "run.total_env_steps=300", "run.stop_at_return=null",
                          "logger.progress=off")
    trained, weights = evaluator_inputs(run_dir)
    for deterministic in (True, False):
        evaluator = Evaluator(trained, seed=1, deterministic=deterministic)
        try:
            result = evaluator.run(weights, version=7, episodes=4)
        finally:
            evaluator.close()
        assert result["episodes"] == 4 and all(r > 0 for r in result["returns"])
        assert result["videos"] == []


def test_atari_videos_show_the_agents_view_and_are_rewritten_each_run(tmp_path_factory, tmp_path):
    run_dir = trained_run(tmp_path_factory, "ppo_pong", "env=pong", *TINY_PPO,
                          "env.envs_per_sampler=2", "env.max_episode_steps=30",
                          "algo.batch_size=64", "run.total_env_steps=64")
    result = evaluate(eval_cfg(run_dir, "eval.episodes=2", "eval.video=true",
                               f"eval.video_dir={tmp_path}"))
    assert result["lengths"] == [30, 30]
    assert [mp4_frames(tmp_path / f"episode-00{i}.mp4") for i in (0, 1)] == [((168, 168), 31)] * 2

    trained, weights = evaluator_inputs(run_dir)
    evaluator = Evaluator(trained, seed=0, video_dir=tmp_path / "again")
    try:
        for episodes in (2, 1):
            result = evaluator.run(weights, version=0, episodes=episodes)
            assert len(result["videos"]) == episodes
    finally:
        evaluator.close()
    assert mp4_frames(tmp_path / "again" / "episode-000.mp4") == ((168, 168), 31)


@pytest.fixture(scope="module")
def ppo_halfcheetah(tmp_path_factory):
    return trained_run(tmp_path_factory, "ppo_halfcheetah", "env=halfcheetah", *TINY_PPO,
                       "env.max_episode_steps=20", "algo.batch_size=64", "run.total_env_steps=64",
                       "algo.compile=false")  # its preset compiles; one update does not pay


def test_mujoco_evaluates_without_video(ppo_halfcheetah):
    trained, weights = evaluator_inputs(ppo_halfcheetah)
    evaluator = Evaluator(trained, seed=0)
    try:
        assert evaluator.run(weights, version=0, episodes=2)["lengths"] == [20, 20]
    finally:
        evaluator.close()


@pytest.mark.skipif(sys.platform != "linux", reason="glfw needs an X11 or Wayland display only on Linux")
def test_mujoco_video_without_an_offscreen_backend_is_a_clear_error(ppo_halfcheetah, tmp_path):
    # glfw, MuJoCo's default, cannot open a context without a display: the usual headless failure.
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["MUJOCO_GL"] = "glfw"
    proc = subprocess.run(
        [sys.executable, "-m", "walle_ray", "mode=eval", f"run.checkpoint={ppo_halfcheetah}",
         "eval.video=true", "eval.episodes=1", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert ("walle_ray: error: eval.video: MuJoCo needs an offscreen OpenGL backend to render "
            "HalfCheetah-v5; set MUJOCO_GL=egl") in proc.stderr
    assert "MUJOCO_GL=osmesa (apt install libosmesa6), or run with eval.video=false" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (ppo_halfcheetah / "videos").exists()

"""walle_ray.plot: curves, baseline, timing figure and errors, from fake run directories."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from walle_ray.plot import main, mean_curve, moving_average

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_run(run_dir, seed=0, iterations=6, sync=True, returns=True):
    """A run directory as training leaves it: config.yaml and metrics.jsonl with a torn last line."""
    run_dir.mkdir(parents=True)
    algo, topology = ("ppo", "8a1m1l") if sync else ("impala", "4a1m1l")
    (run_dir / "config.yaml").write_text(
        f"algo:\n  name: {algo}\nenv:\n  name: halfcheetah\n"
        f"run:\n  seed: {seed}\ntopology:\n  spec: {topology}\n")
    lines = []
    for i in range(1, iterations + 1):
        record = {"iteration": i, "env_steps": 1000 * i, "wall_s": (2.0 + 0.3 * seed) * i,
                  "return": 10.0 * i + seed if returns and i > 1 else None,
                  "env_steps_per_s": 500.0 - seed, "episodes": 3 * i}
        if sync:
            record.update(collect_s=1.5, learn_s=0.5 + 0.1 * i, iter_s=2.0 + 0.1 * i,
                          collect_share=0.7, learn_share=0.3)
        else:
            record.update(updates_per_s=4.0, policy_lag_mean=1.5, learner_busy=0.9,
                          batch_wait_s=0.01)
            if i % 2 == 0:
                record["eval/return"] = 5.0 * i
        lines.append(json.dumps(record))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + '\n{"iteration": 7, "env_')
    return run_dir


@pytest.fixture
def runs(tmp_path):
    """A multirun directory of two PPO seeds and one IMPALA run."""
    write_run(tmp_path / "multirun" / "0", seed=0)
    write_run(tmp_path / "multirun" / "1", seed=1, iterations=5)
    write_run(tmp_path / "impala", sync=False)
    return tmp_path


def assert_png(path):
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 1000


def plot_error(capsys, *argv):
    """Run main in-process; return the error line it printed, after checking exit status 2."""
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_moving_average_averages_trailing_points():
    assert moving_average(np.array([1.0, 3.0, 5.0, 7.0]), 2).tolist() == [1.0, 2.0, 4.0, 6.0]
    assert moving_average(np.array([1.0, 3.0]), 1).tolist() == [1.0, 3.0]


def test_mean_curve_covers_the_shared_range():
    a = (np.array([0.0, 10.0]), np.array([0.0, 10.0]))
    b = (np.array([0.0, 5.0]), np.array([2.0, 7.0]))
    grid, mean, std = mean_curve([a, b])
    assert grid.tolist() == [0.0, 5.0]
    assert mean.tolist() == [1.0, 6.0] and std.tolist() == [1.0, 1.0]
    assert mean_curve([a])[2] is None


def test_module_draws_a_group_over_a_baseline(runs):
    out = runs / "figs" / "cmp.png"
    proc = subprocess.run([sys.executable, "-m", "walle_ray.plot", str(runs / "multirun"),
                           "--baseline", str(runs / "impala"), "-o", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    assert_png(out)


def test_wall_clock_x_with_smoothing_and_labels(runs, capsys):
    out = runs / "wall.png"
    main([str(runs / "multirun" / "0"), str(runs / "multirun" / "1"), "--x", "wall_s",
          "--smooth", "3", "--label", "ours", "--title", "HalfCheetah", "-o", str(out)])
    assert capsys.readouterr().out.strip() == str(out)
    assert_png(out)


def test_a_key_on_some_records_only(runs):
    out = runs / "eval.png"
    main([str(runs / "impala"), "--y", "eval/return", "-o", str(out)])
    assert_png(out)


def test_timing_figure_for_a_group_and_a_baseline(runs):
    out = runs / "timing.png"
    main([str(runs / "multirun"), "--baseline", str(runs / "multirun" / "0"), "--timing",
          "-o", str(out)])
    assert_png(out)


def test_module_error_exits_2_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "walle_ray.plot", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"walle_ray.plot: error: {tmp_path} is not a run directory")
    assert "Traceback" not in proc.stderr


def test_unknown_key_lists_the_numeric_keys(runs, capsys):
    err = plot_error(capsys, runs / "multirun", "--y", "retrun")
    assert "walle_ray.plot: error: no record has the key 'retrun'" in err
    assert "env_steps_per_s" in err and "collect_s" in err


def test_no_points_to_draw(tmp_path, capsys):
    write_run(tmp_path / "early", returns=False)
    err = plot_error(capsys, tmp_path / "early")
    assert "walle_ray.plot: error: no points to draw" in err


def test_timing_needs_a_synchronous_run(runs, capsys):
    err = plot_error(capsys, runs / "impala", "--timing")
    assert "walle_ray.plot: error:" in err and "has no collect_s" in err


def test_missing_directory(tmp_path, capsys):
    err = plot_error(capsys, tmp_path / "nope")
    assert "walle_ray.plot: error:" in err and "is not a directory" in err

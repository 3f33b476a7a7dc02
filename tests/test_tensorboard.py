"""TensorBoard logging: ``logger=tensorboard`` writes metrics.jsonl's numbers as event files
in <run dir>/tensorboard, a resumed run adds to them, and it combines with W&B."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import make_cfg, run_cli
from walle_ray.algos import validate
from walle_ray.config import ConfigError

RUN = ("topology=local", "logger=tensorboard", "algo.batch_size=512", "algo.epochs=1",
       "logger.progress=off")


def jsonl_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    """Every numeric key of metrics.jsonl: [(env_steps, value as float32)] in record order."""
    out: dict[str, list] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key, value in record.items():
            if type(value) in (int, float) and math.isfinite(value):  # null for NaN, no bools
                out.setdefault(key, []).append((record["env_steps"], float(np.float32(value))))
    return out


def event_files(run_dir) -> EventAccumulator:
    events = EventAccumulator(str(run_dir / "tensorboard"),
                              size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    return events


def event_scalars(events: EventAccumulator) -> dict[str, list[tuple[int, float]]]:
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_event_files_hold_the_metrics_records(tmp_path):
    run_dir = tmp_path / "run"
    out = run_cli(*RUN, "run.total_env_steps=1536", f"hydra.run.dir={run_dir}").stdout
    assert out.count(f"tensorboard --logdir {(run_dir / 'tensorboard').resolve()}") == 1
    events = event_files(run_dir)
    expected = jsonl_scalars(run_dir)
    assert len(expected["env_steps"]) == 3 and "learn/policy_loss" in expected
    assert event_scalars(events) == expected
    # the config, once, and the run's time and cost at its end
    assert sorted(events.Tags()["tensors"]) == ["config/text_summary", "summary/text_summary"]
    summary = events.Tensors("summary/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| minutes |" in summary and "| core_hours |" in summary
    config = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "envs_per_sampler: 4" in config
    assert [e.step for e in events.Images("timing")] == [1536]  # the end-of-run timing figure
    assert (run_dir / "timing.png").is_file()


def test_a_resumed_run_appends_to_the_same_directory(tmp_path):
    run_dir = tmp_path / "run"
    run_cli(*RUN, "run.total_env_steps=1024", f"hydra.run.dir={run_dir}")
    run_cli(f"run.resume={run_dir}", "run.total_env_steps=2048")
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2
    events = event_files(run_dir)
    scalars = event_scalars(events)
    assert [step for step, _ in scalars["env_steps"]] == [512, 1024, 1536, 2048]
    assert scalars == jsonl_scalars(run_dir)
    assert len(events.Tensors("config/text_summary")) == 1


def test_a_run_resumed_from_before_its_last_records_shows_each_step_once(tmp_path):
    """A run that died after its last checkpoint resumes from it: TensorBoard hides the
    steps the files hold past it, as metrics.jsonl drops their lines, and shows the resumed
    run's in their place, each step once (without it: 1536 and 2048 twice)."""
    run_dir = tmp_path / "run"
    run_cli(*RUN, "run.total_env_steps=1024", f"hydra.run.dir={run_dir}")
    last = run_dir / "checkpoints" / "last.pt"
    saved = last.read_bytes()
    run_cli(f"run.resume={run_dir}", "run.total_env_steps=2048")
    last.write_bytes(saved)  # as if it had died before the checkpoint at 2048
    out = run_cli(f"run.resume={run_dir}", "run.total_env_steps=2048").stdout
    assert "metrics.jsonl: 2 line(s) after the checkpoint dropped" in out
    scalars = event_scalars(event_files(run_dir))
    assert [step for step, _ in scalars["env_steps"]] == [512, 1024, 1536, 2048]
    assert scalars == jsonl_scalars(run_dir)


@pytest.mark.parametrize("choice, name, tensorboard", [
    ("logger=tensorboard", "console", True), ("logger=[wandb,tensorboard]", "wandb", True),
    ("logger=[tensorboard,wandb]", "wandb", True), ("logger=wandb", "wandb", False),
    ("logger=console", "console", False)])
def test_tensorboard_alone_or_beside_wandb(choice, name, tensorboard):
    cfg = make_cfg(choice)
    assert (cfg.logger.name, cfg.logger.tensorboard) == (name, tensorboard)
    validate(cfg)


def test_logger_name_tensorboard_points_to_the_option():
    with pytest.raises(ConfigError, match=r"logger\.name: .*logger=tensorboard"):
        validate(make_cfg("logger.name=tensorboard"))

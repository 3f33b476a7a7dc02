"""``python -m walle_ray [group=option ...] [key=value ...]``: the Hydra entry point."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from walle_ray.algos import register_configs

from walle_ray.config import CONF_DIR, ConfigError
from walle_ray.runtime.override_keys import check_overrides
from walle_ray.runtime.args import (announce_preset, check_named_run_dir, checked_config_dirs,
                                    rewrite_args, searchpath_override, user_config_dirs)


def _task(cfg: DictConfig) -> None:
    from walle_ray.actors.restart import SamplerFailed
    from walle_ray.learners.guard import NonFiniteUpdate
    from walle_ray.runtime.checkpoint import CheckpointError
    from walle_ray.runtime.evaluate import evaluate
    from walle_ray.runtime.fleet import RoleError
    from walle_ray.runtime.run_dir import remove_unused
    from walle_ray.runtime.train import train

    hydra_cfg = HydraConfig.get()
    output_dir = Path(hydra_cfg.runtime.output_dir)
    named = any(o.startswith("hydra.run.dir=") for o in hydra_cfg.overrides.hydra)

    def tidy() -> None:
        """The directory walle_new_dir made for this command, where it holds only Hydra's
        files: a directory the user named is theirs."""
        if not named:
            remove_unused(output_dir)

    try:
        if cfg.mode == "eval":  # what it writes goes beside the checkpoint
            evaluate(cfg)
            tidy()
            return
        if cfg.mode == "collect":  # to collect.out
            from walle_ray.runtime.collect import collect

            collect(cfg)
            tidy()
            return
        dirs = [Path(s.path) for s in hydra_cfg.runtime.config_sources if s.schema == "file"]
        announce_preset(hydra_cfg.runtime.choices.get("preset"), dirs)
        stored = list(hydra_cfg.overrides.task)  # for run.resume, with the user's config dirs
        users = [d.resolve() for d in dirs if d.resolve() != CONF_DIR]
        if users:
            stored.append(searchpath_override(users))
        result = train(cfg, output_dir, stored)
        if hydra_cfg.mode == RunMode.RUN:  # a sweep's next job takes signals as its own
            quiet_teardown(result.exit_code)
    except (ConfigError, CheckpointError, RoleError, SamplerFailed, NonFiniteUpdate) as exc:
        tidy()  # a refused command leaves no empty run directory
        print(f"walle_ray: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    if result.exit_code:
        sys.exit(result.exit_code)


def quiet_teardown(exit_code: int) -> None:
    """Once the run has written its checkpoint, metrics and report, Ctrl-C or SIGTERM during
    Ray's shutdown at exit ends the process at once, with the run's exit code, rather than
    with a traceback from inside Ray."""
    def leave(signum, frame) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, RuntimeError, ValueError):  # closed, or a write it interrupted
                pass
        os._exit(exit_code)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, leave)


def main() -> None:
    if not (CONF_DIR / "config.yaml").is_file():
        sys.exit(f"walle_ray: error: no configs at {CONF_DIR}; the package is incomplete, "
                 "reinstall it")
    args = sys.argv[1:]
    try:
        dirs = checked_config_dirs(user_config_dirs(args), "--config-dir")
        sys.argv = [sys.argv[0], *rewrite_args(args, [CONF_DIR, *dirs])]
        check_overrides(sys.argv[1:], [CONF_DIR, *dirs])
        check_named_run_dir(sys.argv[1:])
    except ConfigError as exc:
        sys.exit(f"walle_ray: error: {exc}")
    register_configs()
    hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")(_task)()


if __name__ == "__main__":
    main()

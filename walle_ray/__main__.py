"""``python -m walle_ray [group=option ...] [key=value ...]``: the Hydra entry point."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from walle_ray.config import ConfigError, register_configs
from walle_ray.runtime.args import rewrite_args

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def _task(cfg: DictConfig) -> None:
    from walle_ray.actors.restart import SamplerFailed
    from walle_ray.learners.guard import NonFiniteUpdate
    from walle_ray.runtime.checkpoint import CheckpointError
    from walle_ray.runtime.evaluate import evaluate
    from walle_ray.runtime.fleet import RoleError
    from walle_ray.runtime.train import train

    try:
        if cfg.mode == "eval":
            evaluate(cfg)
            return
        hydra_cfg = HydraConfig.get()
        preset = hydra_cfg.runtime.choices.get("preset")
        if preset and (CONF_DIR / "preset" / f"{preset}.yaml").is_file():
            print(f"walle_ray: tuned settings from conf/preset/{preset}.yaml apply "
                  "(~preset runs without them)", flush=True)
        result = train(cfg, Path(hydra_cfg.runtime.output_dir), list(hydra_cfg.overrides.task))
    except (ConfigError, CheckpointError, RoleError, SamplerFailed, NonFiniteUpdate) as exc:
        print(f"walle_ray: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    if result.exit_code:
        sys.exit(result.exit_code)


def main() -> None:
    if not (CONF_DIR / "config.yaml").is_file():
        sys.exit(f"walle_ray: error: no configs at {CONF_DIR}; install with `pip install -e .` "
                 "from a checkout so conf/ sits beside the package")
    try:
        sys.argv = [sys.argv[0], *rewrite_args(sys.argv[1:], CONF_DIR)]
    except ConfigError as exc:
        sys.exit(f"walle_ray: error: {exc}")
    register_configs()
    hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")(_task)()


if __name__ == "__main__":
    main()

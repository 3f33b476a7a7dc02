"""Weights & Biases: the run's config, every metrics record and the run's media (evaluation
videos, the timing figure), online or offline.

Online when a W&B key is configured (``WANDB_API_KEY`` or a netrc entry for the W&B host),
otherwise offline into the run directory, so a run never waits on a login prompt or on a
network that is not there. ``WANDB_MODE`` in the environment (as ``wandb agent`` and CI set
it) wins over both.
"""

from __future__ import annotations

import math
import netrc
import os
from pathlib import Path
from urllib.parse import urlparse

from omegaconf import DictConfig

from walle_ray.config import to_container

_ID_FILE = "wandb_run_id"  # a resumed run continues the same W&B run


def has_wandb_key() -> bool:
    """True when W&B can log in without asking: an API key in the environment or in netrc."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_mode(configured: str) -> str:
    """online | offline | disabled, from WANDB_MODE, then logger.mode (auto: by the key)."""
    mode = os.environ.get("WANDB_MODE") or configured
    if mode == "dryrun":  # W&B's older name for offline
        return "offline"
    if mode == "auto":
        return "online" if has_wandb_key() else "offline"
    return mode


class WandbSink:
    """Logs each metrics record as one W&B step; ``env_steps`` is the x-axis of every chart."""

    def __init__(self, cfg: DictConfig, run_dir: Path, resumed: bool):
        import wandb

        self.wandb = wandb
        self.run_dir = Path(run_dir)
        id_file = self.run_dir / _ID_FILE
        run_id = id_file.read_text().strip() if resumed and id_file.is_file() else None
        self.mode = wandb_mode(cfg.logger.mode)
        log = cfg.logger
        self.run = wandb.init(
            project=log.project, entity=log.entity, group=log.group, tags=list(log.tags) or None,
            name=log.run_name or self.run_dir.name, dir=str(self.run_dir), id=run_id,
            resume="allow" if run_id else None, config=to_container(cfg), mode=self.mode,
            settings=wandb.Settings(init_timeout=log.init_timeout_s, console="off",
                                    x_disable_stats=True, quiet=True))
        id_file.write_text(self.run.id)
        self.run.define_metric("env_steps")
        self.run.define_metric("*", step_metric="env_steps")
        where = "offline" if self.mode == "offline" else self.run.url
        print(f"walle_ray: wandb run {self.run.id} ({where})", flush=True)

    def write(self, record: dict) -> None:
        self.run.log({k: v for k, v in record.items()
                      if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))})

    def summary(self, values: dict) -> None:
        """The run's end figures (milestones, cost) in the W&B run's summary."""
        self.run.summary.update(values)

    def media(self, step: int, images: dict | None = None, videos: dict | None = None) -> None:
        """Each image (a PNG path) as a ``wandb.Image`` and each list of MP4 paths as
        ``wandb.Video``s under its name, in one W&B step at ``step`` env steps."""
        data = {name: self.wandb.Image(str(path)) for name, path in (images or {}).items()}
        data.update({name: [self.wandb.Video(str(path)) for path in paths]
                     for name, paths in (videos or {}).items() if paths})
        if data:
            self.run.log({"env_steps": step, **data})

    def close(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)
        if self.mode == "offline":
            print(f"walle_ray: wandb run saved offline; upload it with: wandb sync "
                  f"{Path(self.run.dir).parent}", flush=True)

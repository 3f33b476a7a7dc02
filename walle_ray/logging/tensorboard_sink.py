"""TensorBoard: every metrics record as scalars, the config as text, and images, in
``<run dir>/tensorboard`` (``logger=tensorboard``, or ``logger=[wandb,tensorboard]``)."""

from __future__ import annotations

import math
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


def is_scalar(value) -> bool:
    """A finite int or float, not a bool: what metrics.jsonl holds as a number."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


class TensorBoardSink:
    """Each record's numeric values as scalars of the same names, at ``env_steps``.

    A new run writes its config as text (``config``) once; a resumed run adds an event file
    to the same directory, which TensorBoard reads as one run, and hides what the files
    before it hold past its checkpoint's step (``purge_step``), as metrics.jsonl drops its
    lines after the checkpoint: the resumed run writes those steps again. Each record is
    flushed, as metrics.jsonl's lines are. Evaluation videos are not written here: TensorBoard's own
    video format needs moviepy; the MP4s stay under the run's ``videos/``.
    """

    def __init__(self, cfg: DictConfig, run_dir: Path, resumed_at: int | None):
        """``resumed_at``: the env steps of the checkpoint a resumed run starts from."""
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(run_dir) / "tensorboard"
        purge = None if resumed_at is None else resumed_at + 1
        self.writer = SummaryWriter(str(self.log_dir), purge_step=purge)
        if resumed_at is None:
            text = OmegaConf.to_yaml(cfg, resolve=True)
            # four spaces make a Markdown code block, which keeps the YAML's indentation
            self.writer.add_text("config", "".join(f"    {line}\n" for line in text.splitlines()))
            self.writer.flush()
        print(f"walle_ray: tensorboard event files in {self.log_dir.resolve()}; view them with: "
              f"tensorboard --logdir {self.log_dir.resolve()}", flush=True)

    def write(self, record: dict) -> None:
        step = int(record["env_steps"])
        for key, value in record.items():
            if is_scalar(value):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def summary(self, values: dict) -> None:
        """The run's end figures (milestones, cost) as a text table (``summary``); each
        milestone's figures are also scalars at the step where it was reached."""
        rows = "".join(f"| {key} | {value:.4g} |\n" for key, value in sorted(values.items()))
        self.writer.add_text("summary", "| figure | value |\n|---|---|\n" + rows)
        self.writer.flush()

    def media(self, step: int, images: dict | None = None, videos: dict | None = None) -> None:
        """Each image (a PNG path) under its name at ``step``; videos are left out."""
        if not images:
            return
        from matplotlib.image import imread

        for name, path in images.items():
            self.writer.add_image(name, imread(str(path))[..., :3], step, dataformats="HWC")
        self.writer.flush()

    def close(self, exit_code: int = 0) -> None:
        self.writer.close()

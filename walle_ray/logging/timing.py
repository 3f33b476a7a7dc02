"""The end of a synchronous run: WALL-E's collection-vs-learning figure, for the sinks."""

from __future__ import annotations

from pathlib import Path

from walle_ray.logging.metrics import read_metrics


def timing_image(run_dir: Path, sinks) -> None:
    """Draw the per-iteration collect/learn split of the whole run (every record of its
    metrics.jsonl, a resumed run's earlier ones included) into ``<run dir>/timing.png``,
    as ``python -m walle_ray.plot RUN_DIR --timing`` does, and hand it to ``sinks.media`` as
    the image ``timing`` at the last record's env steps. Runs without collect_s/learn_s
    (asynchronous algorithms collect and learn at once) get no figure."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir / "metrics.jsonl")
    if not any("collect_s" in r and "learn_s" in r for r in records):
        return
    import matplotlib.pyplot as plt

    from walle_ray.plot import load_group, timing_figure

    fig = timing_figure([load_group([str(run_dir)], None)])
    path = run_dir / "timing.png"
    try:
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
    sinks.media(int(records[-1]["env_steps"]), images={"timing": path})

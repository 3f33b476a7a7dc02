"""``python -m walle_ray.plot RUN_DIR ... [--baseline RUN_DIR ...] -o fig.png``: figures from runs.

WALL-E's three figures, read from each run's metrics.jsonl: a learning curve averaged over the
seeds of one setting (plotcurve), the same with a baseline group overlaid (plotcurve_cmp), and
the share of each iteration spent collecting vs learning (the time-percentage figure,
``--timing``).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # figures go to files; never open a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import PercentFormatter  # noqa: E402
import yaml  # noqa: E402

from walle_ray.logging.metrics import read_metrics  # noqa: E402

X_LABELS = {"env_steps": "environment steps", "wall_s": "wall-clock time (s)"}
COLORS = ("C0", "C3")  # the group, then the baseline


class PlotError(Exception):
    """Inputs that cannot be drawn; reported as one line with exit status 2."""


@dataclass
class Group:
    """The runs of one setting (usually its seeds), drawn as one mean line."""

    label: str
    runs: list[Path]
    records: list[list[dict]]  # metrics.jsonl of each run, in the order of ``runs``


def find_runs(dirs: list[Path]) -> list[Path]:
    """The run directories in ``dirs``; a Hydra multirun directory stands for its runs (0/, 1/, ...)."""
    runs = []
    for d in dirs:
        if not d.is_dir():
            raise PlotError(f"{d} is not a directory")
        if (d / "metrics.jsonl").is_file():
            runs.append(d)
            continue
        children = [c for c in sorted(d.iterdir()) if (c / "metrics.jsonl").is_file()]
        if not children:
            raise PlotError(f"{d} is not a run directory (no metrics.jsonl in it or in the "
                            "directories directly under it)")
        runs.extend(children)
    return runs


def config_label(run: Path) -> str | None:
    """'ppo halfcheetah 8a1m1l' from the run's config.yaml, read as plain data (a run writes it
    resolved); None when it has none to read."""
    try:
        cfg = yaml.safe_load((run / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    parts = [_get(cfg, key) for key in ("algo.name", "env.name", "topology.spec")]
    return " ".join(str(p) for p in parts) if None not in parts else None


def _get(tree, dotted: str):
    for name in dotted.split("."):
        tree = tree.get(name) if isinstance(tree, dict) else None
    return tree


def load_group(dirs: list[str], label: str | None) -> Group:
    """Read every run under ``dirs``; the label defaults to their settings, else the dir names."""
    paths = [Path(d) for d in dirs]
    runs = find_runs(paths)
    if label is None:
        labels = [config_label(r) for r in runs]
        names = labels if None not in labels else [p.resolve().name for p in paths]
        label = ", ".join(dict.fromkeys(names))  # distinct, in order
    return Group(label, runs, [read_metrics(r / "metrics.jsonl") for r in runs])


def is_number(value) -> bool:
    """A finite int or float (not a bool, not null): a value that can be drawn."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_key(groups: list[Group], y: str) -> None:
    """A --y typo should name the keys there are, not end in 'no points to draw'."""
    records = [r for g in groups for run in g.records for r in run]
    if not records or any(y in r for r in records):
        return
    keys = sorted({k for r in records for k, v in r.items() if is_number(v)})
    raise PlotError(f"no record has the key {y!r}; numeric keys: {', '.join(keys)}")


def run_points(records: list[dict], x: str, y: str) -> tuple[np.ndarray, np.ndarray]:
    """The run's (x, y) pairs where both are numbers, in order of x."""
    pairs = sorted((r[x], r[y]) for r in records if is_number(r.get(x)) and is_number(r.get(y)))
    xy = np.array(pairs, dtype=float).reshape(-1, 2)
    return xy[:, 0], xy[:, 1]


def moving_average(y: np.ndarray, n: int) -> np.ndarray:
    """Mean of each point and the ``n - 1`` before it (fewer at the start), keeping the length."""
    total = np.concatenate([[0.0], np.cumsum(y)])
    end = np.arange(1, len(y) + 1)
    start = np.maximum(end - n, 0)
    return (total[end] - total[start]) / (end - start)


def mean_curve(curves: list[tuple[np.ndarray, np.ndarray]]):
    """Mean and std over runs, interpolated onto the x range that every run covers.

    Returns (x, mean, std); std is None for a single run, which is drawn as it is.
    """
    if len(curves) == 1:
        x, y = curves[0]
        return x, y, None
    lo = max(x[0] for x, _ in curves)
    hi = min(x[-1] for x, _ in curves)
    if lo > hi:
        raise PlotError(f"the runs share no x range (their ranges start at {lo:g} but one "
                        f"ends at {hi:g})")
    grid = np.linspace(lo, hi, max(len(x) for x, _ in curves))
    ys = np.stack([np.interp(grid, x, y) for x, y in curves])
    return grid, ys.mean(axis=0), ys.std(axis=0)


def group_curves(group: Group, x: str, y: str, smooth: int) -> list:
    """Each run's points, smoothed; a run with none yet is left out with a note."""
    curves = []
    for run, records in zip(group.runs, group.records):
        xs, ys = run_points(records, x, y)
        if len(xs) == 0:
            print(f"walle_ray.plot: note: {run} has no {y} points yet; left out", file=sys.stderr)
            continue
        curves.append((xs, moving_average(ys, smooth)))
    if not curves:
        raise PlotError(f"no points to draw: no record of {group.label} has numbers for both "
                        f"{x} and {y}")
    return curves


def curve_figure(groups: list[Group], x: str, y: str, smooth: int):
    """plotcurve / plotcurve_cmp: a mean line per group, shaded ±1 std over its seeds."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for group, color in zip(groups, COLORS):
        curves = group_curves(group, x, y, smooth)
        try:
            grid, mean, std = mean_curve(curves)
        except PlotError as exc:
            raise PlotError(f"{group.label}: {exc}") from None
        label = group.label if std is None else f"{group.label} (mean ± std of {len(curves)} runs)"
        ax.plot(grid, mean, color=color, label=label)
        if std is not None:
            ax.fill_between(grid, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)
    ax.set_xlabel(X_LABELS[x])
    ax.set_ylabel(y if smooth == 1 else f"{y} (moving average of {smooth})")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def collect_shares(run: Path, records: list[dict]) -> dict[int, float]:
    """Collection's share of each iteration's collect + learn time, by iteration."""
    shares = {r["iteration"]: r["collect_s"] / (r["collect_s"] + r["learn_s"]) for r in records
              if is_number(r.get("collect_s")) and is_number(r.get("learn_s"))
              and r["collect_s"] + r["learn_s"] > 0}
    if not shares:
        raise PlotError(f"{run} has no collect_s/learn_s: --timing needs synchronous runs (PPO); "
                        "asynchronous runs collect and learn at the same time")
    return shares


def timing_figure(groups: list[Group]):
    """WALL-E's time-percentage figure: a panel per group, collection under learning per iteration."""
    fig, axes = plt.subplots(1, len(groups), figsize=(7 * len(groups), 4.5), sharey=True,
                             squeeze=False)
    for ax, group in zip(axes[0], groups):
        shares = [collect_shares(run, rec) for run, rec in zip(group.runs, group.records)]
        iterations = sorted(set.intersection(*(set(s) for s in shares)))
        if not iterations:
            raise PlotError(f"the runs of {group.label} share no iteration")
        collect = np.array([np.mean([s[i] for s in shares]) for i in iterations])
        ax.stackplot(iterations, collect, 1 - collect, labels=("collection", "learning"),
                     colors=("C0", "C1"), alpha=0.85)
        runs = "" if len(shares) == 1 else f" (mean of {len(shares)} runs)"
        ax.set(title=group.label + runs, xlabel="iteration", ylim=(0, 1))
        ax.margins(x=0)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    axes[0][0].set_ylabel("share of iteration time")
    axes[0][0].legend(loc="lower left")
    return fig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m walle_ray.plot",
        description="Learning curves (mean ± std over seeds) or the collect/learn time split, "
                    "from run directories' metrics.jsonl.")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="run directories of one setting (seeds), or a multirun directory")
    parser.add_argument("--baseline", nargs="+", metavar="RUN_DIR",
                        help="a second group drawn over the first")
    parser.add_argument("--label", help="legend name of the runs (default: from config.yaml)")
    parser.add_argument("--baseline-label", help="legend name of the baseline")
    parser.add_argument("--x", choices=tuple(X_LABELS), default="env_steps")
    parser.add_argument("--y", default="return",
                        help="any numeric metrics key, e.g. eval/return, env_steps_per_s")
    parser.add_argument("--smooth", type=int, default=1, metavar="N",
                        help="moving average over N points of each run")
    parser.add_argument("--timing", action="store_true",
                        help="draw the per-iteration collect vs learn share (synchronous runs) "
                             "instead of curves; --x, --y and --smooth do not apply")
    parser.add_argument("--title")
    parser.add_argument("-o", "--output", default="curves.png", help="PNG to write")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.smooth < 1:
        parser.error("--smooth must be at least 1")
    try:
        groups = [load_group(args.runs, args.label)]
        if args.baseline:
            groups.append(load_group(args.baseline, args.baseline_label))
        if args.timing:
            fig = timing_figure(groups)
        else:
            check_key(groups, args.y)
            fig = curve_figure(groups, args.x, args.y, args.smooth)
    except PlotError as exc:
        plt.close("all")
        print(f"walle_ray.plot: error: {exc}", file=sys.stderr)
        sys.exit(2)
    if args.title:
        fig.suptitle(args.title)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)
    print(output)


if __name__ == "__main__":
    main()

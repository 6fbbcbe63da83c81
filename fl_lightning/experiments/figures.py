"""A comparison's figures: every method's learning curves on one axis per setting, and class-wise accuracy heatmaps.

matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fl_lightning.core.plots import integer_round_axis, mark_divergence, moving_average, new_figure, save_figure
from fl_lightning.experiments.runs import RunRef, divergence_round, read_run


def series_style(i: int) -> dict[str, str]:
    """Colour and line style of the ``i``-th method on a shared axis: ten colours, then the same with other dashes.

    >>> series_style(0), series_style(11)
    ({'color': 'C0', 'ls': '-'}, {'color': 'C1', 'ls': '--'})
    """
    return {"color": f"C{i % 10}", "ls": ("-", "--", ":", "-.")[(i // 10) % 4]}


#: The per-round columns :func:`plot_curves` can draw, with their axis labels.
CURVE_COLUMNS: dict[str, str] = {
    "global_acc": "global test accuracy (%)",
    "local_acc_mean": "AccL: local models' mean test accuracy (%)",
}


def plot_curves(
    runs: Sequence[RunRef],
    setting: str,
    path: Path,
    smooth: int = 0,
    column: str = "global_acc",
    read: dict[Path, dict[str, Any] | None] | None = None,
) -> Path | None:
    """Learning curves of every method of a setting on one axis (accuracy in %), mean with a min–max band over seeds.

    A diverged run's method is marked at the round it diverged in; where some of a method's seeds completed, its
    curve is theirs (as in the tables), else that of its diverged runs up to the first divergence. ``smooth > 1``
    draws each mean as a moving average over that many evaluations (the raw mean faint behind it). ``column``: one of
    :data:`CURVE_COLUMNS`; AccL (``local_acc_mean``, runs with ``eval_local``) draws nothing (removing an older
    figure at ``path``) and returns None where no run of the setting measured it. ``read``: each run directory's
    :func:`read_run`, where the caller has it already.
    """
    if column not in CURVE_COLUMNS:
        raise ValueError(f"curve column {column!r}: choose one of {sorted(CURVE_COLUMNS)}")
    by_method: dict[str, list[dict[int, float]]] = defaultdict(list)
    completed: dict[str, list[dict[int, float]]] = defaultdict(list)
    diverged: dict[str, int] = {}
    described = ""
    for s, method, _seed, run_dir in runs:
        if s != setting:
            continue
        data = read[Path(run_dir)] if read is not None and Path(run_dir) in read else read_run(run_dir)
        if not data:
            continue
        described = described or _describe(data["summary"])
        if data["summary"].get("status") == "diverged":
            first = divergence_round(data)
            diverged[method] = min(diverged[method], first) if method in diverged else first
        rows = [r for r in data["rows"] if math.isfinite(r.get(column, math.nan))]
        if rows:
            curve = {int(r["round"]): 100.0 * r[column] for r in rows}
            by_method[method].append(curve)
            if data["summary"].get("status") == "completed":
                completed[method].append(curve)
    by_method.update(completed)  # a method with completed seeds: their curves alone
    if column != "global_acc" and not by_method:
        Path(path).unlink(missing_ok=True)  # an older figure of this setting would outlive the runs it showed
        return None
    fig, ax = new_figure((7, 4.5))
    plotted: set[int] = set()
    for i, (method, curves) in enumerate(by_method.items()):
        rounds = sorted(set.intersection(*(set(c) for c in curves)))
        if not rounds:
            continue
        plotted.update(rounds)
        style = series_style(i)
        color = style["color"]
        acc = np.array([[c[r] for r in rounds] for c in curves])
        mean = acc.mean(0)
        if smooth > 1:
            ax.plot(rounds, mean, **style, lw=0.8, alpha=0.25)
            ax.plot(rounds, moving_average(mean, smooth), label=method, **style, lw=1.4)
        else:
            ax.plot(rounds, mean, label=method, **style, lw=1.4)
        if len(curves) > 1:
            low, high = acc.min(0), acc.max(0)
            if smooth > 1:
                low, high = moving_average(low, smooth), moving_average(high, smooth)
            ax.fill_between(rounds, low, high, alpha=0.2, color=color)
        if method in diverged:
            row = list(diverged).index(method)
            mark_divergence(ax, diverged[method], color=color, label=f"{method} diverged", row=row)
    integer_round_axis(ax, sorted(plotted))
    ax.set_ylabel(CURVE_COLUMNS[column])
    view = f", moving average over {smooth} rounds" if smooth > 1 else ""
    ax.set_title(f"{described} ({setting}){view}" if described else f"{setting}{view}")
    ax.grid(alpha=0.3)
    if by_method:
        ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    return path


def _describe(summary: dict[str, Any]) -> str:
    """``dataset, partition, N clients`` from a run's summary (what its setting is)."""
    parts = [str(summary[k]) for k in ("dataset", "partition") if summary.get(k)]
    if summary.get("num_clients"):
        parts.append(f"{summary['num_clients']} clients")
    return ", ".join(parts)


def plot_class_heatmap(run_dir: Path, path: Path, title: str) -> Path | None:
    """Class-wise test accuracy (%) of the global model over rounds (rows: classes, columns: rounds)."""
    data = read_run(run_dir)
    if not data or not data["rows"]:
        return None
    keys = sorted((k for k in data["rows"][0] if k.startswith("acc_class_")), key=lambda k: int(k[10:]))
    if not keys:  # a metrics.csv without class-wise columns has no heatmap to draw
        return None
    grid = 100.0 * np.array([[row[k] for row in data["rows"]] for k in keys])
    fig, ax = new_figure((7, 0.3 * len(keys) + 1.5))
    im = ax.imshow(
        grid,
        aspect="auto",
        cmap="magma",
        vmin=0,
        vmax=100,
        interpolation="nearest",
        extent=(data["rows"][0]["round"] - 0.5, data["rows"][-1]["round"] + 0.5, len(keys) - 0.5, -0.5),
    )
    integer_round_axis(ax, [int(data["rows"][0]["round"]), int(data["rows"][-1]["round"])])
    ax.set_ylabel("class")
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    described = _describe(data["summary"])
    ax.set_title(f"{title} ({described})" if described else title, fontsize=9)
    fig.colorbar(im, ax=ax, label="test accuracy (%)")
    fig.tight_layout()
    save_figure(fig, path)
    return path

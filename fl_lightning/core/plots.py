"""PNG figures of a run: the partition heatmap and the learning curve, and the axis helpers they share.

matplotlib is imported only when a figure is drawn. Figures are ``matplotlib.figure.Figure`` objects written straight
to their files: pyplot is never used, so the user's backend and pyplot's open figures are left as they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fl_lightning.core.files import atomic_path


def new_figure(figsize: tuple[float, float]) -> Any:
    """A figure of ``figsize`` inches with one axis, outside pyplot: ``(fig, ax)``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots()


def save_figure(fig: Any, path: str | Path, dpi: int = 100) -> Path:
    """Write ``fig`` to ``path`` as a PNG, whole or not at all (temp file + rename)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    return path


def round_ticks(first: int, last: int) -> list[int]:
    """Whole-number round ticks from ``first`` to ``last``, both included, evenly spaced between them.

    >>> round_ticks(1, 20), round_ticks(1, 100)
    ([1, 5, 10, 15, 20], [1, 20, 40, 60, 80, 100])
    >>> round_ticks(1, 3), round_ticks(7, 7)
    ([1, 2, 3], [7])
    """
    from matplotlib.ticker import MaxNLocator

    if last <= first:
        return [first]
    locator = MaxNLocator(nbins=5, integer=True, steps=[1, 2, 5, 10])
    inner = [int(t) for t in locator.tick_values(first, last) if first < t < last]
    step = inner[1] - inner[0] if len(inner) > 1 else last - first
    # an inner tick closer than half a step to either end would crowd that end's label
    return [first, *(t for t in inner if t - first >= step / 2 and last - t >= step / 2), last]


def integer_round_axis(ax: Any, rounds: Sequence[int] = ()) -> None:
    """Label an x axis ``round`` with whole-number ticks; given the plotted ``rounds``, the first and last labelled."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("round")
    if len(rounds):
        ax.set_xticks(round_ticks(int(min(rounds)), int(max(rounds))))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def moving_average(values: Sequence[float] | np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average over ``window`` values (fewer at the start); ``window <= 1`` returns the values.

    >>> moving_average([1.0, 3.0, 5.0, 7.0], 2).tolist()
    [1.0, 2.0, 4.0, 6.0]
    """
    x = np.asarray(values, dtype=np.float64)
    if window <= 1 or len(x) == 0:
        return x
    csum = np.concatenate([[0.0], np.cumsum(x)])
    ends = np.arange(1, len(x) + 1)
    starts = np.maximum(0, ends - window)
    return (csum[ends] - csum[starts]) / (ends - starts)


def plot_partition(counts: np.ndarray, path: str | Path, title: str = "") -> Path:
    """Heatmap of the client × class sample counts."""
    counts = np.asarray(counts)
    n_clients, n_classes = counts.shape
    width = min(16.0, 2.0 + 0.35 * n_classes)
    height = min(14.0, 1.5 + 0.25 * n_clients)
    fig, ax = new_figure((max(width, 4.0), max(height, 3.0)))
    im = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title or f"{n_clients} clients × {n_classes} classes: samples per class")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if n_clients <= 20 and n_classes <= 20:
        for i in range(n_clients):
            for j in range(n_classes):
                ax.text(j, i, str(int(counts[i, j])), ha="center", va="center", color="w", fontsize=7)
    fig.colorbar(im, ax=ax, label="samples")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_curve(
    rounds: Sequence[int],
    accs: Sequence[float],
    path: str | Path,
    title: str = "",
    diverged_round: int | None = None,
    smooth: int = 0,
) -> Path:
    """Global test accuracy (in %, as in the tables) against round.

    Args:
        rounds: the evaluated rounds (1-based).
        accs: the global test accuracy of each, as a fraction.
        path: the PNG to write.
        title: the figure's title (say the method, dataset and setting).
        diverged_round: the round a diverged run failed in; marked with a red dashed line.
        smooth: > 1 draws a moving average over this many evaluations over the faint raw curve.
    """
    fig, ax = new_figure((6, 4))
    x, y = list(rounds), 100.0 * np.asarray(accs, dtype=np.float64)
    marker = "." if len(x) < 60 else None
    if smooth > 1:
        ax.plot(x, y, color="C0", alpha=0.3, lw=1)
        ax.plot(x, moving_average(y, smooth), color="C0", label=f"moving average over {smooth}")
        ax.legend(fontsize=8)
    else:
        ax.plot(x, y, marker=marker)
    if diverged_round is not None:
        mark_divergence(ax, diverged_round)
    integer_round_axis(ax, x)
    ax.set_ylabel("global test accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def mark_divergence(ax: Any, round_idx: int, color: str = "red", label: str = "diverged", row: int = 0) -> None:
    """A dashed vertical line at the round a run diverged in, labelled at the top of the axis.

    ``row``: how many labels down this one goes, so that several methods' labels do not overlap.
    """
    ax.axvline(round_idx, color=color, ls="--", lw=1)
    ax.annotate(
        f"{label} (round {round_idx})",
        xy=(round_idx, 1.0),
        xycoords=("data", "axes fraction"),
        xytext=(-3, -3 - 10 * row),
        textcoords="offset points",
        ha="right",
        va="top",
        color=color,
        fontsize=8,
    )

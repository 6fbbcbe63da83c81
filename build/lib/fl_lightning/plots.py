"""PNG figures of a run: the partition heatmap and the learning curve.

matplotlib is imported when a figure is drawn, not with the package (``import fl_lightning`` stays light).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_partition(counts: np.ndarray, path: str | Path, title: str = "") -> Path:
    """Heatmap of the client × class sample counts."""
    plt = _pyplot()
    counts = np.asarray(counts)
    n_clients, n_classes = counts.shape
    width = min(16.0, 2.0 + 0.35 * n_classes)
    height = min(14.0, 1.5 + 0.25 * n_clients)
    fig, ax = plt.subplots(figsize=(max(width, 4.0), max(height, 3.0)))
    im = ax.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title or f"{n_clients} clients × {n_classes} classes: samples per class")
    if n_clients <= 20 and n_classes <= 20:
        for i in range(n_clients):
            for j in range(n_classes):
                ax.text(j, i, str(int(counts[i, j])), ha="center", va="center", color="w", fontsize=7)
    fig.colorbar(im, ax=ax, label="samples")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_curve(rounds: Sequence[int], accs: Sequence[float], path: str | Path, title: str = "") -> Path:
    """Global test accuracy against round."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(list(rounds), list(accs), marker="." if len(rounds) < 60 else None)
    ax.set_xlabel("round")
    ax.set_ylabel("global test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

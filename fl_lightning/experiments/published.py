"""Published numbers set beside a comparison's: a source's mean ± std per (setting, method), and the differences."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fl_lightning.experiments.aggregate import mean_std

#: The summary columns a published number can be set beside, and their names in the tables.
PUBLISHED_METRICS: dict[str, str] = {"best_acc": "best acc", "final_acc": "final acc", "last10_acc": "last-10 acc"}

#: ``published.csv``'s columns (percent), one row per (setting, method): see :func:`published_comparison`.
PUBLISHED_COLUMNS: tuple[str, ...] = (
    "setting",
    "method",
    "metric",
    "published_mean",
    "published_std",
    "mean",
    "std",
    "seeds",
    "difference",
    "in_stds",
)


@dataclass(frozen=True)
class Published:
    """Accuracies a paper or benchmark published for some (setting, method) cells, in percent, to set beside ours.

    ``values[(setting, method)] = (mean, std)``; ``std`` is ``None`` where the source gives a single number.
    """

    source: str
    metric: str = "best_acc"
    values: Mapping[tuple[str, str], tuple[float, float | None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.metric not in PUBLISHED_METRICS:
            raise ValueError(f"published metric {self.metric!r}: choose one of {sorted(PUBLISHED_METRICS)}")


def published_comparison(summary: list[dict[str, Any]], published: Published) -> list[dict[str, Any]]:
    """Each published number beside ours, in percent (the rows of ``published.csv``).

    A row for every (setting, method) of a method the source gives a number for anywhere (``published_mean`` is
    ``None`` where it gives none for that setting); ``difference`` = our mean − the published mean, ``in_stds`` =
    that over the published std.
    """
    methods = {method for _setting, method in published.values}
    rows = []
    for s in summary:
        if s["method"] not in methods:
            continue
        ours = [100.0 * v for v in s[published.metric]]
        mean, std = published.values.get((s["setting"], s["method"]), (None, None))
        ours_mean, ours_std = mean_std(ours) if ours else (None, None)
        ours_std = ours_std if len(ours) > 1 else None  # no spread over one seed
        diff = ours_mean - mean if mean is not None and ours_mean is not None else None
        rows.append(
            {
                "setting": s["setting"],
                "method": s["method"],
                "metric": published.metric,
                "published_mean": mean,
                "published_std": std,
                "mean": ours_mean,
                "std": ours_std,
                "seeds": len(ours),
                "difference": diff,
                "in_stds": diff / std if diff is not None and std else None,
            }
        )
    return rows

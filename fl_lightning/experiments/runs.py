"""Reading a comparison's run directories: each run's ``summary.json`` and ``metrics.csv``, and what they say."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fl_lightning.core.rundir import run_status

#: A run of a comparison: setting, method, seed, run directory.
RunRef = tuple[str, str, int, Path]


def metrics_cell(value: str | None, path: Path, column: str) -> float:
    """A ``metrics.csv`` cell as a number: an empty cell (a round that did not log that column) is NaN.

    NaN cells are skipped wherever rows are aggregated (every reader checks ``math.isfinite``).

    >>> metrics_cell("", Path("m.csv"), "val/acc"), metrics_cell("0.5", Path("m.csv"), "global_acc")
    (nan, 0.5)
    """
    if value is None or value.strip() == "":
        return math.nan
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{path}: column {column!r} holds {value!r}, not a number; rerun or remove that run") from None


def read_run(run_dir: Path) -> dict[str, Any] | None:
    """A run's summary and per-round history (None if it has not written results yet).

    An empty cell (a round without validation leaves those columns empty) reads as NaN.
    """
    summary_path, metrics_path = run_dir / "summary.json", run_dir / "metrics.csv"
    if not summary_path.exists() or not metrics_path.exists():
        return None
    with open(metrics_path, newline="") as f:
        rows = [{k: metrics_cell(v, metrics_path, k) for k, v in row.items()} for row in csv.DictReader(f)]
    return {"summary": json.loads(summary_path.read_text()), "rows": rows}


def load_runs(runs: Sequence[RunRef]) -> list[dict[str, Any]]:
    """Each run's setting, method, seed, summary and per-round rows; a run without results has status ``missing``."""
    loaded = []
    for setting, method, seed, run_dir in runs:
        data = read_run(run_dir)
        if data is None:
            data = {"summary": {"status": "missing"}, "rows": []}
        else:
            data["summary"]["status"] = run_status(data["summary"])  # a `running` whose process is gone is stale
        loaded.append({"setting": setting, "method": method, "seed": seed, **data})
    return loaded


def unfinished_seeds(loaded: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
    """The seeds of each ``setting/method`` whose run has not finished (neither completed nor diverged)."""
    out: dict[str, list[int]] = {}
    for run in loaded:
        if run["summary"].get("status") not in ("completed", "diverged"):
            out.setdefault(f"{run['setting']}/{run['method']}", []).append(run["seed"])
    return out


def is_completed(run: dict[str, Any]) -> bool:
    """Whether a loaded run completed (only completed runs enter means and pairings)."""
    return run["summary"].get("status") == "completed"


def ran_on(summary: dict[str, Any]) -> str:
    """Where a run trained, from its ``summary.json``: device, engine, precision and processes."""
    device = summary.get("device", "device not recorded")
    engine = summary.get("engine", "sequential")
    procs = summary.get("world_size", 1)
    where = f"{device}, {engine} engine, {summary.get('precision', '?')}"
    return where if procs in (None, 1) else f"{where}, {procs} processes"


def divergence_round(run: dict[str, Any]) -> int:
    """The round a diverged run failed in: its summary's, else its first non-finite accuracy, else the next round."""
    if run["summary"].get("diverged_round") is not None:
        return int(run["summary"]["diverged_round"])
    for x in run["rows"]:
        if not math.isfinite(x["global_acc"]):
            return int(x["round"])
    return int(run["summary"].get("rounds_done", len(run["rows"]))) + 1

"""Reading a comparison's run directories: each run's ``summary.json`` and ``metrics.csv``, and what they say."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fl_lightning.core.rundir import RunDirError, read_config, run_status

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
    """A run's summary and per-round history (None if it has not written a summary yet).

    A run whose summary is there but not ``metrics.csv`` (one that diverged in its first round, before any round was
    recorded) has no rows. An empty cell (a round without validation leaves those columns empty) reads as NaN.
    """
    summary_path, metrics_path = run_dir / "summary.json", run_dir / "metrics.csv"
    if not summary_path.exists():
        return None
    rows: list[dict[str, float]] = []
    if metrics_path.exists():
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
            data["eval_every"] = _eval_every(run_dir)
        loaded.append({"setting": setting, "method": method, "seed": seed, **data})
    return loaded


def _eval_every(run_dir: Path) -> int | None:
    """The run's ``federation.eval_every`` from its saved ``config.yaml`` (1 when unset; None when unknown)."""
    try:
        config = read_config(Path(run_dir) / "config.yaml")
    except RunDirError:
        return None
    if config is None:
        return None
    value = (config.get("federation") or {}).get("eval_every", 1)
    return value if isinstance(value, int) else None


def schedule(run: dict[str, Any]) -> tuple[int | None, int | None]:
    """A loaded run's planned ``rounds`` (its summary's) and ``eval_every`` (its config's); None where unknown.

    Two runs are compared seed by seed only when their schedules agree: a 3-round run's accuracy is not a 6-round
    run's.

    >>> schedule({"summary": {"rounds": 6}, "eval_every": 2}), schedule({"summary": {}})
    ((6, 2), (None, None))
    """
    rounds = run["summary"].get("rounds")
    return (rounds if isinstance(rounds, int) else None), run.get("eval_every")


def same_schedule(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two loaded runs ran the same rounds and ``eval_every``, where both record them."""
    return all(x is None or y is None or x == y for x, y in zip(schedule(a), schedule(b), strict=True))


def schedule_notes(loaded: Sequence[dict[str, Any]], baseline: str) -> list[str]:
    """One note per setting whose finished runs differ in rounds or ``eval_every`` (none when they all agree)."""
    notes = []
    for setting in dict.fromkeys(r["setting"] for r in loaded):
        finished = [r for r in loaded if r["setting"] == setting and r["summary"].get("status") in FINISHED]
        by_schedule: dict[tuple[int | None, int | None], list[str]] = {}
        for r in finished:
            by_schedule.setdefault(schedule(r), []).append(f"{r['method']}/seed{r['seed']}")
        known = {k for k in by_schedule if k[0] is not None}
        if len({k[0] for k in known}) < 2 and len({k[1] for k in known if k[1] is not None}) < 2:
            continue
        parts = "; ".join(
            f"{rounds} rounds{f', eval_every {every}' if every not in (None, 1) else ''}: {', '.join(names)}"
            for (rounds, every), names in by_schedule.items()
        )
        notes.append(
            f"Setting {setting}: its runs differ in length ({parts}). A run is paired with the {baseline} run of its "
            "seed only when both ran the same rounds and eval_every (the others have no deltas, rounds to target or "
            "speedups), and a row's means mix the lengths its seeds ran; give every run one --federation.rounds."
        )
    return notes


#: The statuses of a finished run (its results are final).
FINISHED = ("completed", "diverged")


def unfinished_seeds(loaded: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
    """The seeds of each ``setting/method`` whose run has not finished (neither completed nor diverged)."""
    out: dict[str, list[int]] = {}
    for run in loaded:
        if run["summary"].get("status") not in FINISHED:
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

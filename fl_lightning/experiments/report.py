"""A comparison's report: its tables and figures, written from its run directories into one folder.

:func:`write_report` reads the runs (:mod:`~fl_lightning.experiments.runs`), summarises them against the baseline
(:mod:`~fl_lightning.experiments.aggregate`), writes the tables (:mod:`~fl_lightning.experiments.tables`) and draws
the figures (:mod:`~fl_lightning.experiments.figures`).
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fl_lightning.core.files import atomic_path, write_text_atomic
from fl_lightning.experiments.aggregate import per_seed_results, summarize_loaded
from fl_lightning.experiments.figures import plot_class_heatmap, plot_curves
from fl_lightning.experiments.published import Published
from fl_lightning.experiments.runs import RunRef, load_runs, schedule_notes, unfinished_seeds
from fl_lightning.experiments.tables import write_per_seed, write_tables


def write_report(
    name: str,
    output_dir: Path,
    runs: Sequence[RunRef],
    baseline: str,
    smooth: int = 0,
    notes: Sequence[str] = (),
    published: Published | None = None,
    plots: bool = True,
) -> Path:
    """Tables and plots of a comparison into ``output_dir/report``; ``smooth > 1`` adds moving-average curves.

    Tables: ``results.md`` (mean ± std, then paired by seed, then the ``published`` numbers beside ours, then the
    comparison's ``notes``), ``results.csv``, ``per_seed.csv`` and, with ``published``, ``published.csv``;
    ``plots=False`` writes the tables alone.
    """
    out = Path(output_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    loaded = load_runs(runs)
    read = {
        Path(ref[3]): r if r["summary"].get("status") != "missing" else None
        for ref, r in zip(runs, loaded, strict=True)
    }
    # A (setting, method) none of whose runs exists yet is left out of the tables; the notes count what is unfinished.
    started = {(r["setting"], r["method"]) for r in loaded if r["summary"].get("status") != "missing"}
    unstarted = [r for r in loaded if (r["setting"], r["method"]) not in started]
    loaded = [r for r in loaded if (r["setting"], r["method"]) in started]
    summary = summarize_loaded(loaded, baseline)
    note = _progress_note(len(runs), unstarted, unfinished_seeds(loaded))
    lengths = schedule_notes(loaded, baseline)
    for line in lengths:  # on the command line: one `warning: ...` line each
        warnings.warn(line, stacklevel=2)
    notes = [*lengths, *notes]
    if note is not None:
        notes = [note, *notes]
    write_tables(summary, out, f"{name} (baseline: {baseline})", baseline, notes, published)
    write_per_seed(per_seed_results(loaded, baseline), out)
    if plots:
        settings = dict.fromkeys(s for s, method, *_ in runs if (s, method) in started)
        for setting in settings:
            _draw_setting(runs, setting, out, smooth, read)
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=2, default=float))
    return out


def _progress_note(total: int, unstarted: Sequence[dict[str, Any]], pending: dict[str, list[int]]) -> str | None:
    """The note on what is not finished: runs not started (left out of the tables) and unfinished seeds."""
    if not unstarted and not pending:
        return None
    done = total - len(unstarted) - sum(len(seeds) for seeds in pending.values())
    parts = [f"{done} of {total} runs finished."]
    if unstarted:
        groups = ", ".join(dict.fromkeys(f"{r['setting']}/{r['method']}" for r in unstarted))
        count = f"{len(unstarted)} run{'s' * (len(unstarted) > 1)}"
        parts.append(f"No run finished yet ({count}, left out of the tables): {groups}.")
    if pending:
        listed = "; ".join(
            f"{group} seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}" for group, seeds in pending.items()
        )
        parts.append(f"Not finished, so not in their rows' figures: {listed}.")
    return " ".join(parts)


def _draw_setting(
    runs: Sequence[RunRef], setting: str, out: Path, smooth: int, read: dict[Path, dict[str, Any] | None]
) -> None:
    """A setting's figures: learning curves (raw, smoothed, AccL), each method's class heatmap, the partition."""
    plot_curves(runs, setting, out / f"curves_{setting}.png", read=read)
    if smooth > 1:
        plot_curves(runs, setting, out / f"curves_{setting}_ma{smooth}.png", smooth=smooth, read=read)
    plot_curves(runs, setting, out / f"local_curves_{setting}.png", column="local_acc_mean", read=read)
    seen: set[str] = set()
    for s, method, seed, run_dir in runs:
        if s != setting or method in seen:
            continue
        if plot_class_heatmap(
            run_dir,
            out / f"class_acc_{setting}_{method}.png",
            f"{method}, {setting}, seed {seed}: class-wise accuracy",
        ):
            seen.add(method)
        part = run_dir / "partition.png"
        if part.exists() and not (out / f"partition_{setting}.png").exists():
            with atomic_path(out / f"partition_{setting}.png") as tmp:
                shutil.copy(part, tmp)

"""A comparison's tables: ``results.md``, ``results.csv``, ``per_seed.csv`` and ``published.csv``, and their cells."""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fl_lightning.core.files import write_text_atomic
from fl_lightning.experiments.aggregate import DELTAS, LOCAL, TARGETS, mean_std, total_wall
from fl_lightning.experiments.published import PUBLISHED_COLUMNS, PUBLISHED_METRICS, Published, published_comparison

#: Columns of ``per_seed.csv``, one row per run.
PER_SEED_COLUMNS: tuple[str, ...] = (
    "setting",
    "method",
    "seed",
    "status",
    "final_acc",
    "best_acc",
    "last10_acc",
    "forgetting",
    "mean_drop",
    "rounds_to_final_target",
    "rounds_to_best_target",
    "delta_final_acc",
    "delta_best_acc",
    "delta_last10_acc",
    "speedup_final_target",
    "speedup_best_target",
    "local_acc_last10",
    "forgetting_degree_last10",
    "wall_seconds",
)


def fmt(values: Sequence[float], scale: float = 100.0, digits: int = 2) -> str:
    """``mean ± std`` (in percent by default); a single value is printed alone.

    >>> fmt([0.5, 0.7])
    '60.00 ± 14.14'
    """
    if not values:
        return "–"
    mean, std = mean_std([v * scale for v in values])
    return fmt_mean_std(mean, std if len(values) > 1 else None, digits)


def fmt_mean_std(mean: float, std: float | None, digits: int = 2) -> str:
    """``mean ± std``, or the mean alone where there is no std."""
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def fmt_rounds(stats: dict[str, Any]) -> str:
    """Mean ± std of the rounds to a target over the paired seeds; ``– (k/n)`` when only k of the n reached it.

    >>> fmt_rounds({"rounds": [2, 4], "speedup": [], "reached": 2, "paired": 2})
    '3.0 ± 1.4'
    >>> fmt_rounds({"rounds": [2], "speedup": [], "reached": 1, "paired": 2})
    '– (1/2)'
    """
    if not stats["paired"]:
        return "–"
    if stats["reached"] < stats["paired"]:
        return f"– ({stats['reached']}/{stats['paired']})"
    return fmt(stats["rounds"], scale=1.0, digits=1)


def fmt_speedup(stats: dict[str, Any]) -> str:
    """Mean ± std of the per-seed speedups (``2.00x ± 0.50``); ``– (k/n)`` when only k of n paired seeds reach it.

    >>> fmt_speedup({"rounds": [2, 4], "speedup": [1.5, 2.5], "reached": 2, "paired": 2})
    '2.00x ± 0.71'
    """
    if not stats["paired"]:
        return "–"
    if stats["reached"] < stats["paired"] or len(stats["speedup"]) < stats["paired"]:
        return f"– ({stats['reached']}/{stats['paired']})"
    mean, std = mean_std(stats["speedup"])
    return f"{mean:.2f}x" if len(stats["speedup"]) == 1 else f"{mean:.2f}x ± {std:.2f}"


def fmt_delta(deltas: Sequence[float]) -> str:
    """Mean ± std of per-seed accuracy deltas in percentage points, and (seeds with a delta > 0 / seeds).

    >>> fmt_delta([0.02, -0.01, 0.005])
    '+0.50 ± 1.50 (2/3)'
    """
    if not deltas:
        return "–"
    mean, std = mean_std([100.0 * d for d in deltas])
    wins = sum(d > 0 for d in deltas)
    spread = "" if len(deltas) == 1 else f" ± {std:.2f}"
    return f"{round(mean, 2) + 0.0:+.2f}{spread} ({wins}/{len(deltas)})"  # rounded, + 0.0: never "-0.00"


def _table_rows(summary: list[dict[str, Any]], baseline: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the main table (mean ± std over seeds).

    Accuracies, forgetting, mean drop, both targets' rounds and speedups, and with ``eval_local`` the local models'
    AccL and forgetting degree.
    """
    header = ["setting", "method", "final acc (%)", "best acc (%)", "last-10 acc (%)", "forgetting F", "mean drop (pp)"]
    for kind in TARGETS:
        header += [f"rounds to {baseline}'s {kind} acc", f"speedup ({baseline}'s {kind} acc)"]
    local = any(s.get(name) for s in summary for name in LOCAL)  # runs with --federation.eval_local
    if local:
        header += ["AccL last-10 (%)", "forgetting degree τ last-10"]
    header += ["wall (s)", "status"]
    rows = []
    for s in summary:
        if not s["completed"]:
            final, best_cell = s["status"], ""
            if s["status"] == "diverged":
                best = [b for b in s["best_before_divergence"] if math.isfinite(b)]
                final = "diverged in round " + ", ".join(str(r) for r in s["diverged_round"])
                best_cell = f"{fmt(best)} before" if best else ""
            blank = [""] * (len(header) - 5)
            rows.append([s["setting"], s["method"], final, best_cell, *blank, s["status"]])
            continue
        row = [
            s["setting"],
            s["method"],
            fmt(s["final_acc"]),
            fmt(s["best_acc"]),
            fmt(s["last10_acc"]),
            fmt(s["forgetting"], scale=1.0, digits=4),
            fmt(s["mean_drop"]),
        ]
        for kind in TARGETS:
            row += [fmt_rounds(s["targets"][kind]), fmt_speedup(s["targets"][kind])]
        if local:
            row += [fmt(s["local_acc_last10"]), fmt(s["forgetting_degree_last10"], scale=1.0, digits=4)]
        status = s["status"]
        if status == "diverged":  # some seeds completed, the others diverged: the means are the completed seeds'
            rounds = ", ".join(str(r) for r in s["diverged_round"])
            status = f"{s['completed']}/{s['seeds']} completed; diverged in round {rounds}"
            others = s["seeds"] - s["completed"] - len(s["diverged_round"])
            status += f"; {others} not finished" if others else ""
        rows.append([*row, f"{np.mean(s['wall_seconds']):.0f}", status])
    return header, rows


def _paired_rows(summary: list[dict[str, Any]], baseline: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the paired table: each method's per-seed accuracy deltas against the baseline."""
    header = ["setting", "method", "paired seeds", "Δ final acc (pp)", "Δ best acc (pp)", "Δ last-10 acc (pp)"]
    rows = [
        [
            s["setting"],
            s["method"],
            str(s["targets"]["final"]["paired"]),
            *(fmt_delta(s["deltas"][name]) for name in DELTAS),
        ]
        for s in summary
        if s["method"] != baseline
    ]
    return header, rows


def _published_rows(compared: list[dict[str, Any]], metric: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the Markdown table of :func:`published_comparison`'s rows."""
    label = PUBLISHED_METRICS[metric]
    header = ["setting", "method", "published (%)", f"fl_lightning {label} (%)", "difference (pp)", "in published stds"]
    rows = []
    for r in compared:
        mean = r["published_mean"]
        shown = "–" if mean is None else fmt_mean_std(mean, r["published_std"])
        ours = "–" if not r["seeds"] else fmt_mean_std(r["mean"], r["std"] if r["seeds"] > 1 else None)
        gap = "–" if r["difference"] is None else f"{r['difference'] + 0.0:+.2f}"
        sds = "–" if r["in_stds"] is None else f"{r['in_stds'] + 0.0:+.1f}"
        rows.append([r["setting"], r["method"], shown, ours, gap, sds])
    return header, rows


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def _header_lines(title: str, baseline: str, summary: list[dict[str, Any]]) -> list[str]:
    """The Markdown title and the lines saying what the table's numbers are."""
    targets = " and ".join(f"its {kind} accuracy ({paper})" for kind, (_key, paper) in TARGETS.items())
    seconds, count = total_wall(summary)
    places: dict[str, int] = defaultdict(int)
    for s in summary:
        for place in s.get("ran_on", []):
            places[place] += 1
    where = "; ".join(f"{place} ({n} run{'s' if n > 1 else ''})" for place, n in sorted(places.items()))
    return [
        f"# {title}",
        "",
        f"Where the runs trained: {where or 'no runs yet'}.",
        "",
        "Mean ± std over seeds (completed runs only). Mean drop: the mean fall of the global accuracy from one "
        "evaluated round to the next, a rise counting 0 (how much the curve oscillates). Rounds to target: the first "
        "round a method's global accuracy "
        f"reaches the target, each run paired by seed with the {baseline} run of the same setting and seed (the seed "
        f"fixes partition and client sampling); two targets from that {baseline} run, {targets}. Speedup = the "
        f"{baseline} run's rounds to the target / the method's, mean ± std over seeds; – (k/n): only k of the n "
        "paired seeds reached the target.",
        "",
        f"Wall time of the comparison: {seconds:.0f} s ({seconds / 3600:.2f} h), the sum of {count} runs' "
        "wall_seconds; wall (s) per row: the mean over its completed runs.",
        "",
    ]


def write_tables(
    summary: list[dict[str, Any]],
    out_dir: Path,
    title: str,
    baseline: str,
    notes: Sequence[str] = (),
    published: Published | None = None,
) -> tuple[Path, Path]:
    """``results.md``, ``results.csv`` and, with ``published``, ``published.csv``.

    ``results.md``: the main table, the paired-by-seed table, the published numbers beside ours, then ``notes``;
    ``results.csv``: the main table.
    """
    header, rows = _table_rows(summary, baseline)
    md = _header_lines(title, baseline, summary) + _markdown_table(header, rows)
    paired_header, paired = _paired_rows(summary, baseline)
    if paired:
        md += [
            "",
            f"## Paired by seed against {baseline}",
            "",
            f"Per seed, method − {baseline} (percentage points) over the seeds both completed: mean ± std, and "
            f"(seeds the method beats {baseline} on / those seeds).",
            "",
            *_markdown_table(paired_header, paired),
        ]
    compared = published_comparison(summary, published) if published is not None and published.values else None
    if compared is not None and published is not None:
        label = PUBLISHED_METRICS[published.metric]
        md += [
            "",
            "## Against the published numbers",
            "",
            f"{' '.join(published.source.split())} Set beside fl_lightning's {label} (mean ± std over its "
            "completed seeds); difference = fl_lightning's mean − the published mean, also in units of the "
            "published std.",
            "",
            *_markdown_table(*_published_rows(compared, published.metric)),
        ]
    if notes:
        md += ["", "## Notes", "", *(f"- {' '.join(note.split())}" for note in notes)]
    # Whole files, under temporaries unique to this process: comparisons sharing an output folder never collide.
    write_text_atomic(out_dir / "results.md", "\n".join(md) + "\n")
    write_text_atomic(out_dir / "results.csv", _csv_text(header, rows))
    if compared is not None:
        cells = [[_csv_cell(r[c]) for c in PUBLISHED_COLUMNS] for r in compared]
        write_text_atomic(out_dir / "published.csv", _csv_text(PUBLISHED_COLUMNS, cells))
    else:  # never a stale one from an earlier version of the YAML
        (out_dir / "published.csv").unlink(missing_ok=True)
    return out_dir / "results.md", out_dir / "results.csv"


def _csv_text(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A CSV file's text."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def _csv_cell(value: Any) -> Any:
    """A ``per_seed.csv`` cell: empty for None or a non-finite number, floats rounded to 6 decimals."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return round(value, 6) if isinstance(value, float) else value


def write_per_seed(results: Sequence[dict[str, Any]], out_dir: Path) -> Path:
    """``per_seed.csv``: one row per run, the columns :data:`PER_SEED_COLUMNS`.

    Accuracies are fractions, deltas are against the baseline's run of the same setting and seed; a cell is empty
    where that run or the value is missing.
    """
    rows = [[_csv_cell(r[c]) for c in PER_SEED_COLUMNS] for r in results]
    write_text_atomic(out_dir / "per_seed.csv", _csv_text(PER_SEED_COLUMNS, rows))
    return out_dir / "per_seed.csv"

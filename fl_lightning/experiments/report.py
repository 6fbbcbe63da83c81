"""Paper-style results of a comparison: mean ± std tables (Markdown, CSV) and plots, from finished run directories."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fl_lightning.core.files import atomic_path, write_text_atomic
from fl_lightning.core.metrics import rounds_to_target
from fl_lightning.core.plots import (
    _pyplot,
    integer_round_axis,
    mark_divergence,
    moving_average,
    save_figure,
    series_style,
)
from fl_lightning.core.rundir import run_status

RunRef = tuple[str, str, int, Path]  # setting, method, seed, run directory


def read_run(run_dir: Path) -> dict[str, Any] | None:
    """A run's summary and per-round history (None if it has not written results yet)."""
    summary_path, metrics_path = run_dir / "summary.json", run_dir / "metrics.csv"
    if not summary_path.exists() or not metrics_path.exists():
        return None
    with open(metrics_path) as f:
        rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    return {"summary": json.loads(summary_path.read_text()), "rows": rows}


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value).

    >>> mean_std([0.5, 0.7])
    (0.6, 0.1414)
    """
    arr = np.asarray(values, dtype=np.float64)
    std = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
    return round(float(arr.mean()), 4), round(std, 4)


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


#: Rounds-to-target definitions: name -> (the baseline run's accuracy that is the target, the paper that defines it).
TARGETS: dict[str, tuple[str, str]] = {
    "final": ("final_acc", "FedNTD; METHODS.md"),
    "best": ("best_acc", "FedLMD"),
}
#: Accuracies compared seed by seed with the baseline: name in the results -> key in a run's ``summary.json``.
DELTAS: dict[str, str] = {"final_acc": "final_acc", "best_acc": "best_acc", "last10_acc": "last10_mean_acc"}
#: Local-model measures (``--federation.eval_local``), as the mean over a run's last 10 evaluated rounds: name in the
#: results -> ``metrics.csv`` column. AccL: the updated local models' mean test accuracy (FedSSD §3.1, FedCAD Fig. 1);
#: τ: FedKA's class-wise forgetting degree of the local models against the global one.
LOCAL: dict[str, str] = {"local_acc_last10": "local_acc_mean", "forgetting_degree_last10": "local_forgetting_degree"}
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


def baseline_by_seed(loaded: Sequence[dict[str, Any]], baseline: str) -> dict[tuple[str, int], dict[str, Any]]:
    """The baseline's completed runs by (setting, seed).

    Each method's run is paired with the baseline's run of the same setting and seed: the seed fixes the partition
    and the client sampling.
    """
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for run in loaded:
        if run["method"] == baseline and is_completed(run):
            out.setdefault((run["setting"], run["seed"]), run)
    return out


def first_round_at(run: dict[str, Any], target: float) -> int | None:
    """The first round a run's global accuracy reaches ``target`` (None if it never does)."""
    rows = run["rows"]
    return rounds_to_target([int(x["round"]) for x in rows], [x["global_acc"] for x in rows], target)


def paired_target(run: dict[str, Any], base: dict[str, Any], key: str) -> dict[str, Any]:
    """Rounds to the target = the baseline run's ``key`` accuracy (its final or best), and the speedup.

    The speedup is the baseline run's rounds to the target / the run's (None when either never reaches it).
    """
    target = float(base["summary"][key])
    rounds, base_rounds = first_round_at(run, target), first_round_at(base, target)
    return {"target": target, "rounds": rounds, "speedup": base_rounds / rounds if rounds and base_rounds else None}


def paired_delta(run: dict[str, Any], base: dict[str, Any], key: str) -> float | None:
    """The run's ``key`` accuracy minus the baseline run's (None when either lacks it)."""
    value, base_value = run["summary"].get(key), base["summary"].get(key)
    return None if value is None or base_value is None else float(value) - float(base_value)


def last10(run: dict[str, Any], column: str) -> float | None:
    """The mean of a ``metrics.csv`` column over the run's last 10 rounds that have it (None: no round has it)."""
    values = [r[column] for r in run["rows"] if math.isfinite(r.get(column, math.nan))]
    return float(np.mean(values[-10:])) if values else None


def mean_drop(run: dict[str, Any]) -> float | None:
    """How much a run's global accuracy oscillates: its mean fall from one evaluated round to the next.

    A rise counts 0, so a learning curve that only rises scores 0; non-finite accuracies are skipped (only completed
    runs get a value in the reports); None with under two evaluated rounds. With ``eval_every`` > 1 a step spans
    that many rounds, so compare runs of one ``eval_every``.
    fl_lightning's measure for the papers' "more stable" curves (FedLMD Fig. 6, FedKA's title).

    >>> round(mean_drop({"rows": [{"global_acc": a} for a in (0.5, 0.7, 0.6, 0.8)]}), 4)  # one fall of 0.1 in 3
    0.0333
    """
    accs = [r["global_acc"] for r in run["rows"] if math.isfinite(r["global_acc"])]
    if len(accs) < 2:
        return None
    return float(np.mean([max(0.0, a - b) for a, b in zip(accs, accs[1:], strict=False)]))


def seed_result(run: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    """One run's row of ``per_seed.csv``.

    Its accuracies (completed runs only) and, against the same-seed baseline run ``base`` (None when that is not
    completed), its rounds to both targets, speedups and accuracy deltas.
    """
    summary, done = run["summary"], is_completed(run)
    out: dict[str, Any] = {"setting": run["setting"], "method": run["method"], "seed": run["seed"]}
    out["status"] = summary.get("status", "missing")
    for name, key in {**DELTAS, "forgetting": "forgetting"}.items():
        out[name] = summary.get(key) if done else None
    out["mean_drop"] = mean_drop(run) if done else None
    for name, column in LOCAL.items():
        out[name] = last10(run, column) if done else None
    out["wall_seconds"] = summary.get("wall_seconds")
    paired = done and base is not None
    out["paired"] = paired
    for kind, (key, _paper) in TARGETS.items():
        hit = paired_target(run, base, key) if paired else {"target": None, "rounds": None, "speedup": None}
        out[f"{kind}_target"] = hit["target"]
        out[f"rounds_to_{kind}_target"] = hit["rounds"]
        out[f"speedup_{kind}_target"] = hit["speedup"]
    for name, key in DELTAS.items():
        out[f"delta_{name}"] = paired_delta(run, base, key) if paired else None
    return out


def per_seed_results(loaded: Sequence[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """:func:`seed_result` of every loaded run, each against the baseline's run of the same setting and seed."""
    bases = baseline_by_seed(loaded, baseline)
    return [seed_result(run, bases.get((run["setting"], run["seed"]))) for run in loaded]


def target_stats(results: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    """Rounds and speedups to the ``kind`` target of a (setting, method)'s seeds paired with the baseline.

    The targets, the rounds and speedups of the seeds that reached their target, and how many reached it out of how
    many were paired.
    """
    paired = [r for r in results if r["paired"]]
    reached = [r for r in paired if r[f"rounds_to_{kind}_target"] is not None]
    return {
        "target": [r[f"{kind}_target"] for r in paired],
        "rounds": [r[f"rounds_to_{kind}_target"] for r in reached],
        "speedup": [r[f"speedup_{kind}_target"] for r in reached if r[f"speedup_{kind}_target"] is not None],
        "reached": len(reached),
        "paired": len(paired),
    }


def _mean_if_all_reached(stats: dict[str, Any], key: str) -> float | None:
    """The mean of ``stats[key]`` when every paired seed reached the target (else None)."""
    values = stats[key]
    if not stats["paired"] or stats["reached"] < stats["paired"] or len(values) < stats["paired"]:
        return None
    return float(np.mean(values))


def _group_row(setting: str, method: str, runs: list[dict[str, Any]], results: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary row of one (setting, method) from its loaded runs and their :func:`seed_result` rows."""
    done = [r for r in runs if is_completed(r)]
    statuses = sorted({r["summary"].get("status", "missing") for r in runs})
    diverged = [r for r in runs if r["summary"].get("status") == "diverged"]
    targets = {kind: target_stats(results, kind) for kind in TARGETS}
    final = targets["final"]
    return {
        "setting": setting,
        "method": method,
        "seeds": len(runs),
        "completed": len(done),
        "status": "diverged" if "diverged" in statuses else ",".join(statuses),
        "final_acc": [r["summary"]["final_acc"] for r in done],
        "best_acc": [r["summary"]["best_acc"] for r in done],
        "last10_acc": [
            r["summary"]["last10_mean_acc"] for r in done if r["summary"].get("last10_mean_acc") is not None
        ],
        "forgetting": [r["summary"]["forgetting"] for r in done],
        "mean_drop": [r["mean_drop"] for r in results if r["mean_drop"] is not None],
        **{name: [r[name] for r in results if r[name] is not None] for name in LOCAL},
        "wall_seconds": [r["summary"]["wall_seconds"] for r in done],
        "wall_seconds_all": [
            float(r["summary"]["wall_seconds"]) for r in runs if _finite(r["summary"].get("wall_seconds"))
        ],
        # the "final" target's numbers under their former names: the mean over the paired seeds
        "target": float(np.mean(final["target"])) if final["target"] else None,
        "rounds_to_target": _mean_if_all_reached(final, "rounds"),
        "speedup": _mean_if_all_reached(final, "speedup"),
        "targets": targets,
        "deltas": {name: [r[f"delta_{name}"] for r in results if r[f"delta_{name}"] is not None] for name in DELTAS},
        "ran_on": [ran_on(r["summary"]) for r in runs if r["summary"].get("status") != "missing"],
        "diverged_round": [_divergence_round(r) for r in diverged],
        "best_before_divergence": [
            max((x["global_acc"] for x in r["rows"] if math.isfinite(x["global_acc"])), default=math.nan)
            for r in diverged
        ],
    }


def ran_on(summary: dict[str, Any]) -> str:
    """Where a run trained, from its ``summary.json``: device, engine, precision and processes."""
    device = summary.get("device", "device not recorded")
    engine = summary.get("engine", "sequential")
    procs = summary.get("world_size", 1)
    where = f"{device}, {engine} engine, {summary.get('precision', '?')}"
    return where if procs in (None, 1) else f"{where}, {procs} processes"


def _finite(value: Any) -> bool:
    """Whether ``value`` is a finite number."""
    return isinstance(value, (int, float)) and math.isfinite(value)


def summarize(runs: Sequence[RunRef], baseline: str) -> list[dict[str, Any]]:
    """One row per (setting, method): accuracies, forgetting, rounds to target, speedups and accuracy deltas.

    Rounds, speedups and deltas pair each run with the baseline's run of the same setting and seed; the two targets
    are that run's final and best accuracy.
    """
    return summarize_loaded(load_runs(runs), baseline)


def summarize_loaded(loaded: Sequence[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """:func:`summarize` of runs already loaded by :func:`load_runs`."""
    results = per_seed_results(loaded, baseline)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, run in enumerate(loaded):
        groups[(run["setting"], run["method"])].append(i)  # insertion order: the order the runs came in
    return [
        _group_row(setting, method, [loaded[i] for i in idx], [results[i] for i in idx])
        for (setting, method), idx in groups.items()
    ]


def _divergence_round(run: dict[str, Any]) -> int:
    """The round a diverged run failed in: its summary's, else its first non-finite accuracy, else the next round."""
    if run["summary"].get("diverged_round") is not None:
        return int(run["summary"]["diverged_round"])
    for x in run["rows"]:
        if not math.isfinite(x["global_acc"]):
            return int(x["round"])
    return int(run["summary"].get("rounds_done", len(run["rows"]))) + 1


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
    return f"{mean + 0.0:+.2f}{spread} ({wins}/{len(deltas)})"  # + 0.0: never "-0.00"


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


def total_wall(summary: list[dict[str, Any]]) -> tuple[float, int]:
    """The comparison's wall time, and how many runs reported one.

    The sum of every run's ``wall_seconds``, diverged and unfinished runs included.
    """
    walls = [w for s in summary for w in s["wall_seconds_all"]]
    return float(sum(walls)), len(walls)


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
    if compared is not None:
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
    plt = _pyplot()
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
            diverged[method] = min(diverged.get(method, math.inf), _divergence_round(data))  # the first
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
    fig, ax = plt.subplots(figsize=(7, 4.5))
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
    plt = _pyplot()
    keys = sorted((k for k in data["rows"][0] if k.startswith("acc_class_")), key=lambda k: int(k[10:]))
    grid = 100.0 * np.array([[row[k] for row in data["rows"]] for k in keys])
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(keys) + 1.5))
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
    pending = unfinished_seeds(loaded)
    if unstarted or pending:
        done = len(runs) - len(unstarted) - sum(len(seeds) for seeds in pending.values())
        parts = [f"{done} of {len(runs)} runs finished."]
        if unstarted:
            groups = ", ".join(dict.fromkeys(f"{r['setting']}/{r['method']}" for r in unstarted))
            count = f"{len(unstarted)} run{'s' * (len(unstarted) > 1)}"
            parts.append(f"No run finished yet ({count}, left out of the tables): {groups}.")
        if pending:
            listed = "; ".join(
                f"{group} seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}" for group, seeds in pending.items()
            )
            parts.append(f"Not finished, so not in their rows' figures: {listed}.")
        notes = [" ".join(parts), *notes]
    write_tables(summary, out, f"{name} (baseline: {baseline})", baseline, notes, published)
    write_per_seed(per_seed_results(loaded, baseline), out)
    plotted = dict.fromkeys(s for s, method, *_ in runs if (s, method) in started) if plots else {}
    for setting in plotted:
        plot_curves(runs, setting, out / f"curves_{setting}.png", read=read)
        if smooth > 1:
            plot_curves(runs, setting, out / f"curves_{setting}_ma{smooth}.png", smooth=smooth, read=read)
        plot_curves(runs, setting, out / f"local_curves_{setting}.png", column="local_acc_mean", read=read)
        seen = set()
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
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=2, default=float))
    return out

"""Paper-style results of a comparison: mean ± std tables (Markdown, CSV) and plots, from finished run directories."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fl_lightning.files import atomic_path, write_text_atomic
from fl_lightning.metrics import rounds_to_target
from fl_lightning.plots import (
    _pyplot,
    integer_round_axis,
    mark_divergence,
    moving_average,
    save_figure,
    series_style,
)
from fl_lightning.rundir import run_status

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
    return f"{mean:.{digits}f}" if len(values) == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"


def summarize(runs: Sequence[RunRef], baseline: str) -> list[dict[str, Any]]:
    """One row per (setting, method): accuracies, forgetting, rounds to the baseline's final accuracy, speedup."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    order: list[tuple[str, str]] = []
    for setting, method, _seed, run_dir in runs:
        if (setting, method) not in grouped:
            order.append((setting, method))
        data = read_run(run_dir)
        if data is not None:
            data["summary"]["status"] = run_status(data["summary"])  # a `running` whose process is gone is stale
        grouped[(setting, method)].append(data if data is not None else {"summary": {"status": "missing"}, "rows": []})
    out = []
    for setting, method in order:
        results = grouped[(setting, method)]
        base = grouped.get((setting, baseline), [])
        base_done = [r for r in base if r["summary"].get("status") == "completed"]
        target = float(np.mean([r["summary"]["final_acc"] for r in base_done])) if base_done else None
        done = [r for r in results if r["summary"].get("status") == "completed"]
        statuses = sorted({r["summary"].get("status", "missing") for r in results})
        reach = []
        for r in done:
            if target is None:
                continue
            hit = rounds_to_target([int(x["round"]) for x in r["rows"]], [x["global_acc"] for x in r["rows"]], target)
            reach.append(hit)
        base_reach = []
        for r in base_done:
            hit = rounds_to_target(
                [int(x["round"]) for x in r["rows"]], [x["global_acc"] for x in r["rows"]], target or 0.0
            )
            base_reach.append(hit)
        reached = [h for h in reach if h is not None]
        mean_rounds = float(np.mean(reached)) if reached and len(reached) == len(reach) else None
        base_rounds = float(np.mean([h for h in base_reach if h is not None])) if base_reach else None
        diverged = [r for r in results if r["summary"].get("status") == "diverged"]
        out.append(
            {
                "setting": setting,
                "method": method,
                "seeds": len(results),
                "completed": len(done),
                "status": "diverged" if "diverged" in statuses else ",".join(statuses),
                "final_acc": [r["summary"]["final_acc"] for r in done],
                "best_acc": [r["summary"]["best_acc"] for r in done],
                "last10_acc": [
                    r["summary"].get("last10_mean_acc") for r in done if r["summary"].get("last10_mean_acc")
                ],
                "forgetting": [r["summary"]["forgetting"] for r in done],
                "wall_seconds": [r["summary"]["wall_seconds"] for r in done],
                "target": target,
                "rounds_to_target": mean_rounds,
                "speedup": (base_rounds / mean_rounds) if (mean_rounds and base_rounds) else None,
                "diverged_round": [_divergence_round(r) for r in diverged],
                "best_before_divergence": [
                    max((x["global_acc"] for x in r["rows"] if math.isfinite(x["global_acc"])), default=math.nan)
                    for r in diverged
                ],
            }
        )
    return out


def _divergence_round(run: dict[str, Any]) -> int:
    """The round a diverged run failed in: its summary's, else its first non-finite accuracy, else the next round."""
    if run["summary"].get("diverged_round") is not None:
        return int(run["summary"]["diverged_round"])
    for x in run["rows"]:
        if not math.isfinite(x["global_acc"]):
            return int(x["round"])
    return int(run["summary"].get("rounds_done", len(run["rows"]))) + 1


def _table_rows(summary: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = [
        "setting",
        "method",
        "final acc (%)",
        "best acc (%)",
        "last-10 acc (%)",
        "forgetting F",
        "rounds to target",
        "speedup",
        "wall (s)",
        "status",
    ]
    rows = []
    for s in summary:
        if s["status"] == "diverged" or not s["completed"]:
            final, best_cell = s["status"], ""
            if s["status"] == "diverged":
                best = [b for b in s["best_before_divergence"] if math.isfinite(b)]
                final = "diverged in round " + ", ".join(str(r) for r in s["diverged_round"])
                best_cell = f"{fmt(best)} before" if best else ""
            rows.append([s["setting"], s["method"], final, best_cell, "", "", "", "", "", s["status"]])
            continue
        rows.append(
            [
                s["setting"],
                s["method"],
                fmt(s["final_acc"]),
                fmt(s["best_acc"]),
                fmt(s["last10_acc"]),
                fmt(s["forgetting"], scale=1.0, digits=4),
                "–" if s["rounds_to_target"] is None else f"{s['rounds_to_target']:.0f}",
                "–" if s["speedup"] is None else f"{s['speedup']:.2f}x",
                f"{np.mean(s['wall_seconds']):.0f}",
                s["status"],
            ]
        )
    return header, rows


def write_tables(summary: list[dict[str, Any]], out_dir: Path, title: str) -> tuple[Path, Path]:
    """``results.md`` and ``results.csv``."""
    header, rows = _table_rows(summary)
    md = [
        f"# {title}",
        "",
        "Mean ± std over seeds. Target: the baseline's mean final accuracy in the same setting; "
        "speedup = baseline's rounds to target / the method's.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    # Whole files, under temporaries unique to this process: comparisons sharing an output folder never collide.
    write_text_atomic(out_dir / "results.md", "\n".join(md) + "\n")
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    write_text_atomic(out_dir / "results.csv", buf.getvalue())
    return out_dir / "results.md", out_dir / "results.csv"


def plot_curves(runs: Sequence[RunRef], setting: str, path: Path, smooth: int = 0) -> Path:
    """Learning curves of every method of a setting on one axis (accuracy in %), mean with a min–max band over seeds.

    A diverged run's method is marked at the round it diverged in; ``smooth > 1`` draws each mean as a moving
    average over that many evaluations (the raw mean faint behind it), for noisy comparisons.
    """
    plt = _pyplot()
    by_method: dict[str, list[dict[int, float]]] = defaultdict(list)
    diverged: dict[str, int] = {}
    described = ""
    for s, method, _seed, run_dir in runs:
        data = read_run(run_dir) if s == setting else None
        if not data:
            continue
        described = described or _describe(data["summary"])
        if data["summary"].get("status") == "diverged":
            diverged.setdefault(method, _divergence_round(data))
        rows = [r for r in data["rows"] if math.isfinite(r["global_acc"])]
        if rows:
            by_method[method].append({int(r["round"]): 100.0 * r["global_acc"] for r in rows})
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
            mark_divergence(ax, diverged[method], color=color, label=f"{method} diverged")
    integer_round_axis(ax, sorted(plotted))
    ax.set_ylabel("global test accuracy (%)")
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


def write_report(name: str, output_dir: Path, runs: Sequence[RunRef], baseline: str, smooth: int = 0) -> Path:
    """Tables and plots of a comparison into ``output_dir/report``; ``smooth > 1`` adds moving-average curves."""
    out = Path(output_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(runs, baseline)
    write_tables(summary, out, f"{name} (baseline: {baseline})")
    for setting in dict.fromkeys(s for s, *_ in runs):
        plot_curves(runs, setting, out / f"curves_{setting}.png")
        if smooth > 1:
            plot_curves(runs, setting, out / f"curves_{setting}_ma{smooth}.png", smooth=smooth)
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

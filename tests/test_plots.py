"""Figures that read like the tables: integer rounds, accuracy in %, titles with the setting, divergence marked."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from fl_lightning.core.plots import moving_average, plot_curve
from fl_lightning.experiments.figures import plot_curves
from fl_lightning.experiments.report import write_report

PACKAGE = Path(__file__).resolve().parent.parent / "fl_lightning"


def x_ticks(ax) -> list[float]:
    ax.figure.canvas.draw()
    lo, hi = ax.get_xlim()
    return [t for t in ax.get_xticks() if lo <= t <= hi]


def test_curve_in_percent_with_integer_rounds_and_divergence(tmp_path, figures):
    path = plot_curve(
        [1, 2, 3], [0.2, 0.5, 0.6], tmp_path / "c.png", "FedAvg on digits, dirichlet(0.5)", diverged_round=4
    )
    assert path.stat().st_size > 0
    ax = figures[0].axes[0]
    assert all(float(t).is_integer() for t in x_ticks(ax))  # before: ticks at 1.0, 1.25, 1.5, ...
    curve = ax.lines[0].get_ydata()
    assert list(curve) == pytest.approx([20.0, 50.0, 60.0]) and "%" in ax.get_ylabel()
    assert any(list(line.get_xdata()) == [4, 4] for line in ax.lines[1:])  # the divergence line
    assert "digits" in ax.get_title()


def test_moving_average_view(tmp_path, figures):
    plot_curve([1, 2, 3, 4], [0.1, 0.3, 0.5, 0.7], tmp_path / "c.png", smooth=2)
    smoothed = figures[0].axes[0].lines[1].get_ydata()
    assert list(smoothed) == pytest.approx([10.0, 20.0, 40.0, 60.0])


def test_plotting_leaves_the_users_backend_and_figures_alone(tmp_path):
    # Before: the first run switched matplotlib to Agg, which broke a notebook's plotting after trainer.fit.
    import matplotlib
    import matplotlib.pyplot as plt

    from fl_lightning.core.plots import plot_partition

    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        mine = plt.figure()
        plot_curve([1, 2], [0.3, 0.4], tmp_path / "c.png")
        plot_partition(np.array([[3, 0], [1, 2]]), tmp_path / "p.png")
        assert matplotlib.get_backend() == "svg"
        assert plt.get_fignums() == [mine.number] and plt.gcf() is mine
        assert (tmp_path / "c.png").read_bytes()[:8] == (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        plt.close("all")
        matplotlib.use(before)


def test_moving_average_is_trailing():
    assert moving_average([1, 2, 3, 4, 5], 3).tolist() == pytest.approx([1.0, 1.5, 2.0, 3.0, 4.0])
    assert moving_average([1, 2], 0).tolist() == [1, 2]


def _run(run_dir: Path, accs: list[float], status: str = "completed") -> Path:
    run_dir.mkdir(parents=True)
    rows = ["round,global_acc,acc_class_0,acc_class_1"]
    rows += [f"{i + 1},{a},{a},{a}" for i, a in enumerate(accs)]
    (run_dir / "metrics.csv").write_text("\n".join(rows) + "\n")
    summary = {
        "status": status,
        "dataset": "digits",
        "partition": "shard(2)",
        "num_clients": 10,
        "final_acc": accs[-1],
        "best_acc": max(accs),
        "forgetting": 0.0,
        "wall_seconds": 1.0,
        "rounds_done": len(accs),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def test_comparison_curves(tmp_path, figures):
    runs = [
        ("shard2", "fedavg", 0, _run(tmp_path / "a", [0.1, 0.4, 0.5, 0.6])),
        ("shard2", "fedka", 0, _run(tmp_path / "b", [0.1, 0.3], status="diverged")),
    ]
    plot_curves(runs, "shard2", tmp_path / "curves.png", smooth=2)
    ax = figures[0].axes[0]
    assert ax.get_title() == "digits, shard(2), 10 clients (shard2), moving average over 2 rounds"
    assert max(max(line.get_ydata()) for line in ax.lines) > 1  # percent
    assert all(float(t).is_integer() for t in x_ticks(ax))
    assert any("fedka diverged (round 3)" in t.get_text() for t in ax.texts)


def test_many_methods_keep_distinct_lines(tmp_path, figures):
    runs = [("s", f"m{i}", 0, _run(tmp_path / f"r{i}", [0.1, 0.2 + i / 100])) for i in range(13)]
    plot_curves(runs, "s", tmp_path / "curves.png")
    lines = [line for line in figures[0].axes[0].lines if not line.get_label().startswith("_")]
    assert len(lines) == 13
    assert len({(line.get_color(), line.get_linestyle()) for line in lines}) == 13  # tab10 alone repeats after 10


def test_report_writes_smoothed_view(tmp_path):
    runs = [("s", "fedavg", 0, _run(tmp_path / "a", [0.1, 0.4, 0.5, 0.6]))]
    out = write_report("t", tmp_path, runs, "fedavg", smooth=3)
    assert (out / "curves_s.png").exists() and (out / "curves_s_ma3.png").exists()
    assert not (out / "local_curves_s.png").exists()  # no run measured AccL


def test_local_accuracy_curves_of_runs_with_eval_local(tmp_path, figures):
    with_local = _run(tmp_path / "a", [0.5, 0.6, 0.7])
    lines = (with_local / "metrics.csv").read_text().splitlines()
    lines = [lines[0] + ",local_acc_mean"] + [
        f"{row},{acc}" for row, acc in zip(lines[1:], ["nan", 0.4, 0.45], strict=True)
    ]
    (with_local / "metrics.csv").write_text("\n".join(lines) + "\n")
    runs = [("s", "fedcad", 0, with_local), ("s", "fedavg", 0, _run(tmp_path / "b", [0.5, 0.6, 0.6]))]
    out = write_report("t", tmp_path, runs, "fedavg")
    assert (out / "local_curves_s.png").stat().st_size > 0
    ax = next(fig.axes[0] for fig in figures if "AccL" in fig.axes[0].get_ylabel())
    drawn = {line.get_label(): line for line in ax.lines if not line.get_label().startswith("_")}
    assert list(drawn) == ["fedcad"]  # fedavg's run has no AccL column: no line
    assert list(drawn["fedcad"].get_xdata()) == [2, 3]  # round 1 was not measured (nan)
    assert list(drawn["fedcad"].get_ydata()) == pytest.approx([40.0, 45.0])
    with pytest.raises(ValueError, match="curve column 'x'"):
        plot_curves(runs, "s", tmp_path / "c.png", column="x")
    out = write_report("t", tmp_path, runs[1:], "fedavg")  # the AccL run left the comparison
    assert not (out / "local_curves_s.png").exists()


def test_no_module_imports_matplotlib_at_import_time():
    """Importing fl_lightning's modules must not import matplotlib (it is imported when a figure is drawn)."""
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] == "matplotlib" for n in names), f"{path.name} imports matplotlib"


def test_write_report_keeps_numbers_unchanged(tmp_path):
    runs = [("s", "fedavg", 0, _run(tmp_path / "a", [0.1, 0.5]))]
    out = write_report("t", tmp_path, runs, "fedavg")
    assert "50.00" in (out / "results.md").read_text()
    assert np.isfinite(json.loads((out / "summary.json").read_text())[0]["final_acc"][0])

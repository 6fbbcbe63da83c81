"""Metrics on hand-made histories, and the comparison tables and plots on fixed inputs."""

from __future__ import annotations

import csv
import json

import pytest

from fl_lightning.metrics import forgetting, forgetting_degree, rounds_to_target
from fl_lightning.report import fmt, mean_std, summarize, write_report


def test_forgetting_hand_made():
    # class 0: peak 0.9 then 0.6 at T (forgot 0.3); class 1: 0.5 -> 0.8 -> 0.7 (max drop from earlier = 0.1)
    history = [[0.9, 0.5], [0.7, 0.8], [0.6, 0.7]]
    assert forgetting(history) == pytest.approx((0.3 + 0.1) / 2)


def test_forgetting_single_round_and_improvement():
    assert forgetting([[0.3, 0.4]]) == 0.0
    assert forgetting([[0.1, 0.2], [0.5, 0.6]]) == pytest.approx(-0.4)


def test_rounds_to_target():
    assert rounds_to_target([1, 2, 3, 4], [0.2, 0.5, 0.49, 0.7], 0.5) == 2
    assert rounds_to_target([1, 2], [0.2, 0.3], 0.5) is None


def test_forgetting_degree():
    tau = forgetting_degree([0.8, 0.5], [0.4, 0.5], xi=0.0)
    assert tau.tolist() == pytest.approx([0.5, 0.0])


def test_mean_std_and_format():
    assert mean_std([0.8, 0.9, 1.0]) == (0.9, 0.1)
    assert fmt([0.8, 0.9, 1.0]) == "90.00 ± 10.00"
    assert fmt([0.5]) == "50.00"


def _fake_run(path, accs, status="completed", num_classes=2):
    path.mkdir(parents=True)
    with open(path / "metrics.csv", "w", newline="") as f:
        fields = ["round", "global_acc", *[f"acc_class_{c}" for c in range(num_classes)]]
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for r, a in enumerate(accs, 1):
            writer.writerow({"round": r, "global_acc": a, **{f"acc_class_{c}": a for c in range(num_classes)}})
    summary = {
        "status": status,
        "final_acc": accs[-1],
        "best_acc": max(accs),
        "forgetting": 0.01,
        "wall_seconds": 10.0,
        "last10_mean_acc": sum(accs[-10:]) / len(accs[-10:]),
    }
    (path / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def comparison(tmp_path):
    runs = []
    curves = {
        ("fedavg", 0): [0.2, 0.4, 0.5, 0.6],
        ("fedavg", 1): [0.2, 0.3, 0.5, 0.6],
        ("fedntd", 0): [0.3, 0.6, 0.7, 0.8],
        ("fedntd", 1): [0.4, 0.6, 0.7, 0.6],
        ("broken", 0): [0.1, float("nan")],
    }
    for (method, seed), accs in curves.items():
        run_dir = tmp_path / "s" / method / f"seed{seed}"
        _fake_run(run_dir, accs, status="diverged" if method == "broken" else "completed")
        runs.append(("s", method, seed, run_dir))
    return tmp_path, runs


def test_summary_mean_std_rounds_and_speedup(comparison):
    _, runs = comparison
    rows = {r["method"]: r for r in summarize(runs, baseline="fedavg")}
    assert rows["fedavg"]["target"] == pytest.approx(0.6)
    assert rows["fedavg"]["rounds_to_target"] == 4
    assert rows["fedntd"]["rounds_to_target"] == 2  # both seeds reach 0.6 at round 2
    assert rows["fedntd"]["speedup"] == pytest.approx(2.0)
    assert mean_std(rows["fedntd"]["final_acc"]) == (0.7, 0.1414)
    assert rows["broken"]["status"] == "diverged"
    assert rows["broken"]["diverged_round"] == [2]  # its first non-finite accuracy
    assert rows["broken"]["best_before_divergence"] == [0.1]


def test_report_files(comparison):
    tmp_path, runs = comparison
    out = write_report("demo", tmp_path, runs, "fedavg")
    md = (out / "results.md").read_text()
    assert "| s | fedntd | 70.00 ± 14.14 | 75.00 ± 7.07 |" in md
    assert "2.00x" in md
    assert "| s | broken | diverged in round 2 | 10.00 before |" in md
    with open(out / "results.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0][:3] == ["setting", "method", "final acc (%)"] and len(rows) == 4
    for name in ("curves_s.png", "class_acc_s_fedavg.png", "class_acc_s_fedntd.png"):
        assert (out / name).stat().st_size > 1000

"""Metrics on hand-made histories, and the comparison tables and plots on fixed inputs."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from fl_lightning.core.metrics import forgetting, forgetting_degree, rounds_to_target
from fl_lightning.experiments.aggregate import mean_std, summarize
from fl_lightning.experiments.published import Published
from fl_lightning.experiments.report import write_report
from fl_lightning.experiments.tables import PER_SEED_COLUMNS, fmt, fmt_delta


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
    assert mean_std([0.8, 0.9, 1.0]) == pytest.approx((0.9, 0.1))
    assert fmt([0.8, 0.9, 1.0]) == "90.00 ± 10.00"
    assert fmt([0.5]) == "50.00"


def test_a_cell_is_rounded_once():
    """FedCurv's Δ final in fmnist_ntd_3seeds: std 0.585007 pp shows 0.59 (rounded to 0.585 first, it showed 0.58)."""
    assert fmt_delta([-0.0044, -0.0102, 0.0015]) == "-0.44 ± 0.59 (1/3)"
    assert fmt_delta([-0.00001, 0.0, -0.00003]) == "+0.00 ± 0.00 (0/3)"  # a mean of -0.0013 pp is not "-0.00"


def _fake_run(path, accs, status="completed", num_classes=2, wall_seconds=10.0):
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
        "wall_seconds": wall_seconds,
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
    assert mean_std(rows["fedntd"]["final_acc"]) == pytest.approx((0.7, 0.1414), abs=1e-4)
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


# Paired by seed: a baseline (fedavg) and two methods over seeds 0-2, with hand-chosen curves (5 rounds each).
# Targets per seed, fedavg's final / best accuracy and the round fedavg reaches it:
#   seed 0: final 0.5 (round 3), best 0.6 (round 4); seed 1: 0.6 (5), 0.6 (5); seed 2: 0.6 (3), 0.7 (3).
PAIRED_CURVES = {
    ("fedavg", 0): ([0.1, 0.3, 0.5, 0.6, 0.5], 100.0),  # last-10 0.40
    ("fedavg", 1): ([0.2, 0.4, 0.4, 0.5, 0.6], 110.0),  # last-10 0.42
    ("fedavg", 2): ([0.3, 0.5, 0.7, 0.6, 0.6], 120.0),  # last-10 0.54
    # final target: rounds 1, 2, 2 (speedups 3, 2.5, 1.5); best target: rounds 2, 2, never (speedups 2, 2.5)
    ("fedx", 0): ([0.5, 0.6, 0.6, 0.7, 0.7], 50.0),  # deltas final +0.20, best +0.10, last-10 +0.22
    ("fedx", 1): ([0.3, 0.6, 0.5, 0.5, 0.5], 60.0),  # deltas final -0.10, best 0 (no win), last-10 +0.06
    ("fedx", 2): ([0.4, 0.6, 0.65, 0.65, 0.65], 70.0),  # deltas final +0.05, best -0.05, last-10 +0.05
    ("fedy", 0): ([0.6, 0.6, 0.6, 0.6, 0.6], 30.0),  # both targets at round 1 (speedups 3 and 4)
    ("fedy", 1): ([0.2, float("nan")], 5.0),  # diverged: out of the means and pairings, its wall time counted
    ("fedy", 2): None,  # missing: never ran
}


@pytest.fixture
def paired_comparison(tmp_path):
    runs = []
    for (method, seed), curve in PAIRED_CURVES.items():
        run_dir = tmp_path / "s" / method / f"seed{seed}"
        if curve is not None:
            accs, wall = curve
            status = "completed" if all(a == a for a in accs) else "diverged"
            _fake_run(run_dir, accs, status=status, wall_seconds=wall)
        runs.append(("s", method, seed, run_dir))
    return tmp_path, runs


def test_fmt_delta():
    assert fmt_delta([0.02, -0.01, 0.005]) == "+0.50 ± 1.50 (2/3)"
    assert fmt_delta([-0.0123]) == "-1.23 (0/1)"
    assert fmt_delta([0.0, 0.0]) == "+0.00 ± 0.00 (0/2)"
    assert fmt_delta([]) == "–"


def test_summary_pairs_each_seed_with_the_baselines(paired_comparison):
    _, runs = paired_comparison
    rows = {r["method"]: r for r in summarize(runs, baseline="fedavg")}
    fedavg, fedx, fedy = rows["fedavg"], rows["fedx"], rows["fedy"]
    # the baseline against itself: its own rounds, speedup 1
    assert fedavg["targets"]["final"] == {
        "target": [0.5, 0.6, 0.6],
        "rounds": [3, 5, 3],
        "speedup": [1.0, 1.0, 1.0],
        "reached": 3,
        "paired": 3,
    }
    assert fedavg["targets"]["best"]["rounds"] == [4, 5, 3]
    assert fedx["targets"]["final"] == {
        "target": [0.5, 0.6, 0.6],
        "rounds": [1, 2, 2],
        "speedup": [3.0, 2.5, 1.5],
        "reached": 3,
        "paired": 3,
    }
    # seed 2 never reaches fedavg's best accuracy 0.7 (it peaks at 0.65)
    assert fedx["targets"]["best"] == {
        "target": [0.6, 0.6, 0.7],
        "rounds": [2, 2],
        "speedup": [2.0, 2.5],
        "reached": 2,
        "paired": 3,
    }
    # the former columns are the final target's, paired by seed
    assert fedx["target"] == pytest.approx(17 / 30)
    assert fedx["rounds_to_target"] == pytest.approx(5 / 3)
    assert fedx["speedup"] == pytest.approx(7 / 3)
    assert fedx["deltas"]["final_acc"] == pytest.approx([0.2, -0.1, 0.05])
    assert fedx["deltas"]["best_acc"] == pytest.approx([0.1, 0.0, -0.05])
    assert fedx["deltas"]["last10_acc"] == pytest.approx([0.22, 0.06, 0.05])
    # fedy: seed 1 diverged and seed 2 is missing, so only seed 0 is paired
    assert fedy["status"] == "diverged" and fedy["completed"] == 1
    assert fedy["targets"]["final"]["paired"] == 1 and fedy["targets"]["best"]["speedup"] == [4.0]
    assert fedy["deltas"]["best_acc"] == [0.0]


def test_report_paired_tables(paired_comparison):
    tmp_path, runs = paired_comparison
    out = write_report("demo", tmp_path, runs, "fedavg")
    md = (out / "results.md").read_text()
    # which paper each target follows
    assert "its final accuracy (FedNTD; docs/source/methods.md) and its best accuracy (FedLMD)" in md
    assert (
        "| rounds to fedavg's final acc | speedup (fedavg's final acc) "
        "| rounds to fedavg's best acc | speedup (fedavg's best acc) |"
    ) in md
    assert (
        "| s | fedavg | 56.67 ± 5.77 | 63.33 ± 5.77 | 45.33 ± 7.57 | 0.0100 ± 0.0000 | 1.67 ± 1.44 | 3.7 ± 1.2 |" in md
    )
    assert "| 4.0 ± 1.0 | 1.00x ± 0.00 | 110 | completed |" in md
    assert "| s | fedx | 61.67 ± 10.41 | 65.00 ± 5.00 | 56.33 ± 7.37 |" in md
    assert "| 1.7 ± 0.6 | 2.33x ± 0.76 | – (2/3) | – (2/3) | 60 | completed |" in md
    # the completed seed's figures, and the others' fate
    assert "| s | fedy | 60.00 | 60.00 | 60.00 | 0.0100 | 0.00 | 1.0 | 3.00x | 1.0 | 4.00x | 30 |" in md
    assert "| 1/3 completed; diverged in round 2; 1 not finished |" in md
    assert "Wall time of the comparison: 545 s (0.15 h), the sum of 8 runs' wall_seconds" in md

    paired = md[md.index("## Paired by seed against fedavg") :]
    assert "| setting | method | paired seeds | Δ final acc (pp) | Δ best acc (pp) | Δ last-10 acc (pp) |" in paired
    assert "| s | fedx | 3 | +5.00 ± 15.00 (2/3) | +1.67 ± 7.64 (1/3) | +11.00 ± 9.54 (3/3) |" in paired
    assert "| s | fedy | 1 | +10.00 (1/1) | +0.00 (0/1) | +20.00 (1/1) |" in paired
    assert "| s | fedavg |" not in paired

    with open(out / "results.csv") as f:
        table = list(csv.reader(f))
    assert len(table) == 4 and table[0][7:11] == [
        "rounds to fedavg's final acc",
        "speedup (fedavg's final acc)",
        "rounds to fedavg's best acc",
        "speedup (fedavg's best acc)",
    ]


def test_per_seed_csv(paired_comparison):
    tmp_path, runs = paired_comparison
    out = write_report("demo", tmp_path, runs, "fedavg")
    with open(out / "per_seed.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(PER_SEED_COLUMNS)
    assert rows[0][:14] == [
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
    ]
    by_run = {(r[1], r[2]): dict(zip(rows[0], r, strict=True)) for r in rows[1:]}
    assert len(rows) == 1 + len(PAIRED_CURVES)
    assert list(by_run[("fedavg", "1")].values()) == [
        "s", "fedavg", "1", "completed", "0.6", "0.6", "0.42", "0.01", "0.0", "5", "5", "0.0", "0.0", "0.0", "1.0",
        "1.0", "", "", "110.0",
    ]  # fmt: skip
    assert list(by_run[("fedx", "0")].values()) == [
        "s", "fedx", "0", "completed", "0.7", "0.7", "0.62", "0.01", "0.0", "1", "2", "0.2", "0.1", "0.22", "3.0",
        "2.0", "", "", "50.0",
    ]  # fmt: skip
    assert list(by_run[("fedx", "1")].values())[8:16] == ["0.025", "2", "2", "-0.1", "0.0", "0.06", "2.5", "2.5"]
    # seed 2 never reaches fedavg's best accuracy: no rounds, no speedup for that target
    assert list(by_run[("fedx", "2")].values())[9:16] == ["2", "", "0.05", "-0.05", "0.05", "1.5", ""]
    assert list(by_run[("fedy", "1")].values()) == ["s", "fedy", "1", "diverged", *[""] * 14, "5.0"]
    assert list(by_run[("fedy", "2")].values()) == ["s", "fedy", "2", "missing", *[""] * 15]


def test_unpaired_seed_when_the_baselines_run_is_missing(tmp_path):
    runs = []
    for method, seed, accs in [
        ("fedavg", 0, [0.2, 0.5]),
        ("fedavg", 1, None),
        ("fedx", 0, [0.5, 0.6]),
        ("fedx", 1, [0.6, 0.7]),
    ]:
        run_dir = tmp_path / method / f"seed{seed}"
        if accs is not None:
            _fake_run(run_dir, accs)
        runs.append(("s", method, seed, run_dir))
    rows = {r["method"]: r for r in summarize(runs, baseline="fedavg")}
    fedx = rows["fedx"]
    assert fedx["completed"] == 2 and fedx["final_acc"] == [0.6, 0.7]  # the unpaired seed still counts in the means
    assert fedx["targets"]["final"] == {"target": [0.5], "rounds": [1], "speedup": [2.0], "reached": 1, "paired": 1}
    assert fedx["deltas"]["final_acc"] == pytest.approx([0.1])
    assert rows["fedavg"]["status"] == "completed,missing"
    out = write_report("demo", tmp_path, runs, "fedavg")
    md = (out / "results.md").read_text()
    assert "| s | fedx | 1 | +10.00 (1/1) | +10.00 (1/1) | +20.00 (1/1) |" in md
    with open(out / "per_seed.csv") as f:
        per_seed = {(r["method"], r["seed"]): r for r in csv.DictReader(f)}
    assert per_seed[("fedx", "1")]["final_acc"] == "0.7"
    assert per_seed[("fedx", "1")]["rounds_to_final_target"] == "" and per_seed[("fedx", "1")]["delta_final_acc"] == ""


def test_report_says_where_runs_trained_and_adds_the_notes(comparison):
    tmp_path, runs = comparison
    summary_path = runs[0][3] / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary.update(device="cuda (NVIDIA H100)", engine="batched", precision="bf16-mixed")
    summary_path.write_text(json.dumps(summary))
    notes = ["broken diverged:   its loss   blows up", "a second note"]
    md = (write_report("demo", tmp_path, runs, "fedavg", notes=notes) / "results.md").read_text()
    where = md.splitlines()[2]
    assert where.startswith("Where the runs trained: ")
    assert "cuda (NVIDIA H100), batched engine, bf16-mixed (1 run)" in where
    assert "device not recorded, sequential engine, ? (4 runs)" in where  # summaries written before `device`
    assert md.endswith("## Notes\n\n- broken diverged: its loss blows up\n- a second note\n")


def test_published_numbers_sit_beside_ours_with_the_gap_in_stds(comparison):
    tmp_path, runs = comparison
    published = Published(
        source="Bench, Table 3.",
        metric="best_acc",
        values={("s", "fedavg"): (50.0, 4.0), ("s", "fedntd"): (80.0, None)},
    )
    md = (write_report("demo", tmp_path, runs, "fedavg", published=published) / "results.md").read_text()
    section = md.split("## Against the published numbers")[1]
    assert "Bench, Table 3. Set beside fl_lightning's best acc" in section
    # fedavg's best accuracies are 0.6 and 0.6: +10 points over 50 ± 4, 2.5 stds; fedntd's 0.8 and 0.7 have no std
    assert "| s | fedavg | 50.00 ± 4.00 | 60.00 ± 0.00 | +10.00 | +2.5 |" in section
    assert "| s | fedntd | 80.00 | 75.00 ± 7.07 | -5.00 | – |" in section
    assert "broken" not in section  # a method the source gives no number for anywhere
    with open(tmp_path / "report" / "published.csv") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"fedavg", "fedntd"}
    assert rows["fedavg"]["difference"] == "10.0" and rows["fedavg"]["in_stds"] == "2.5"
    assert rows["fedntd"]["published_std"] == "" and rows["fedntd"]["seeds"] == "2"
    with pytest.raises(ValueError, match="choose one of"):
        Published(source="x", metric="accuracy")
    assert "Against the published" not in (write_report("demo", tmp_path, runs, "fedavg") / "results.md").read_text()
    assert not (tmp_path / "report" / "published.csv").exists()


def test_device_label():
    from fl_lightning.core.provenance import device_label

    assert device_label(torch.device("cpu")) == "cpu"
    if torch.cuda.is_available():
        assert device_label(torch.device("cuda", 0)).startswith("cuda (")


def test_local_model_measures_when_runs_evaluated_them(tmp_path):
    """AccL and FedKA's forgetting degree (``--federation.eval_local``): last-10 means, in both tables' files."""
    runs = []
    for seed, (local, degree) in enumerate([(0.5, 0.2), (0.7, 0.1)]):
        run_dir = tmp_path / "s" / "fedavg" / f"seed{seed}"
        _fake_run(run_dir, [0.6] * 12)
        rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
        with open(run_dir / "metrics.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, [*rows[0], "local_acc_mean", "local_forgetting_degree"])
            writer.writeheader()
            for i, row in enumerate(rows):  # the first two rounds are outside the last 10
                writer.writerow({**row, "local_acc_mean": 0.0 if i < 2 else local, "local_forgetting_degree": degree})
        runs.append(("s", "fedavg", seed, run_dir))
    out = write_report("demo", tmp_path, runs, "fedavg")
    md = (out / "results.md").read_text()
    assert "| AccL last-10 (%) | forgetting degree τ last-10 |" in md
    assert "| 60.00 ± 14.14 | 0.1500 ± 0.0707 |" in md
    per_seed = list(csv.DictReader(open(out / "per_seed.csv")))
    assert [float(r["local_acc_last10"]) for r in per_seed] == [0.5, 0.7]


def test_an_empty_metrics_cell_reads_as_missing_not_a_crash(tmp_path):
    """A round without validation leaves val/ columns empty (outputs.md); the report crashed on float('')."""
    from fl_lightning.experiments.runs import read_run

    run_dir = tmp_path / "s" / "fedavg" / "seed0"
    _fake_run(run_dir, [0.2, 0.4, 0.6])
    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
    with open(run_dir / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, [*rows[0], "val/loss", "val/acc"])
        writer.writeheader()
        for i, row in enumerate(rows):  # validation in round 2 only (check_val_every_n_epoch 2)
            writer.writerow({**row, "val/loss": 1.5 if i == 1 else "", "val/acc": 0.5 if i == 1 else ""})
    data = read_run(run_dir)
    assert [r["val/acc"] for r in data["rows"]][1] == 0.5
    assert all(r["val/acc"] != r["val/acc"] for i, r in enumerate(data["rows"]) if i != 1)  # NaN
    out = write_report("demo", tmp_path, [("s", "fedavg", 0, run_dir)], "fedavg")
    assert "| s | fedavg | 60.00 | 60.00 |" in (out / "results.md").read_text()
    (run_dir / "metrics.csv").write_text("round,global_acc\n1,abc\n")
    with pytest.raises(ValueError, match="column 'global_acc' holds 'abc', not a number"):
        read_run(run_dir)


def test_runs_of_different_lengths_are_not_paired_and_the_report_says_so(tmp_path):
    """FedAvg's 3 rounds beside FedNTD's 6 were paired silently, a "+22.78" gain that was the extra rounds'."""
    runs = []
    for method, accs in [("fedavg", [0.2, 0.4, 0.5]), ("fedntd", [0.2, 0.4, 0.5, 0.6, 0.7, 0.73])]:
        run_dir = tmp_path / "s" / method / "seed0"
        _fake_run(run_dir, accs)
        summary = json.loads((run_dir / "summary.json").read_text())
        (run_dir / "summary.json").write_text(json.dumps({**summary, "rounds": len(accs)}))
        runs.append(("s", method, 0, run_dir))
    with pytest.warns(UserWarning, match=r"Setting s: its runs differ in length \(3 rounds: fedavg/seed0; 6 rounds"):
        out = write_report("demo", tmp_path, runs, "fedavg")
    per_seed = {r["method"]: r for r in csv.DictReader(open(out / "per_seed.csv"))}
    assert per_seed["fedntd"]["final_acc"] == "0.73" and per_seed["fedntd"]["delta_final_acc"] == ""
    assert per_seed["fedntd"]["speedup_final_target"] == "" and per_seed["fedavg"]["delta_final_acc"] == "0.0"
    md = (out / "results.md").read_text()
    assert "| s | fedntd | 0 | – | – | – |" in md  # no seed paired
    assert "give every run one --federation.rounds" in md.split("## Notes")[1]
    # one length: paired, and no note
    for _s, _m, _seed, run_dir in runs:
        summary = json.loads((run_dir / "summary.json").read_text())
        (run_dir / "summary.json").write_text(json.dumps({**summary, "rounds": 6}))
    md = (write_report("demo", tmp_path, runs, "fedavg") / "results.md").read_text()
    assert "| s | fedntd | 1 | +23.00 (1/1) |" in md and "differ in length" not in md


def test_a_run_that_diverged_in_round_1_is_in_the_report(tmp_path):
    """It writes summary.json but no metrics.csv; it was left out as "No run finished yet"."""
    base, hot = tmp_path / "s" / "fedavg" / "seed0", tmp_path / "s" / "fedavg_hot" / "seed0"
    _fake_run(base, [0.2, 0.4, 0.6])
    hot.mkdir(parents=True)
    summary = {"status": "diverged", "rounds": 3, "rounds_done": 0, "final_acc": None, "best_acc": None}
    (hot / "summary.json").write_text(json.dumps({**summary, "diverged_round": 1, "wall_seconds": 0.0}))
    runs = [("s", "fedavg", 0, base), ("s", "fedavg_hot", 0, hot)]
    out = write_report("demo", tmp_path, runs, "fedavg")
    md = (out / "results.md").read_text()
    assert "| s | fedavg_hot | diverged in round 1 |  |" in md
    assert "No run finished yet" not in md and "left out" not in md
    per_seed = {r["method"]: r for r in csv.DictReader(open(out / "per_seed.csv"))}
    assert per_seed["fedavg_hot"]["status"] == "diverged"


def test_every_file_the_report_writes_is_in_the_guides_table(comparison):
    """compare.md's table of report files named all but summary.json."""
    from pathlib import Path

    tmp_path, runs = comparison
    (runs[0][3] / "partition.png").write_bytes(b"png")
    out = write_report("demo", tmp_path, runs, "fedavg", smooth=3)
    guide = (Path(__file__).parents[1] / "docs/source/guide/compare.md").read_text()
    table = guide[guide.index("| file | content |") :].split("\n\n")[0]
    files = " ".join(row.split("|")[1] for row in table.splitlines() if row.startswith("| `"))  # first cells
    written = sorted(p.name for p in out.iterdir())
    assert "summary.json" in written and "curves_s_ma3.png" in written
    for name in written:
        for method in ("fedavg", "fedntd", "broken"):
            name = name.replace(f"_s_{method}.", "_<setting>_<method>.")
        name = name.replace("_s_ma3.", "_<setting>_ma<n>.").replace("_s.", "_<setting>.")
        assert f"`{name}`" in files or name == "curves_<setting>_ma<n>.png", name  # that one: in the prose

"""The claims table (papers' numbers beside fl_lightning's, with verdicts) and README's generated sections."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from fl_lightning.experiments import claims, includes
from fl_lightning.experiments.tables import PER_SEED_COLUMNS

ROOT = Path(__file__).resolve().parents[1]


def write_per_seed(results: Path, table: str, runs: list[dict]) -> None:
    """A comparison's report/per_seed.csv with the given runs (missing columns empty)."""
    out = results / table / "report"
    out.mkdir(parents=True)
    with (out / "per_seed.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, PER_SEED_COLUMNS)
        writer.writeheader()
        for run in runs:
            writer.writerow({c: run.get(c, "") for c in PER_SEED_COLUMNS})


def run(method: str, seed: int, final: float, base_final: float, status: str = "completed", **extra: float) -> dict:
    row = {"setting": "s", "method": method, "seed": seed, "status": status}
    if status == "completed":
        row.update(final_acc=final, delta_final_acc=round(final - base_final, 6), **extra)
    return row


def claim(cid: str, method: str, fedavg: float, value: float, **measure: str) -> dict:
    out = {"id": cid, "paper": "p", "dataset": "MNIST", "metric": "acc", "method": method}
    out.update(fedavg=fedavg, method_value=value)
    if measure:
        out["measure"] = {"table": "t", "setting": "s", "method": method.lower(), **measure}
    return out


@pytest.fixture
def results(tmp_path: Path) -> Path:
    base = [0.80, 0.75, 0.78]
    runs = [run("fedavg", s, b, b, speedup_final_target=1.0) for s, b in enumerate(base)]
    # wins every seed by 2-4 points; wins seed 0 only; loses on average; diverged on every seed
    runs += [
        run("good", s, b + d, b, speedup_final_target=sp)
        for s, (b, d, sp) in enumerate(zip(base, [0.02, 0.03, 0.04], [1.5, 2.0, 2.5], strict=True))
    ]
    runs += [run("lucky", s, b + d, b) for s, (b, d) in enumerate(zip(base, [0.05, -0.01, -0.01], strict=True))]
    runs += [run("mixed", s, b + d, b) for s, (b, d) in enumerate(zip(base, [0.01, 0.01, -0.005], strict=True))]
    runs += [run("bad", s, 0.0, 0.0, status="diverged") for s in range(3)]
    write_per_seed(tmp_path, "t", runs)
    return tmp_path


def test_verdicts_pair_seeds_and_compare_with_the_papers_gain(results: Path) -> None:
    rows = {
        c["id"]: claims.claim_row(c, results)
        for c in [
            claim("good", "Good", 80.0, 83.0, metric="final_acc"),
            claim("good-small", "Good", 80.0, 90.0, metric="final_acc"),  # paper +10: 3 points is under half
            claim("lucky", "Lucky", 80.0, 82.0, metric="final_acc"),
            claim("mixed", "Mixed", 80.0, 81.0, metric="final_acc"),
            claim("bad", "Bad", 80.0, 82.0, metric="final_acc"),
            claim("pending", "Other", 80.0, 82.0, metric="final_acc"),
            claim("unmeasured", "Good", 80.0, 82.0),
        ]
    }
    good = rows["good"]
    assert good["verdict"] == "reproduced" and good["wins"] == "3/3" and good["seeds"] == "0 1 2"
    assert good["fl_gain_mean"] == pytest.approx(3.0) and good["fl_gain_std"] == pytest.approx(1.0)
    assert good["fl_fedavg"] == "77.67 ± 2.52" and good["paper_gain"] == pytest.approx(3.0)
    assert rows["good-small"]["verdict"] == "direction only"
    assert (rows["lucky"]["verdict"], rows["lucky"]["verdict_seed0"]) == ("direction only", "reproduced")
    assert rows["lucky"]["wins"] == "1/3"
    assert rows["mixed"]["verdict"] == "direction only"
    assert rows["bad"]["verdict"] == "diverged" and rows["bad"]["diverged"] == "3/3"
    assert rows["pending"]["verdict"] == "not run"
    assert "bash scripts/paper_tables.sh t" in rows["pending"]["reason"]
    assert rows["unmeasured"]["verdict"] == "not run"


def test_a_loss_against_fedavg_is_not_reproduced(tmp_path: Path) -> None:
    base = [0.80, 0.81]
    runs = [run("fedavg", s, b, b) for s, b in enumerate(base)]
    runs += [run("worse", s, b - 0.02, b) for s, b in enumerate(base)]
    write_per_seed(tmp_path, "t", runs)
    row = claims.claim_row(claim("w", "Worse", 80.0, 85.0, metric="final_acc"), tmp_path)
    assert row["verdict"] == "not reproduced" and row["wins"] == "0/2"
    assert row["fl_gain_mean"] == pytest.approx(-2.0)


def test_rounds_claims_compare_speedups(results: Path) -> None:
    paper = {**claim("r", "Good", 100, 40, metric="speedup_final_target"), "paper_metric": "rounds"}
    row = claims.claim_row(paper, results)
    assert row["paper_gain"] == pytest.approx(1.5)  # 100 / 40 = 2.5x
    assert row["fl_gain_mean"] == pytest.approx(1.0)  # 1.5x, 2x, 2.5x: 2x on average, at least half of 1.5
    assert row["verdict"] == "reproduced"


def test_write_claims_and_readme_sections(results: Path, tmp_path: Path) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": [claim("good", "Good", 80.0, 83.0, metric="final_acc")]}))
    md, csv_path = claims.write_claims(path, results)
    assert "| good (MNIST) | 80.0 → Good 83.0 | +3.00 |" in md.read_text()
    assert next(csv.DictReader(csv_path.open()))["verdict"] == "reproduced"

    readme = tmp_path / "README.md"
    marker = "<!-- generated from claims.md: `python cli.py claims` refreshes it -->"
    readme.write_text(f"# Title\n\ntext\n\n{marker}\nold numbers\n<!-- end generated -->\n\nafter\n")
    assert includes.stale_sections(readme) == ["claims.md"]
    assert includes.refresh(readme) == ["claims.md"]
    text = readme.read_text()
    assert "old numbers" not in text and "| good (MNIST) |" in text
    assert text.endswith("<!-- end generated -->\n\nafter\n")
    assert includes.stale_sections(readme) == [] and includes.refresh(readme) == []

    (tmp_path / "report.md").write_text("# A report\n\n## Part\n\nbody\n")
    readme.write_text("<!-- generated from report.md: x -->\n<!-- end generated -->\n")
    includes.refresh(readme)
    assert "#### A report\n\n##### Part\n\nbody\n" in readme.read_text()  # headings below README's own

    (tmp_path / "bench.txt").write_text("# beta  lr\n0.1  0.01\n")  # a script's printed table, shown as printed
    readme.write_text("<!-- generated from bench.txt: x -->\n<!-- end generated -->\n")
    includes.refresh(readme)
    assert "-->\n```text\n# beta  lr\n0.1  0.01\n```\n<!-- end" in readme.read_text()

    readme.write_text("<!-- generated from missing.md: x -->\n<!-- end generated -->\n")
    with pytest.raises(FileNotFoundError, match="missing.md"):
        includes.refresh(readme)


def test_bad_claims_files_fail_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": [claim("x", "X", 1.0, 2.0, metric="accuracy")]}))
    with pytest.raises(ValueError, match="unknown metric 'accuracy'"):
        claims.load_claims(path)
    path.write_text(yaml.safe_dump({"claims": [{"id": "y", "paper": "p"}]}))
    with pytest.raises(ValueError, match="claim y lacks dataset, metric, method"):
        claims.load_claims(path)
    with pytest.raises(FileNotFoundError, match="no claims file"):
        claims.main(["--claims", str(tmp_path / "none.yaml")])
    path.write_text(yaml.safe_dump({"claims": [claim("z", "Z", 1.0, 2.0, metric="final_acc", baseline="kd")]}))
    with pytest.raises(ValueError, match=r"measure has unknown key\(s\) \['baseline'\]"):
        claims.load_claims(path)
    path.write_text(
        yaml.safe_dump({"claims": [{**claim("r", "R", 100, 50, metric="final_acc"), "paper_metric": "rounds"}]})
    )
    with pytest.raises(ValueError, match="paper_metric rounds needs a speedup metric"):
        claims.load_claims(path)
    path.write_text(yaml.safe_dump({"papers": ["FedX"], "claims": [claim("p", "P", 1.0, 2.0)]}))
    with pytest.raises(ValueError, match="'papers' must map each paper's key to its name and title"):
        claims.load_claims(path)
    path.write_text("claims: [\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        claims.load_claims(path)


def test_shipped_claims_table_and_readme_are_the_files_numbers(tmp_path: Path) -> None:
    """results/claims/claims.md is what the claims YAML and results/ give, and README shows it and the reports."""
    md, _ = claims.write_claims(ROOT / "results/claims/paper_claims.yaml", ROOT / "results", tmp_path)
    assert md.read_text() == (ROOT / "results/claims/claims.md").read_text(), "run `python cli.py claims`"
    settings = (tmp_path / "claims_settings.md").read_text()
    assert settings == (ROOT / "results/claims/claims_settings.md").read_text(), "run `python cli.py claims`"
    papers = [line for line in settings.splitlines() if line.startswith("- paper: ")]
    shipped = claims.load_claims(ROOT / "results/claims/paper_claims.yaml")
    assert len(papers) == len(shipped) >= 26 and all('"' in line for line in papers), papers  # each names its title
    assert includes.stale_sections(ROOT / "README.md") == [], "run `python cli.py claims`"
    args = ["--check", "--claims", str(ROOT / "results/claims/paper_claims.yaml"), "--readme", str(ROOT / "README.md")]
    assert claims.main(args) == 0


def test_a_missed_target_is_a_lost_seed(tmp_path: Path) -> None:
    runs = [run("fedavg", s, 0.8, 0.8, speedup_final_target=1.0) for s in range(3)]
    runs += [run("slow", 0, 0.81, 0.8, speedup_final_target=3.0)]
    runs += [run("slow", s, 0.79, 0.8) for s in (1, 2)]  # never reached FedAvg's accuracy: no speedup
    runs += [run("never", s, 0.7, 0.8) for s in range(3)]
    write_per_seed(tmp_path, "t", runs)
    paper = {"paper_metric": "rounds", "fedavg": 100, "method_value": 50}
    slow = claims.claim_row({**claim("a", "Slow", 0, 0, metric="speedup_final_target"), **paper}, tmp_path)
    assert slow["wins"] == "1/3, 2 never reached FedAvg's accuracy" and slow["verdict"] == "not reproduced"
    assert slow["fl_gain_mean"] == pytest.approx(0.0)  # speedups 3, 0, 0
    never = claims.claim_row({**claim("b", "Never", 0, 0, metric="speedup_final_target"), **paper}, tmp_path)
    assert never["verdict"] == "not reproduced" and never["reason"] == ""


def test_a_paper_loss_is_reproduced_by_a_loss(tmp_path: Path) -> None:
    runs = [run("fedavg", s, 0.8, 0.8) for s in range(2)] + [run("worse", s, 0.78, 0.8) for s in range(2)]
    write_per_seed(tmp_path, "t", runs)
    row = claims.claim_row(claim("w", "Worse", 80.0, 77.0, metric="final_acc"), tmp_path)
    assert (row["verdict"], row["wins"]) == ("reproduced", "2/2")  # the paper's sign: below FedAvg on both seeds


def test_seeds_not_run_yet_do_not_block_a_verdict(tmp_path: Path) -> None:
    runs = [run("fedavg", s, 0.8, 0.8) for s in range(3)] + [run("good", s, 0.83, 0.8) for s in range(2)]
    runs.append({"setting": "s", "method": "good", "seed": 2, "status": "missing"})
    write_per_seed(tmp_path, "t", runs)
    row = claims.claim_row(claim("g", "Good", 80.0, 83.0, metric="final_acc"), tmp_path)
    assert (row["verdict"], row["seeds"]) == ("reproduced", "0 1")


def test_a_seed_still_running_neither_wins_nor_loses(tmp_path: Path) -> None:
    runs = [run("fedavg", s, 0.8, 0.8) for s in range(3)] + [run("good", s, 0.83, 0.8) for s in range(2)]
    runs.append({"setting": "s", "method": "good", "seed": 2, "status": "running"})
    write_per_seed(tmp_path, "t", runs)
    row = claims.claim_row(claim("g", "Good", 80.0, 83.0, metric="final_acc"), tmp_path)
    assert (row["verdict"], row["wins"], row["seeds"]) == ("reproduced", "2/2", "0 1")


def test_a_paper_tie_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": [claim("t", "Tie", 19.0, 19.0, metric="forgetting")]}))
    with pytest.raises(ValueError, match="ties FedAvg"):
        claims.load_claims(path)


def test_unpaired_markers_fail(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("A\n")
    readme = tmp_path / "README.md"
    start = "<!-- generated from a.md: x -> y -->"  # a '>' in the marker's text is fine
    readme.write_text(f"{start}\nold\n<!-- end generated -->\n")
    assert includes.refresh(readme) == ["a.md"] and "A\n<!-- end generated -->" in readme.read_text()
    readme.write_text(f"{start}\nold\n\n{start}\nold\n<!-- end generated -->\n")
    with pytest.raises(ValueError, match="2 '<!-- generated from ...-->' and 1 '<!-- end generated -->' markers"):
        includes.refresh(readme)
    readme.write_text("Mention `<!-- generated from x -->` in prose: not a marker.\n")
    assert includes.stale_sections(readme) == []


def test_check_sees_stale_claims_files(tmp_path: Path, results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": [claim("good", "Good", 80.0, 83.0, metric="final_acc")]}))
    readme = tmp_path / "README.md"
    readme.write_text("no sections\n")
    args = ["--claims", str(path), "--results", str(results), "--readme", str(readme)]
    assert claims.main([*args, "--check"]) == 1
    assert "claims.md is out of date" in capsys.readouterr().out
    assert claims.main(args) == 0 and claims.main([*args, "--check"]) == 0
    table = tmp_path / "claims.csv"
    table.write_bytes(table.read_bytes().replace(b"\r\n", b"\n"))  # the same text with other line endings
    assert claims.main([*args, "--check"]) == 1
    assert "claims.csv is out of date" in capsys.readouterr().out


def test_a_papers_failed_is_reproduced_by_divergence_or_chance(tmp_path: Path) -> None:
    runs = [run("fedavg", s, 0.8, 0.8) for s in range(2)]
    runs += [run("gone", s, 0.0, 0.0, status="diverged") for s in range(2)]
    runs += [run("chance", s, 0.12, 0.8) for s in range(2)]  # within 5 points of 10 %
    runs += [run("learns", 0, 0.6, 0.8), run("learns", 1, 0.1, 0.8)]  # fails on one seed of two
    runs += [run("always", 0, 0.6, 0.8), run("always", 1, 0.7, 0.8)]
    write_per_seed(tmp_path, "t", runs)

    def failed(method: str) -> dict:
        return claims.claim_row(
            {**claim(method, method.title(), 28.0, 10.0, metric="final_acc"), "paper_failed": True}, tmp_path
        )

    assert failed("gone")["verdict"] == "reproduced" and failed("gone")["diverged"] == "2/2"
    assert failed("chance")["verdict"] == "reproduced"
    learns = failed("learns")
    assert (learns["verdict"], learns["verdict_seed0"]) == ("direction only", "not reproduced")
    assert failed("always")["verdict"] == "not reproduced"
    path = tmp_path / "claims.yaml"
    bad = {**claim("x", "X", 28.0, 10.0, metric="speedup_final_target"), "paper_failed": True}
    path.write_text(yaml.safe_dump({"claims": [bad]}))
    with pytest.raises(ValueError, match="paper_failed needs an accuracy metric"):
        claims.load_claims(path)


def test_a_local_accuracy_claim_pairs_the_values_of_each_seed(tmp_path: Path) -> None:
    # per_seed.csv has no paired column for AccL: the gain is the method's value minus FedAvg's of the same seed
    runs = [run("fedavg", s, 0.8, 0.8, local_acc_last10=a) for s, a in enumerate([0.80, 0.82, 0.81])]
    runs += [run("fedcad", s, 0.8, 0.8, local_acc_last10=a) for s, a in enumerate([0.85, 0.83, ""])]
    write_per_seed(tmp_path, "t", runs)
    paper = {**claim("l", "FedCAD", 0, 0, metric="local_acc_last10"), "fedavg": None, "method_value": None}
    row = claims.claim_row(paper, tmp_path)
    assert row["seeds"] == "0 1"  # seed 2 ran without eval_local: nothing to pair
    assert row["fl_gain_mean"] == pytest.approx(3.0) and row["fl_gain_std"] == pytest.approx(2.83, abs=0.01)
    assert row["fl_fedavg"] == "81.00 ± 1.41" and row["fl_method_value"] == "84.00 ± 1.41"
    assert row["paper_gain"] == "" and row["wins"] == "2/2"
    assert row["verdict"] == "direction only"  # seed 2 completed but is not paired: not every run won


def test_less_forgetting_is_a_negative_gain(tmp_path: Path) -> None:
    runs = [run("fedavg", s, 0.8, 0.8, forgetting=f) for s, f in enumerate([0.20, 0.22, 0.18])]
    runs += [run("fedntd", s, 0.8, 0.8, forgetting=f) for s, f in enumerate([0.15, 0.18, 0.19])]
    write_per_seed(tmp_path, "t", runs)
    row = claims.claim_row(claim("f", "FedNTD", 20.0, 13.0, metric="forgetting"), tmp_path)  # F x 100
    assert row["paper_gain"] == pytest.approx(-7.0) and row["fl_gain_mean"] == pytest.approx(-2.67, abs=0.01)
    assert row["fl_fedavg"] == "20.00 ± 2.00" and row["wins"] == "2/3"  # seed 2 forgot more
    assert row["verdict"] == "direction only"
    runs[-1]["forgetting"] = 0.15
    write_per_seed(tmp_path / "again", "t", runs)
    row = claims.claim_row(claim("f", "FedNTD", 20.0, 13.0, metric="forgetting"), tmp_path / "again")
    assert (row["wins"], row["verdict"]) == ("3/3", "reproduced")  # mean -4: at least half the paper's -7


def test_a_lower_is_better_claim_without_paper_numbers_is_won_by_less(tmp_path: Path) -> None:
    runs = [run("fedavg", s, 0.8, 0.8, forgetting=0.2) for s in range(2)]
    runs += [run("less", s, 0.8, 0.8, forgetting=0.1) for s in range(2)]
    runs += [run("more", s, 0.8, 0.8, forgetting=0.3) for s in range(2)]
    write_per_seed(tmp_path, "t", runs)
    no_numbers = {"fedavg": None, "method_value": None}
    less = claims.claim_row({**claim("l", "Less", 0, 0, metric="forgetting"), **no_numbers}, tmp_path)
    more = claims.claim_row({**claim("m", "More", 0, 0, metric="forgetting"), **no_numbers}, tmp_path)
    assert (less["verdict"], less["wins"]) == ("reproduced", "2/2")
    assert (more["verdict"], more["wins"]) == ("not reproduced", "0/2")


def test_completed_runs_without_the_value_say_what_to_change(tmp_path: Path) -> None:
    runs = [run("fedavg", 0, 0.8, 0.8), run("fedcad", 0, 0.81, 0.8)]  # no local_acc_last10: eval_local was off
    write_per_seed(tmp_path, "t", runs)
    row = claims.claim_row(claim("c", "FedCAD", 1.0, 2.0, metric="local_acc_last10"), tmp_path)
    assert row["verdict"] == "not run" and "eval_local" in row["reason"] and "paper_tables" not in row["reason"]
    row = claims.claim_row(claim("d", "FedCAD", 1.0, 0.5, metric="mean_drop"), tmp_path)
    assert "two evaluated rounds" in row["reason"] and "eval_local" not in row["reason"]
    path = tmp_path / "claims.yaml"
    bad = {**claim("f", "FedNTD", 20.0, 13.0, metric="forgetting"), "paper_failed": True}
    path.write_text(yaml.safe_dump({"claims": [bad]}))
    with pytest.raises(ValueError, match="paper_failed needs an accuracy metric"):
        claims.load_claims(path)


def test_a_claim_not_run_yet_says_why_and_how(tmp_path: Path) -> None:
    write_per_seed(tmp_path, "t", [run("fedavg", 0, 0.8, 0.8)])
    plain = claims.claim_row(claim("p", "FedSSD", 1.0, 2.0, metric="final_acc"), tmp_path)
    assert plain["verdict"] == "not run" and plain["reason"].startswith("no finished pair yet; `bash scripts/")
    why = {**claim("w", "FedSSD", 1.0, 2.0, metric="final_acc"), "not_run": "nine runs of 2-3 h each on this CPU"}
    row = claims.claim_row(why, tmp_path)
    assert row["verdict"] == "not run" and row["reason"].startswith("nine runs of 2-3 h each on this CPU; `bash ")
    assert "results/t/" in row["reason"]


def test_the_claims_plot_shows_each_measured_claim_beside_the_papers_gain(
    results: Path, tmp_path: Path, figures: list
) -> None:
    rows = [
        claims.claim_row(c, results)
        for c in [
            claim("good", "Good", 80.0, 83.0, metric="final_acc"),
            claim("lucky", "Lucky", 80.0, 82.0, metric="final_acc"),
            claim("r", "Good", 100, 40, metric="speedup_final_target"),  # a speedup: another unit, left out
            claim("pending", "Other", 80.0, 82.0, metric="final_acc"),  # not measured: left out
        ]
    ]
    assert claims.plot_claims(rows, tmp_path / "claims.png").stat().st_size > 0
    ax = figures[0].axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["good (3 seeds)", "lucky (3 seeds)"]
    papers = [line for line in ax.lines if line.get_marker() == "x"]
    assert [float(line.get_xdata()[0]) for line in papers] == pytest.approx([3.0, 2.0])
    assert claims.plot_claims(rows[2:], tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()
    assert claims.plot_claims(rows[2:], tmp_path / "claims.png") is None
    assert not (tmp_path / "claims.png").exists()  # the older figure is gone with the claims it showed


def test_a_run_the_report_left_unpaired_is_not_counted(tmp_path: Path) -> None:
    """A completed run with no delta (its rounds differed from FedAvg's) neither wins nor misses a speedup."""
    rows = [run("fedavg", 0, 0.5, 0.5, speedup_final_target=1.0), run("fedntd", 0, 0.7, 0.5)]
    rows[1]["delta_final_acc"] = ""  # the report did not pair it
    write_per_seed(tmp_path, "t", rows)
    for metric in ("final_acc", "speedup_final_target"):
        fl = claims.measured(
            claims.read_per_seed(tmp_path, "t"), {"setting": "s", "method": "fedntd", "metric": metric}
        )
        assert fl["gains"] == [] and fl["pairs"] == 0 and fl["missed_target"] == 0, metric


def test_a_results_folder_that_is_missing_or_holds_no_report_is_refused(
    tmp_path: Path, results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`claims --results <typo>` rewrote every claim as "not run", deleted claims.png and exited 0."""
    from fl_lightning.cli import main as cli

    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": [claim("good", "Good", 80.0, 83.0, metric="final_acc")]}))
    readme = tmp_path / "README.md"
    readme.write_text("no sections\n")
    args = ["--claims", str(path), "--readme", str(readme)]
    assert claims.main([*args, "--results", str(results)]) == 0
    before = (tmp_path / "claims.md").read_bytes()
    (tmp_path / "empty").mkdir()
    for where, error in [("nope", "no results folder"), ("empty", "holds no comparison's report/per_seed.csv")]:
        with pytest.raises(SystemExit) as exit_:
            cli(["claims", *args, "--results", str(tmp_path / where)])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and error in err and "\n" not in err
    assert (tmp_path / "claims.md").read_bytes() == before

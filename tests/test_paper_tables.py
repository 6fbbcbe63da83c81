"""``scripts/paper_tables.sh``: a fresh clone reuses the runs archived under ``results/``; ``--carry`` keeps unfinished
runs (with their checkpoints) under ``results/unfinished/`` and drops them once they finish."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run_dir(path: Path, status: str, checkpoint: bool = False) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("seed_everything: 0\n")
    (path / "summary.json").write_text(json.dumps({"status": status}))
    (path / "metrics.csv").write_text("round,global_acc\n1,0.5\n")
    (path / ".lock").write_text("")
    (path / "partition.png").write_bytes(b"")
    if checkpoint:
        (path / "checkpoints").mkdir()
        (path / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    return path


def _tables(repo: Path, *args: str, **env: str) -> str:
    # PY=true: the report and claims commands become no-ops; only the script's own file handling runs.
    proc = subprocess.run(
        ["bash", "scripts/paper_tables.sh", "--archive-only", *args, "tiny"],
        cwd=repo,
        env={"PATH": "/usr/bin:/bin", "PY": "true", **env},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    for script in ("paper_tables.sh", "archive_results.sh"):
        shutil.copy(ROOT / "scripts" / script, tmp_path / "scripts" / script)
    (tmp_path / "configs" / "compare").mkdir(parents=True)
    (tmp_path / "configs" / "compare" / "tiny.yaml").write_text("name: tiny\n")
    return tmp_path


def files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_a_fresh_clone_reuses_archived_runs_and_never_replaces_a_run(repo: Path) -> None:
    _run_dir(repo / "results/tiny/s/fedavg/seed0", "completed")
    _run_dir(repo / "results/tiny/s/fedavg/seed1", "completed")
    existing = _run_dir(repo / "runs/compare/tiny/s/fedavg/seed1", "interrupted", checkpoint=True)
    out = _tables(repo)
    assert "1 runs copied from results/ into runs/compare/tiny" in out
    assert json.loads((repo / "runs/compare/tiny/s/fedavg/seed0/summary.json").read_text())["status"] == "completed"
    assert json.loads((existing / "summary.json").read_text())["status"] == "interrupted"  # left as it was
    assert not (repo / "results/unfinished").exists()  # kept only with --carry


def test_carry_keeps_unfinished_runs_until_they_finish(repo: Path) -> None:
    run = _run_dir(repo / "runs/compare/tiny/s/fedssd/seed0", "interrupted", checkpoint=True)
    _run_dir(repo / "runs/compare/tiny/s/fedavg/seed0", "completed")
    out = _tables(repo, "--carry")
    kept = repo / "results/unfinished/tiny"
    assert "s/fedssd/seed0: unfinished, kept in results/unfinished/tiny/s/fedssd/seed0" in out
    assert files(kept) == [
        "s/fedssd/seed0/checkpoints/last.ckpt",
        "s/fedssd/seed0/config.yaml",
        "s/fedssd/seed0/metrics.csv",
        "s/fedssd/seed0/summary.json",
    ]
    assert files(repo / "results/tiny") == [
        "s/fedavg/seed0/config.yaml",
        "s/fedavg/seed0/metrics.csv",
        "s/fedavg/seed0/summary.json",
    ]

    shutil.rmtree(repo / "runs")  # the next clone: the unfinished run comes back, checkpoint and all
    _tables(repo)
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == b"weights"

    (run / "summary.json").write_text(json.dumps({"status": "completed"}))  # it resumed and finished
    _tables(repo, "--carry")
    assert files(kept) == []
    assert "s/fedssd/seed0/summary.json" in files(repo / "results/tiny")


def test_carry_leaves_out_a_run_over_the_size_limit(repo: Path) -> None:
    run = _run_dir(repo / "runs/compare/tiny/s/fedcurv/seed0", "interrupted", checkpoint=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"\0" * (2 << 20))
    out = _tables(repo, "--carry", CARRY_MAX_MB="1")
    # Before: the line did not say that such a run is lost with the machine, nor which limit keeps it.
    line = next(x for x in out.splitlines() if "s/fedcurv/seed0" in x)
    assert "NOT carried" in line and "over CARRY_MAX_MB=1" in line and "only runs/ on this machine holds it" in line
    assert not (repo / "results/unfinished/tiny/s/fedcurv").exists()

    suggested = re.search(r"CARRY_MAX_MB=(\d+) keeps it", line)
    assert suggested is not None
    _tables(repo, "--carry", CARRY_MAX_MB=suggested.group(1))  # the limit the line names does carry it
    assert (repo / "results/unfinished/tiny/s/fedcurv/seed0/checkpoints/last.ckpt").stat().st_size == 2 << 20


def test_unknown_option_fails_with_one_line(repo: Path) -> None:
    proc = subprocess.run(
        ["bash", "scripts/paper_tables.sh", "--carr"], cwd=repo, capture_output=True, text=True, env={"PY": "true"}
    )
    assert proc.returncode == 2
    assert proc.stdout.strip() == "unknown option --carr; use --archive-only or --carry"


def test_a_run_that_compare_moved_aside_is_not_archived(repo: Path) -> None:
    _run_dir(repo / "runs/compare/tiny/s/scaffold/seed0", "diverged")
    _run_dir(repo / "runs/compare/tiny/s/scaffold/seed0.replaced-20261127-015556", "diverged")
    _tables(repo)
    archived = files(repo / "results/tiny")
    assert "s/scaffold/seed0/summary.json" in archived
    assert not [p for p in archived if ".replaced-" in p]


def test_a_carry_limit_that_is_not_a_number_fails_with_one_line(repo: Path) -> None:
    proc = subprocess.run(
        ["bash", "scripts/paper_tables.sh", "--carry"],
        cwd=repo,
        capture_output=True,
        text=True,
        env={"PY": "true", "CARRY_MAX_MB": "16MB"},
    )
    assert proc.returncode == 2
    assert proc.stdout.strip() == "CARRY_MAX_MB must be a whole number of MB, not '16MB'"

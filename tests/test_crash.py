"""A run killed with SIGKILL (no handler runs) resumes to the same results and leaves no truncated file behind."""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
TIMING = {"round_seconds", "elapsed_seconds"}


def fit(run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "cli.py",
        "fit",
        "--config",
        "configs/quickstart.yaml",
        "--data.num_clients",
        "4",
        "--federation.local_epochs",
        "2",
        "--federation.rounds",
        "4",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.default_root_dir",
        str(run_dir),
        *extra,
    ]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv") as f:
        return [{k: v for k, v in row.items() if k not in TIMING} for row in csv.DictReader(f)]


def assert_no_truncated_file(run_dir: Path) -> None:
    """Every results file parses whole: JSON, YAML, and a CSV whose rows all have the header's columns."""
    if (run_dir / "summary.json").exists():
        json.loads((run_dir / "summary.json").read_text())
    if (run_dir / "config.yaml").exists():
        assert isinstance(yaml.safe_load((run_dir / "config.yaml").read_text()), dict)
    for name in ("metrics.csv", "partition.csv"):
        if (run_dir / name).exists():
            lines = (run_dir / name).read_text().splitlines()
            assert lines, f"{name} is empty"
            width = len(lines[0].split(","))
            assert all(len(line.split(",")) == width for line in lines), f"{name} has a cut row"
    for png in run_dir.glob("[!.]*.png"):  # hidden .tmp files are the writes a kill interrupted, never read
        assert png.read_bytes().endswith(b"IEND\xaeB`\x82"), f"{png.name} is cut"


def temporaries(run_dir: Path) -> list[Path]:
    return [p for d in (run_dir, run_dir / "checkpoints") for p in d.glob(".*.tmp*")]


def kill_after(cmd: list[str], ready, delay: float = 0.0) -> bool:
    """Start ``cmd``, wait until ``ready()`` and ``delay`` more seconds, SIGKILL it; False if it ended first."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not ready() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(delay)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return alive


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("full") / "run"
    subprocess.run(fit(run_dir), cwd=ROOT, env=ENV, check=True, capture_output=True)
    return run_dir


@pytest.fixture(scope="module")
def reference(reference_run: Path) -> list[dict[str, str]]:
    return rows(reference_run)


def _rounds_done(run_dir: Path) -> int:
    try:
        return len((run_dir / "metrics.csv").read_text().splitlines()) - 1
    except OSError:
        return 0


@pytest.mark.slow
def test_sigkill_between_rounds_then_resume_is_identical(tmp_path, reference):
    run_dir = tmp_path / "cut"
    assert kill_after(fit(run_dir), lambda: _rounds_done(run_dir) >= 2), "the run finished before the kill"
    assert_no_truncated_file(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "running"  # nothing ran at SIGKILL; compare/report call this a stale running
    done = subprocess.run(fit(run_dir, "--ckpt_path", "last"), cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert rows(run_dir) == reference
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_sigkill_at_random_points_leaves_no_truncated_file(tmp_path, reference_run, reference):
    # The reference run's time from its first file to its last sets the scale, so that the kills fall inside the run
    # (one in each half) on a fast machine as on a loaded one.
    span = (reference_run / "summary.json").stat().st_mtime - (reference_run / "partition.csv").stat().st_mtime
    rng = random.Random(0)
    for trial, (low, high) in enumerate([(0.0, 0.5), (0.5, 1.0)]):
        run_dir = tmp_path / f"cut{trial}"
        delay = span * rng.uniform(low, high)
        kill_after(fit(run_dir), lambda d=run_dir: (d / "partition.csv").exists(), delay=delay)
        assert_no_truncated_file(run_dir)
        if json.loads((run_dir / "summary.json").read_text())["status"] != "completed":  # else it ended before the kill
            resume = fit(run_dir, "--ckpt_path", "last")
            done = subprocess.run(resume, cwd=ROOT, env=ENV, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr[-2000:]
        assert rows(run_dir) == reference
        assert not temporaries(run_dir), "the resumed run left a killed write's temporary file"

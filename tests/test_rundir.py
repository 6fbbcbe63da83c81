"""Run directories: a finished run is never modified by a later command unless asked; resumes check first.

Each test of a refusal reproduces a way results used to be destroyed or mixed, and checks that the run's files are
byte-identical afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import read_metrics, read_summary

from fl_lightning.cli import cli_main, resolve_config, run
from fl_lightning.core.rundir import RunDirError, check_run_dir, checkpoint_diff, run_status, science_diff
from fl_lightning.experiments.compare import Run

ROOT = Path(__file__).resolve().parent.parent
TINY = [
    "--config",
    str(ROOT / "configs/quickstart.yaml"),
    "--data.num_clients",
    "3",
    "--federation.local_epochs",
    "1",
    "--trainer.enable_progress_bar",
    "false",
    "--federation.plots",
    "false",
]


def fit_args(run_dir: Path, *extra: str, rounds: int = 2) -> list[str]:
    return ["fit", *TINY, "--federation.rounds", str(rounds), "--trainer.default_root_dir", str(run_dir), *extra]


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file under a run directory (symlinks by target), as bytes."""
    out = {}
    for path in sorted(run_dir.rglob("*")):
        if path.is_symlink():
            out[str(path.relative_to(run_dir))] = os.readlink(path).encode()
        elif path.is_file():
            out[str(path.relative_to(run_dir))] = path.read_bytes()
    return out


@pytest.fixture(scope="module")
def completed(tmp_path_factory) -> Path:
    """A completed 2-round run, made once; tests that change it work on a copy."""
    run_dir = tmp_path_factory.mktemp("completed") / "run"
    cli_main(fit_args(run_dir))
    assert read_summary(run_dir)["status"] == "completed"
    return run_dir


@pytest.fixture
def done(completed, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(completed, copy, symlinks=True)
    # the copied config still names the original directory; a fit into the copy passes its own
    return copy


def refused(args: list[str], match: str, overwrite: bool = False) -> None:
    with pytest.raises(RunDirError, match=match):
        cli_main(args, overwrite=overwrite)


class TestRefusedResumeLeavesCompletedRunUntouched:
    """Before: a rejected resume rewrote a completed run's summary to interrupted / rounds_done 0."""

    def test_other_seed(self, done):
        before = snapshot(done)
        refused(fit_args(done, "--ckpt_path", "last", "--seed_everything", "1", rounds=3), r"seed_everything: 0 -> 1")
        assert snapshot(done) == before
        assert Run("s", "fedavg", 0, Path("x"), done).state() == "done"  # compare still sees it finished

    def test_corrupt_checkpoint(self, done):
        ckpt = done / "checkpoints" / "last.ckpt"
        ckpt.write_bytes(ckpt.read_bytes()[:1000])
        before = snapshot(done)
        refused(fit_args(done, "--ckpt_path", "last", rounds=3), r"last.ckpt cannot be loaded .*damaged")
        assert snapshot(done) == before

    def test_other_network(self, done):
        before = snapshot(done)
        refused(fit_args(done, "--ckpt_path", "last", "--model.init_args.net", "cnn", rounds=3), r"net: lenet -> cnn")
        assert snapshot(done) == before

    def test_same_config_nothing_to_resume(self, done):
        before = snapshot(done)
        refused(fit_args(done, "--ckpt_path", "last"), r"completed run of 2 rounds; there is nothing to resume")
        assert snapshot(done) == before


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (["--data.num_clients", "4"], "data.num_clients: 3 -> 4"),
        (["--model", "fl_lightning.methods.FedNTD"], "model.class_path"),
        (["--data.alpha", "0.1"], "data.alpha: 0.5 -> 0.1"),
        (["--federation.local_epochs", "2"], "federation.local_epochs: 1 -> 2"),
        (["--federation.lr_decay", "0.9"], "federation.lr_decay"),
        (["--model.init_args.lr", "0.01"], "model.init_args.lr: 0.05 -> 0.01"),
        (["--data.partition", "iid"], "data.partition: dirichlet -> iid"),
        (["--trainer.precision", "bf16-mixed"], "trainer.precision: 32-true -> bf16-mixed"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_resume_with_changed_science_is_refused(done, change, key):
    """Before: resuming with another num_clients/method/partition/E finished as `completed` with two runs mixed."""
    before = snapshot(done)
    refused(fit_args(done, "--ckpt_path", "last", *change, rounds=3), key)
    assert snapshot(done) == before


def test_resume_may_grow_rounds_and_change_free_keys(done):
    cli_main(
        fit_args(done, "--ckpt_path", "last", "--data.eval_batch_size", "100", "--federation.plots", "true", rounds=3)
    )
    rows = read_metrics(done)
    assert [r["round"] for r in rows] == ["1", "2", "3"]
    assert read_summary(done)["status"] == "completed"


def test_fewer_rounds_than_done_is_refused(done):
    refused(fit_args(done, "--ckpt_path", "last", rounds=1), r"federation.rounds: 2 -> 1")


class TestFitIntoFinishedRun:
    """Before: fit into a completed run's directory overwrote its results and piled up last-v1.ckpt."""

    def test_refused_without_overwrite(self, done):
        before = snapshot(done)
        refused(fit_args(done), r"already holds a completed run; pass --overwrite")
        assert snapshot(done) == before

    def test_overwrite_moves_the_old_run_aside(self, done):
        before = snapshot(done)
        cli_main(fit_args(done, "--seed_everything", "1"), overwrite=True)
        aside = [p for p in done.parent.iterdir() if p.name.startswith("run.replaced-")]
        assert len(aside) == 1 and snapshot(aside[0]) == before
        assert sorted(p.name for p in (done / "checkpoints").iterdir()) == ["last.ckpt"]  # no last-v1.ckpt
        assert read_summary(done)["seed"] == 1

    def test_overwrite_and_resume_together_refused(self, done):
        refused(fit_args(done, "--ckpt_path", "last"), r"only one of them", overwrite=True)


def test_missing_ckpt_file_is_one_line(tmp_path):
    refused(fit_args(tmp_path / "r", "--ckpt_path", str(tmp_path / "nope.ckpt")), r"nope.ckpt: no such file")
    assert not (tmp_path / "r").exists()


def test_ckpt_last_in_an_empty_directory_starts_fresh(tmp_path, capsys):
    cli_main(fit_args(tmp_path / "r", "--ckpt_path", "last", rounds=1))
    assert read_summary(tmp_path / "r")["status"] == "completed"
    assert "starting a new run" in capsys.readouterr().err


def test_ckpt_last_without_checkpoint_but_results_is_refused(done):
    shutil.rmtree(done / "checkpoints")
    refused(fit_args(done, "--ckpt_path", "last", rounds=3), r"holds results but no checkpoints/last.ckpt")


def test_exit_code_of_refusal_is_2(done, capsys):
    assert run(fit_args(done, "--ckpt_path", "last", "--seed_everything", "5", rounds=3)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: cannot resume") and "Traceback" not in "".join(err)


class TestPureChecks:
    def test_science_diff_ignores_free_keys_and_allows_growth(self):
        saved = {
            "trainer": {"logger": False, "default_root_dir": "a", "precision": "32-true"},
            "federation": {"rounds": 2},
        }
        new = {  # storage and the collapse stop are free too: configs older than them resume and are reused
            "trainer": {"logger": True, "default_root_dir": "b", "precision": "32-true"},
            "federation": {"rounds": 5, "client_state_mb": 100.0, "collapse_rounds": 10},
        }
        assert science_diff(saved, new) == []
        assert science_diff(saved, new, allow_growth=False) == ["federation.rounds: 2 -> 5"]

    def test_science_diff_reads_two_paths_of_one_class_as_one_model(self):
        # `--model fedavg` resolves to fl_lightning.module.FedAvg, a shipped config says fl_lightning.FedAvg.
        saved = {"model": {"class_path": "fl_lightning.FedAvg"}}
        assert science_diff(saved, {"model": {"class_path": "fl_lightning.module.FedAvg"}}) == []
        assert science_diff(saved, {"model": {"class_path": "fl_lightning.methods.FedNTD"}}) == [
            "model.class_path: fl_lightning.FedAvg -> fl_lightning.methods.FedNTD"
        ]
        assert science_diff(saved, {"model": {"class_path": "nowhere.FedAvg"}}) == [
            "model.class_path: fl_lightning.FedAvg -> nowhere.FedAvg"
        ]
        ckpt = {"hyper_parameters": {"_class_path": "fl_lightning.FedAvg"}}
        assert checkpoint_diff(ckpt, {"model": {"class_path": "fl_lightning.module.FedAvg"}}) == []
        assert checkpoint_diff(ckpt, {"model": {"class_path": "fl_lightning.FedNTD"}}) == [
            "model.class_path: fl_lightning.FedAvg -> fl_lightning.FedNTD"
        ]

    def test_live_running_run_is_refused(self, tmp_path):
        (tmp_path / "summary.json").write_text(json.dumps({"status": "running", "pid": os.getpid()}))
        with pytest.raises(RunDirError, match="being written by a running fit"):
            check_run_dir(tmp_path, {}, resume=False, overwrite=True)

    def test_stale_running_is_reported(self, tmp_path):
        summary = {"status": "running", "pid": 2**22 + 12345}
        assert run_status(summary) == "stale running"
        (tmp_path / "summary.json").write_text(json.dumps(summary))
        with pytest.raises(RunDirError, match="holds a stale running run; resume it with --ckpt_path last"):
            check_run_dir(tmp_path, {}, resume=False, overwrite=False)

    def test_resolve_config_builds_nothing(self, tmp_path):
        config = resolve_config(fit_args(tmp_path / "r"))
        assert config["data"]["num_clients"] == 3 and config["trainer"]["precision"]
        assert not (tmp_path / "r").exists()


def test_overwrite_twice_within_a_second_moves_each_old_run_to_its_own_folder(tmp_path, monkeypatch):
    # Before: the second --overwrite in the same second failed with "OSError: [Errno 39] Directory not empty".
    import fl_lightning.core.run_lock as run_lock

    monkeypatch.setattr(run_lock.time, "strftime", lambda fmt: "20261204-010203")
    run_dir = tmp_path / "run"
    (tmp_path / "run.replaced-20261204-010203").mkdir()
    assert run_lock.free_aside(run_dir).name == "run.replaced-20261204-010203-2"
    (tmp_path / "run.replaced-20261204-010203-2").mkdir()
    assert run_lock.free_aside(run_dir).name == "run.replaced-20261204-010203-3"

"""The Python API at its edges (issue 47): it refuses what the command line refuses, and a run whose directory is
removed, or whose finished record lost a file, gets the documented answer.

Each test names what a user got before.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from helpers import bare_trainer, quickstart_fit_args, read_summary, tiny_run

from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.cli import EXIT_CODES, run
from fl_lightning.core.rundir import RunDirError, RunDirLost


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file under ``run_dir`` with its bytes."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def fit(
    run_dir: Path,
    rounds: int = 3,
    ckpt_path: str | None = None,
    lr: float = 0.05,
    data: dict[str, Any] | None = None,
    fed: dict[str, Any] | None = None,
    callbacks: tuple[L.Callback, ...] = (),
) -> tuple[L.Trainer, Federation]:
    """A small digits federation written as a user would (10 clients, lr 0.05), into ``run_dir``."""
    L.seed_everything(0, verbose=False)
    dm = FederatedDataModule("digits", **{"num_clients": 10, "partition": "dirichlet", "alpha": 1.0, **(data or {})})
    model = FedAvg(net="lenet", num_classes=dm.num_classes, in_channels=dm.in_channels, image_size=dm.image_size, lr=lr)
    federation = Federation(rounds=rounds, **{"local_epochs": 1, "sample_ratio": 0.3, **(fed or {})})
    trainer = bare_trainer(run_dir, federation, *callbacks, max_epochs=rounds, enable_checkpointing=True)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return trainer, federation


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A completed 3-round run made through the Python API, once; tests work on a copy."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    fit(run_dir)
    assert read_summary(run_dir)["status"] == "completed"
    return run_dir


@pytest.fixture
def done(finished, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy, symlinks=True)
    return copy


# ---- 1. a resume from Python with other settings is refused, as the command line refuses it --------------------------


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"data": {"num_clients": 5}}, "data.num_clients: 10 -> 5"),
        ({"lr": 0.2}, "model.init_args.lr: 0.05 -> 0.2"),
        ({"fed": {"local_epochs": 2}}, "federation.local_epochs: 1 -> 2"),
        ({"fed": {"sample_ratio": 0.5}}, "federation.sample_ratio: 0.3 -> 0.5"),
        ({"fed": {"server_lr": 0.5}}, "federation.server_step: ServerSGD(lr=1.0, momentum=0.0) -> ServerSGD(lr=0.5,"),
        ({"rounds": 2}, "federation.rounds: 3 -> 2"),
    ],
    ids=["num_clients", "lr", "local_epochs", "sample_ratio", "server_lr", "fewer rounds"],
)
def test_a_python_resume_with_other_settings_is_refused_naming_the_key(done, change, key):
    # Before: rounds 4-5 trained with 5 clients after rounds 1-3 with 10 (or with another lr), and summary.json said 5.
    before = snapshot(done)
    with pytest.raises(RunDirError, match=re.escape(key)) as refused:
        fit(done, **{"rounds": 5, "ckpt_path": "last", **change})
    line = str(refused.value)
    assert line.startswith("cannot resume: ") and "\n" not in line
    assert snapshot(done) == before  # the finished run is untouched: not one byte written


def test_a_python_resume_with_the_same_settings_extends_the_run(done):
    # The check compares the live objects' settings with the checkpoint's: the same ones pass, and rounds may grow.
    _, federation = fit(done, rounds=4, ckpt_path="last")
    assert [int(row["round"]) for row in federation.history] == [1, 2, 3, 4]
    assert read_summary(done)["status"] == "completed" and read_summary(done)["num_clients"] == 10


# ---- 2. a second fit on one Trainer is refused -------------------------------------------------------------------


def test_a_second_fit_on_the_same_trainer_is_refused_before_anything_is_written(tmp_path):
    # Before: the second fit returned at once, nothing trained or written, no message; the new model stayed untrained.
    trainer, fed, _ = tiny_run(tmp_path, rounds=2)
    before = snapshot(tmp_path)
    dm = trainer.datamodule
    model = FedAvg(net="lenet", num_classes=dm.num_classes, in_channels=dm.in_channels, image_size=dm.image_size)
    line = r"^this Trainer already ran a federation \(2 of 2 rounds\); create a new Trainer for another fit"
    with pytest.raises(ValueError, match=line) as refused:
        trainer.fit(model, datamodule=dm)
    assert "\n" not in str(refused.value)
    assert snapshot(tmp_path) == before
    assert fed.status == "completed" and len(fed.history) == 2  # the first fit's record stands


# ---- 5. the run directory removed during the run ------------------------------------------------------------------


class RemoveRunDir(L.Callback):
    """Removes the run directory in round ``round`` (1-based): as it starts, or after the round is recorded."""

    def __init__(self, round: int, when: str) -> None:
        self.round, self.when = round, when

    def _remove(self, trainer: L.Trainer, when: str) -> None:
        if when == self.when and trainer.current_epoch + 1 == self.round:
            shutil.rmtree(trainer.default_root_dir)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._remove(trainer, "start")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after the Federation callback recorded the round, before the checkpoint (checkpoints save last)
        self._remove(trainer, "recorded")


@pytest.mark.parametrize(
    ("round_", "when"), [(2, "start"), (3, "recorded")], ids=["mid-run", "last round, racing the checkpoint"]
)
def test_a_run_directory_removed_during_the_run_ends_it_and_is_not_recreated(tmp_path, round_, when):
    # Before: FileNotFoundError; or, racing the writer, the run recreated the directory and ended `completed`,
    # without config.yaml or the partition files.
    run_dir = tmp_path / "run"
    message = f"the run directory {run_dir} was removed during the run; the run is lost"
    with pytest.raises(RunDirLost, match=re.escape(message)):
        fit(run_dir, callbacks=(RemoveRunDir(round_, when),))
    assert not run_dir.exists()


def test_the_command_line_says_a_removed_run_directory_lost_the_run_with_exit_1(tmp_path, monkeypatch, capsys):
    # Before: "run failed: FileNotFoundError..." and exit 2, the code for "nothing was run".
    run_dir = tmp_path / "run"
    record = Federation.on_train_epoch_end

    def record_then_remove(self, trainer, pl_module):
        record(self, trainer, pl_module)
        if trainer.current_epoch == 0:
            shutil.rmtree(run_dir)

    monkeypatch.setattr(Federation, "on_train_epoch_end", record_then_remove)
    assert run(quickstart_fit_args(run_dir, rounds=2)) == EXIT_CODES["failed"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"error: RunDirLost: the run directory {run_dir} was removed during the run; the run is lost"
    assert not any("run failed" in line for line in err)
    assert not run_dir.exists()


# ---- 6. a completed run with a file missing is finished by the resume ----------------------------------------------


@pytest.fixture(scope="module")
def cli_finished(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("cli_finished") / "run"
    assert run(quickstart_fit_args(run_dir, rounds=1, plots=True)) == 0
    return run_dir


@pytest.mark.parametrize("missing", ["config.yaml", "partition.csv", "partition.png"])
def test_a_completed_run_missing_a_file_is_finished_by_the_resume(cli_finished, tmp_path, missing):
    # Before: exit 2, "holds a completed run ... nothing to resume", the file left missing.
    run_dir = tmp_path / "run"
    shutil.copytree(cli_finished, run_dir, symlinks=True)
    weights = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    (run_dir / missing).unlink()
    assert run(quickstart_fit_args(run_dir, "--ckpt_path", "last", rounds=1, plots=True)) == 0
    assert (run_dir / missing).is_file() and read_summary(run_dir)["status"] == "completed"
    after = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert all(torch.equal(weights[k], after[k]) for k in weights)  # nothing trained again

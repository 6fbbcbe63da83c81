"""What a user who follows the docs literally ran into: each test names the command and what it got before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import bare_trainer, quickstart_fit_args, read_summary

from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.cli import run
from fl_lightning.core.datasets import DATASETS


def test_a_ckpt_path_before_the_runs_own_config_still_resumes(tmp_path):
    """``fit --ckpt_path last --config <run dir>/config.yaml``: the saved ``ckpt_path: null`` undid the flag.

    The fit then refused the run as finished ("pass --overwrite to replace it", which for an interrupted run would have
    moved its checkpoint aside), and ``test --ckpt_path <file> --config <run dir>/config.yaml`` asked for a
    ``--ckpt_path``.
    """
    run_dir = tmp_path / "run"
    assert run(quickstart_fit_args(run_dir, rounds=1)) == 0
    saved = run_dir / "config.yaml"
    assert "ckpt_path" not in yaml.safe_load(saved.read_text())
    assert run(["fit", "--ckpt_path", "last", "--config", str(saved), "--federation.rounds", "2"]) == 0
    assert read_summary(run_dir)["rounds_done"] == 2
    checkpoint = str(run_dir / "checkpoints" / "last.ckpt")
    quiet = ["--trainer.enable_progress_bar", "false"]
    assert run(["test", "--ckpt_path", checkpoint, "--config", str(saved), *quiet]) == 0


class _RecordsLogs(FedAvg):
    """FedAvg that keeps the arguments of each ``self.log``."""

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        self.__dict__.setdefault("logged", {})[name] = kwargs
        super().log(name, value, *args, **kwargs)


def test_the_methods_validation_keys_draw_no_sync_dist_advice(tmp_path):
    """Several processes (``--trainer.devices 2 --trainer.strategy ddp`` with a holdout): two warnings advised
    ``self.log('val/loss', ..., sync_dist=True)`` for keys fl_lightning had already summed over the processes.

    Lightning gives that advice for an epoch-level key logged without ``sync_dist`` while a process group is up; the
    keys are logged synced (the max over processes that hold the same value: the value itself).
    """
    dm = FederatedDataModule("digits", num_clients=2, batch_size=32, holdout_per_class=2)
    model = _RecordsLogs(lr=0.05)
    bare_trainer(tmp_path, Federation(rounds=1, local_epochs=1, plots=False)).fit(model, datamodule=dm)
    for key in ("val/loss", "val/acc"):
        assert model.logged[key].get("sync_dist") is True and model.logged[key].get("reduce_fx") == "max", key


def test_cinic10s_missing_data_line_asks_only_for_what_is_read(tmp_path):
    """data.md says ``valid/`` is not read; the line for a missing CINIC-10 still listed ``valid/<class>/*.png``."""
    with pytest.raises(FileNotFoundError) as err:
        DATASETS["cinic10"].loader(Path(tmp_path), False)
    assert "train/<class>/*.png" in str(err.value) and "valid/<class>" not in str(err.value)

"""The progress bar speaks in rounds and clients, not Lightning's epochs and it/s."""

from __future__ import annotations

import lightning as L

from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.progress import RoundProgressBar


def _fit(tmp_path, bar: RoundProgressBar, **federation) -> None:
    dm = FederatedDataModule("digits", num_clients=3, partition="iid", batch_size=64)
    model = FedAvg(net="lenet", num_classes=10, in_channels=1, image_size=8, lr=0.05)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=2,
        callbacks=[Federation(rounds=2, plots=False, **federation), bar],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(model, datamodule=dm)


def test_bar_shows_round_and_client(tmp_path, capsys):
    _fit(tmp_path, RoundProgressBar(terminal_only=False))
    out = capsys.readouterr().out
    assert "round 1/2" in out and "round 2/2" in out and "client 3/3" in out
    assert "Epoch" not in out and "it/s" not in out
    assert "round 1 acc=" in out and "%" in out  # round 2's bar says whose accuracy it shows


def test_bar_counts_clients_of_the_batched_engine(tmp_path, capsys):
    _fit(tmp_path, RoundProgressBar(terminal_only=False), engine="batched", group_size=2)
    out = capsys.readouterr().out
    assert "client 2/3" in out and "client 3/3" in out  # groups of 2 and 1: the bar counts clients, not groups
    assert "client 1/3" not in out and "client 4/3" not in out


def test_no_bar_when_stdout_is_not_a_terminal(tmp_path, capsys):
    _fit(tmp_path, RoundProgressBar())  # pytest's captured stdout is no terminal
    out = capsys.readouterr().out
    assert "client " not in out and "\r" not in out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("round ")] == ["1/2", "2/2"]
    assert out.splitlines()[-1].startswith("done: final acc")

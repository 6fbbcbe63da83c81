"""The progress bar speaks in rounds and clients, not Lightning's epochs and it/s."""

from __future__ import annotations

import lightning as L

from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.progress import RoundProgressBar


def test_bar_shows_round_and_client(tmp_path, capsys):
    dm = FederatedDataModule("digits", num_clients=3, partition="iid", batch_size=64)
    model = FedAvg(net="lenet", num_classes=10, in_channels=1, image_size=8, lr=0.05)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=2,
        callbacks=[Federation(rounds=2, plots=False), RoundProgressBar()],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(model, datamodule=dm)
    out = capsys.readouterr().out
    assert "round 1/2" in out and "round 2/2" in out and "client 3/3" in out
    assert "Epoch" not in out and "it/s" not in out
    assert "acc=" in out and "%" in out

"""The Fashion-MNIST FedNTD-paper setting the diagnostics in ``bench/`` share (run them as ``python bench/<x>.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L

from fl_lightning import FederatedDataModule


def bare_trainer(root: str | Path, *callbacks: L.Callback, **overrides: Any) -> L.Trainer:
    """A CPU Trainer for a measurement: no logger, checkpoint, progress bar or model summary."""
    kwargs: dict[str, Any] = {
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": str(root),
    }
    return L.Trainer(callbacks=list(callbacks), **{**kwargs, **overrides})


def fmnist_ntd_datamodule(partition: str = "shard") -> FederatedDataModule:
    """100 clients, shard s = 2 (``shard``) or LDA α = 0.1 (``dirichlet``), batch 50, 64 per class held out."""
    return FederatedDataModule(
        "fashion_mnist",
        partition=partition,
        shards_per_client=2,
        alpha=0.1,
        num_clients=100,
        batch_size=50,
        holdout_per_class=64,
    )

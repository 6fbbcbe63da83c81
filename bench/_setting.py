"""The Fashion-MNIST FedNTD-paper setting the diagnostics in ``bench/`` share (run them as ``python bench/<x>.py``)."""

from __future__ import annotations

from fl_lightning import FederatedDataModule


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

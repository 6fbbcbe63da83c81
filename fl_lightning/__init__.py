"""fl_lightning: federated learning on non-IID data with PyTorch Lightning.

Import the pieces into your own Lightning project::

    from fl_lightning import FederatedDataModule, Federation, FedAvg
    trainer = L.Trainer(callbacks=[Federation(rounds=20)])
    trainer.fit(FedAvg(net="lenet"), datamodule=FederatedDataModule("digits"))

A round's units (:mod:`fl_lightning.rounds`, :mod:`fl_lightning.server_optim`, :mod:`fl_lightning.evaluation`,
:mod:`fl_lightning.partitions`) need no Trainer.
"""

from fl_lightning.data import FederatedDataModule
from fl_lightning.federation import Federation
from fl_lightning.module import FedAvg
from fl_lightning.server_optim import FedAdagrad, FedAdam, FedYogi, ServerOptimizer, ServerSGD

__all__ = [
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedYogi",
    "FederatedDataModule",
    "Federation",
    "ServerOptimizer",
    "ServerSGD",
]
__version__ = "0.1.0"

"""fl_lightning: federated learning on non-IID data with PyTorch Lightning.

Import the pieces into your own Lightning project::

    from fl_lightning import FederatedDataModule, Federation, FedAvg
    trainer = L.Trainer(callbacks=[Federation(rounds=20)])
    trainer.fit(FedAvg(net="lenet"), datamodule=FederatedDataModule("digits"))
"""

from fl_lightning.data import FederatedDataModule
from fl_lightning.federation import Federation
from fl_lightning.module import FedAvg

__all__ = ["FedAvg", "FederatedDataModule", "Federation"]
__version__ = "0.1.0"

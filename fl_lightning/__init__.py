"""fl_lightning: federated learning on non-IID data with PyTorch Lightning.

Import the pieces into your own Lightning project::

    from fl_lightning import FederatedDataModule, Federation, FedAvg
    trainer = L.Trainer(callbacks=[Federation(rounds=20)])
    trainer.fit(FedAvg(net="lenet"), datamodule=FederatedDataModule("digits"))

The package has three layers, each importing only those below it:

- :mod:`fl_lightning.core`: the Lightning-free engine (planning and reducing a round, server optimizers, partitions,
  losses, evaluation, metrics, datasets); importing it loads no Lightning.
- the Lightning layer, the modules at this level: the :class:`Federation` callback, the method modules
  (:mod:`fl_lightning.methods`), the :class:`FederatedDataModule`, the executors and the command line.
- :mod:`fl_lightning.experiments`: comparisons, reports and the claims table, built on the two layers below.

The names below are loaded on first use, so ``import fl_lightning.core.losses`` stays free of Lightning.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fl_lightning.core.server_optim import FedAdagrad, FedAdam, FedYogi, ServerOptimizer, ServerSGD
    from fl_lightning.data import FederatedDataModule
    from fl_lightning.federation import Federation
    from fl_lightning.module import FedAvg

_EXPORTS = {
    "FedAdagrad": "fl_lightning.core.server_optim",
    "FedAdam": "fl_lightning.core.server_optim",
    "FedAvg": "fl_lightning.module",
    "FedYogi": "fl_lightning.core.server_optim",
    "FederatedDataModule": "fl_lightning.data",
    "Federation": "fl_lightning.federation",
    "ServerOptimizer": "fl_lightning.core.server_optim",
    "ServerSGD": "fl_lightning.core.server_optim",
}

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


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fl_lightning' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

"""An MLP on tabular data (scikit-learn's breast-cancer features), federated over Dirichlet(0.5) clients.

Prints the federated model's test accuracy next to the same MLP trained centrally on all the training data with the
same optimizer, batch size and number of passes over the data::

    python examples/tabular_mlp.py --rounds 30
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from torch import nn

from fl_lightning import FedAvg, FederatedDataModule, Federation


def mlp(features: int, classes: int, hidden: int = 64) -> nn.Module:
    """The network both runs train."""
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def central_accuracy(dm: FederatedDataModule, epochs: int, lr: float, seed: int) -> float:
    """The same MLP trained on all clients' data pooled, on the same normalised features."""
    assert dm.transform is not None and dm.train_x is not None
    torch.manual_seed(seed)
    net = mlp(dm.input_shape[0], dm.num_classes)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, weight_decay=1e-5)
    x, y = dm.transform(dm.train_x, train=False), dm.train_y
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for batch in torch.randperm(len(y), generator=gen).split(dm.batch_size):
            opt.zero_grad()
            F.cross_entropy(net(x[batch]), y[batch]).backward()
            opt.step()
    x_test, y_test = (torch.cat(parts) for parts in zip(*dm.test_batches(), strict=True))
    with torch.no_grad():
        return float((net(dm.transform(x_test, train=False)).argmax(1) == y_test).float().mean())


def main(
    rounds: int = 30, local_epochs: int = 2, num_clients: int = 5, lr: float = 0.05, out: str = "runs/tabular_mlp"
) -> dict[str, float]:
    """Federated and central test accuracy of the MLP, as fractions."""
    x, y = load_breast_cancer(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype(np.float32), y, test_size=0.25, random_state=0, stratify=y
    )
    dm = FederatedDataModule.from_tensors(
        x_train,
        y_train,
        x_test,
        y_test,
        name="breast_cancer",
        partition="dirichlet",
        alpha=0.5,
        num_clients=num_clients,
        batch_size=16,
    )
    torch.manual_seed(0)
    model = FedAvg(net=mlp(x.shape[1], 2), lr=lr)
    federation = Federation(rounds=rounds, local_epochs=local_epochs)
    trainer = L.Trainer(callbacks=[federation], default_root_dir=out, logger=False, enable_progress_bar=False)
    trainer.fit(model, datamodule=dm)
    federated = federation.history[-1]["global_acc"]
    central = central_accuracy(dm, epochs=rounds * local_epochs, lr=lr, seed=0)
    print(f"federated {federated:.4f}  central {central:.4f}  (results in {Path(out).resolve()})")
    return {"federated": federated, "central": central}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--out", default="runs/tabular_mlp")
    args = parser.parse_args()
    main(args.rounds, args.local_epochs, args.clients, out=args.out)

"""Your existing LightningModule, federated unchanged (FedAvg), then with FedNTD's loss added in a few lines.

``LitClassifier`` below is an ordinary LightningModule: ``training_step(batch, batch_idx)`` on one ``(x, y)`` batch,
``configure_optimizers``. The :class:`~fl_lightning.Federation` callback runs each client's local epochs through it
(one Lightning batch per local step), averages the clients' weights and evaluates the global model every round::

    python examples/own_module.py --rounds 20
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning import FederatedDataModule, Federation
from fl_lightning.core.losses import ntd_loss


class LitClassifier(L.LightningModule):
    """A plain Lightning classifier, written with no federated learning in mind."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 4 * 4, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits."""
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """Cross-entropy on one batch."""
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Plain SGD with momentum."""
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def with_ntd_loss(base: type[L.LightningModule], beta: float = 1.0, tau: float = 1.0) -> type[L.LightningModule]:
    """``base`` trained with FedNTD's loss: CE + β·not-true distillation from the round's global model."""
    from fl_lightning.module import TeacherMixin  # the frozen global model of the round, as self.teacher_logits(x)

    class NTD(TeacherMixin, base):  # type: ignore[misc, valid-type]
        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            logits = self(x)
            loss = F.cross_entropy(logits, y) + beta * ntd_loss(logits, self.teacher_logits(x), y, tau)
            self.log("train_loss", loss)
            return loss

    NTD.__name__ = f"{base.__name__}NTD"
    return NTD


def federate(module: L.LightningModule, rounds: int, out: str) -> float:
    """Run ``module`` as the clients' local update on digits, Dirichlet(0.5); return the final test accuracy."""
    dm = FederatedDataModule("digits", partition="dirichlet", alpha=0.5, num_clients=10, batch_size=32)
    federation = Federation(rounds=rounds, local_epochs=2)
    trainer = L.Trainer(callbacks=[federation], default_root_dir=out, logger=False, enable_progress_bar=False)
    trainer.fit(module, datamodule=dm)
    return federation.history[-1]["global_acc"]


def main(rounds: int = 20, out: str = "runs/own_module") -> dict[str, float]:
    """Final test accuracy of the unchanged module (FedAvg) and of the same module with FedNTD's loss."""
    torch.manual_seed(0)
    fedavg = federate(LitClassifier(), rounds, f"{out}/fedavg")
    torch.manual_seed(0)
    fedntd = federate(with_ntd_loss(LitClassifier)(), rounds, f"{out}/fedntd")
    print(f"FedAvg {fedavg:.4f}  FedNTD {fedntd:.4f}")
    return {"fedavg": fedavg, "fedntd": fedntd}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", default="runs/own_module")
    args = parser.parse_args()
    main(args.rounds, args.out)

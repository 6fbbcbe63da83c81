"""A user's own LightningModule under the Federation callback: federated as FedAvg, or with a method's loss."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import bare_trainer

from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.core.losses import ntd_loss
from fl_lightning.core.models import build_model
from fl_lightning.methods import FedNTD
from fl_lightning.module import TeacherMixin


class PlainClassifier(L.LightningModule):
    """What a Lightning user already has: ordinary training_step and configure_optimizers."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.net = build_model("lenet", 1, 8, 10)
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, weight_decay=1e-5)


class PlainNTD(TeacherMixin, PlainClassifier):
    """The same module with FedNTD's loss added in a few lines."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        z = self(x)
        return F.cross_entropy(z, y) + ntd_loss(z, self.teacher_logits(x), y)


def _fit(tmp_path, model: L.LightningModule, rounds: int = 2) -> Federation:
    dm = FederatedDataModule("digits", num_clients=4, partition="dirichlet", alpha=1.0, batch_size=32)
    fed = Federation(rounds=rounds, local_epochs=1, plots=False)
    bare_trainer(tmp_path, fed).fit(model, datamodule=dm)
    return fed


@pytest.mark.parametrize(("own", "method"), [(PlainClassifier, FedAvg), (PlainNTD, FedNTD)])
def test_own_module_equals_the_builtin_method(tmp_path, own, method) -> None:
    torch.manual_seed(0)
    mine = own()
    builtin = method(net="lenet", num_classes=10, in_channels=1, image_size=8, lr=0.05)
    builtin.net.load_state_dict(mine.net.state_dict())
    fed_mine = _fit(tmp_path / "mine", mine)
    fed_builtin = _fit(tmp_path / "builtin", builtin)
    accs_mine = [r["global_acc"] for r in fed_mine.recorder.history]
    accs_builtin = [r["global_acc"] for r in fed_builtin.recorder.history]
    assert accs_mine == pytest.approx(accs_builtin, abs=1e-6)
    for name, value in builtin.net.state_dict().items():
        torch.testing.assert_close(mine.net.state_dict()[name], value, atol=1e-5, rtol=1e-5)
    assert fed_mine.recorder.status == "completed"


class _BatchSums(L.Callback):
    """Each training batch's input sum; with ``burn``, a draw from the global generator before every round."""

    def __init__(self, burn: bool = False) -> None:
        self.burn, self.sums = burn, []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.burn:
            torch.rand(7)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.sums.append(float(batch[0].sum()))


def _batch_sums(root, burn: bool = False, seed: int = 0, **augment) -> list[float]:
    dm = FederatedDataModule("digits", num_clients=3, batch_size=256, seed=0, **augment)
    spy = _BatchSums(burn)
    torch.manual_seed(0)
    bare_trainer(root, Federation(rounds=2, seed=seed, plots=False), spy).fit(PlainClassifier(), datamodule=dm)
    return spy.sums


def test_a_plain_modules_augmentation_does_not_depend_on_the_global_generator(tmp_path) -> None:
    """Batches are augmented before the step's hooks seed the client: each batch draws from its own seed."""
    augment = {"hflip": True, "crop_padding": 1}
    plain = _batch_sums(tmp_path / "plain")
    sums = _batch_sums(tmp_path / "a", **augment)
    assert sums != plain  # augmented
    assert _batch_sums(tmp_path / "b", burn=True, **augment) == sums


def test_the_federations_seed_shuffles_a_plain_modules_batches(tmp_path) -> None:
    """Federation(seed=...) orders the local batches (the datamodule's seed is the partition's)."""
    sums = _batch_sums(tmp_path / "a")
    assert _batch_sums(tmp_path / "b") == sums
    assert _batch_sums(tmp_path / "c", seed=1) != sums

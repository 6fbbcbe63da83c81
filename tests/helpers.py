"""Shared test utilities: tiny federations on the embedded digits data."""

from __future__ import annotations

import collections
import contextlib
import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor

from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.core.sources import DataSource

ROOT = Path(__file__).resolve().parent.parent

#: A named tuple a method keeps in its state: importable (module level), so a checkpoint or a Flower node can name it.
Pair = collections.namedtuple("Pair", "tensor count")


def quickstart_fit_args(run_dir: Path, *extra: str, rounds: int = 3, plots: bool = False) -> list[str]:
    """``cli.py`` arguments of a tiny quickstart fit (3 clients, 1 local epoch, no progress bar) into ``run_dir``.

    ``plots``: draw ``partition.png`` and ``curve.png`` (off unless a test looks at them: drawing them is about 40 %
    of a tiny fit's time).
    """
    return [
        "fit",
        *("--config", str(ROOT / "configs/quickstart.yaml")),
        *("--data.num_clients", "3", "--federation.local_epochs", "1", "--federation.rounds", str(rounds)),
        *("--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(run_dir)),
        *(() if plots else ("--federation.plots", "false")),
        *extra,
    ]


def bare_trainer(root: str | Path, *callbacks: L.Callback, **overrides: Any) -> L.Trainer:
    """A CPU Trainer for a federation in a test: no logger, checkpoint, progress bar or model summary."""
    kwargs: dict[str, Any] = {
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": str(root),
    }
    return L.Trainer(callbacks=list(callbacks), **{**kwargs, **overrides})


def tiny_run(
    tmp_path: Path,
    method: type[FedAvg] = FedAvg,
    rounds: int = 3,
    callbacks: list[L.Callback] | None = None,
    ckpt_path: str | None = None,
    data_kwargs: dict[str, Any] | None = None,
    model_kwargs: dict[str, Any] | None = None,
    fed_kwargs: dict[str, Any] | None = None,
    precision: str = "32-true",
    plots: bool = False,
    weights_only: bool | None = None,
) -> tuple[L.Trainer, Federation, FedAvg]:
    """A few rounds of a small federation on digits, as a user importing the package would write it.

    ``plots``: draw ``partition.png`` and ``curve.png`` (off unless a test looks at them, as in
    :func:`quickstart_fit_args`).
    """
    L.seed_everything(0, verbose=False)
    data_kwargs = {"num_clients": 5, "partition": "dirichlet", "alpha": 1.0, "batch_size": 32, **(data_kwargs or {})}
    dm = FederatedDataModule("digits", **data_kwargs)
    model = method(
        net="lenet",
        num_classes=dm.num_classes,
        in_channels=dm.in_channels,
        image_size=dm.image_size,
        lr=0.05,
        **(model_kwargs or {}),
    )
    fed = Federation(rounds=rounds, **{"local_epochs": 1, "plots": plots, **(fed_kwargs or {})})
    checkpoint = L.pytorch.callbacks.ModelCheckpoint(save_last="link", save_top_k=1)
    trainer = bare_trainer(
        tmp_path, fed, checkpoint, *(callbacks or []), max_epochs=rounds, enable_checkpointing=True, precision=precision
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path, weights_only=weights_only)
    return trainer, fed, model


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread within the context, as a subprocess fit with ``OMP_NUM_THREADS=1``: comparable metrics."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def read_metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


def read_summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def float64(method: type[FedAvg]) -> type[FedAvg]:
    """``method`` on a float64 network: inputs are cast in its loss and forward (call ``.double()`` on the model)."""

    class Float64(method):  # type: ignore[valid-type, misc]
        def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
            return super().client_loss(x.double(), y)

        def forward(self, x: Tensor) -> Tensor:
            return super().forward(x.double())

    return Float64


class TabularSource(DataSource):
    """Six features, two classes: data a built-in image network cannot take."""

    def load(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        x = torch.randn(40, 6, generator=torch.Generator().manual_seed(0))
        y = (x[:, 0] > 0).long()
        return (x[:30], y[:30]), (x[30:], y[30:])

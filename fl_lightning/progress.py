"""The terminal in rounds: a progress bar that counts rounds and clients, and Lightning's start-up noise removed."""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

import lightning as L
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm, TQDMProgressBar, convert_inf
from typing_extensions import override

#: Messages of Lightning's that say nothing about a federated run (advertising, per-round loop remarks).
_NOISE = (
    "💡 Tip:",
    "Seed set to",  # the seed is in config.yaml and summary.json
    "isinstance(treespec, LeafSpec)",
    "does not have many workers",
    "smaller than the logging interval",
    "is not available for the CPU",
    "LightningCLI's args parameter is intended",
    "exists and is not empty",  # a resume's checkpoint folder; a new run into a used folder is refused earlier
)


_SEED_LOGGER = "lightning.fabric.utilities.seed"


def _is_noise(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return any(part in message for part in _NOISE)


class _DropNoise(logging.Filter):
    @override
    def filter(self, record: logging.LogRecord) -> bool:
        return not _is_noise(record)


def quiet_lightning() -> None:
    """Drop Lightning's advertising tips and per-round warnings that do not apply to a federation (idempotent).

    The ``GPU available``/``TPU available`` lines stay: they say which device a run uses.
    """
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero", _SEED_LOGGER):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in logger.filters):
            logger.addFilter(_DropNoise())
    for part in _NOISE[2:]:
        warnings.filterwarnings("ignore", message=f".*{_escape(part)}.*")


def _escape(text: str) -> str:
    import re

    return re.escape(text)


def federation_rounds(trainer: L.Trainer) -> int | None:
    """The number of rounds of the trainer's federation (its ``Federation`` callback), else its ``max_epochs``."""
    for callback in trainer.callbacks:
        rounds = getattr(callback, "rounds", None)
        if type(callback).__name__ == "Federation" and isinstance(rounds, int):
            return rounds
    return trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None


class RoundProgressBar(TQDMProgressBar):
    """A progress bar in rounds: ``round r/R`` and ``client i/k`` of the round, with the round's elapsed time.

    One Lightning epoch is one round and one training batch is one client's whole local update, so the batch
    index is the client slot and the train dataloader's length the number of clients in the round.
    """

    BAR_FORMAT = "{desc} |{bar:20}| client {n_fmt}/{total_fmt} [{elapsed}<{remaining}]{postfix}"

    @override
    def init_train_tqdm(self) -> Tqdm:
        return Tqdm(
            desc="starting",
            position=(2 * self.process_position),
            disable=self.is_disabled,
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            bar_format=self.BAR_FORMAT,
        )

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        self.train_progress_bar.reset(total=convert_inf(self.total_train_batches))
        self.train_progress_bar.initial = 0
        self.train_progress_bar.set_description(self.round_label(trainer), refresh=False)

    @staticmethod
    def round_label(trainer: L.Trainer) -> str:
        """``round r/R`` of the trainer's current epoch (1-based)."""
        rounds = federation_rounds(trainer)
        return f"round {trainer.current_epoch + 1}/{rounds if rounds is not None else '?'}"

    @override
    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int | str | float | dict]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        acc = metrics.pop("global_acc", None)
        if acc is not None:
            metrics["acc"] = f"{float(acc) * 100:.2f}%"
        return metrics

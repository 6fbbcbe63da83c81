"""The terminal in rounds: a progress bar that counts rounds and clients, and Lightning's start-up noise removed.

On a terminal the bar shows while a round's clients train and is erased before any other line is printed (the round's
line, ``done:``, a warning), so it never shares a line with one. When stdout is not a terminal (a log file, a pipe)
it draws nothing: a log holds one line per round.

:class:`RoundProgressBar` (tqdm) and :class:`RichRoundProgressBar` (rich) count rounds and clients; a
:class:`~fl_lightning.Federation` puts them in place of Lightning's own two bars (:func:`use_round_bars`).
"""

from __future__ import annotations

import itertools
import logging
import sys
import warnings
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import RichProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm, TQDMProgressBar, convert_inf
from typing_extensions import override

from fl_lightning.lightning_internals import rich_bar_settings

#: Log lines of Lightning's that say nothing about a federated run (advertising, start-up and end remarks).
_LOG_NOISE = (
    "💡 Tip:",
    "Seed set to",  # the seed is in config.yaml and summary.json
    "GPU available: ",  # a GPU that is there but unused still gets Lightning's "GPU available but not used" warning
    "TPU available: ",
    "HPU available: ",
    "that has Tensor Cores",  # advice to lower float32 matmul precision; runs keep torch's default on purpose
    "`Trainer.fit` stopped: `max_epochs=",  # the rounds; fl_lightning's `done:` line says how the run ended
)

#: Warnings of Lightning's that do not apply to a federation (per-round loop remarks).
_WARNING_NOISE = (
    "isinstance(treespec, LeafSpec)",
    "does not have many workers",
    "smaller than the logging interval",
    "is not available for the CPU",
    "LightningCLI's args parameter is intended",
    "exists and is not empty",  # a resume's checkpoint folder; a new run into a used folder is refused earlier
    "but have no `validation_step`",  # the datamodule offers the server holdout for a module that validates
    "Total length of `list` across ranks is zero",  # no validation data (no holdout, no val split): no validation
    # a method's scheduler dict: fl_lightning keeps its monitor and steps it once a round (rules.step_lr_schedulers)
    "but the keys will be ignored. You need to call `lr_scheduler.step()` manually",
)

_NOISE = _LOG_NOISE + _WARNING_NOISE


_SEED_LOGGER = "lightning.fabric.utilities.seed"


def _is_noise(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return any(part in message for part in _NOISE)


class _DropNoise(logging.Filter):
    @override
    def filter(self, record: logging.LogRecord) -> bool:
        return not _is_noise(record)


def quiet_lightning() -> None:
    """Drop Lightning's advertising tips, accelerator lines and warnings that do not apply to a federation (idempotent).

    A GPU that is present but not used is still reported (Lightning's "GPU available but not used" warning).
    """
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero", _SEED_LOGGER):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in logger.filters):
            logger.addFilter(_DropNoise())
    for part in _WARNING_NOISE:
        warnings.filterwarnings("ignore", message=f".*{_escape(part)}.*")


def _escape(text: str) -> str:
    import re

    return re.escape(text)


def federation_rounds(trainer: L.Trainer) -> int | None:
    """The number of rounds of the trainer's federation (its ``Federation`` callback), else its ``max_epochs``."""
    for callback in trainer.callbacks:  # type: ignore[attr-defined]  # assigned by Lightning, undeclared on Trainer
        rounds = getattr(callback, "rounds", None)
        if type(callback).__name__ == "Federation" and isinstance(rounds, int):
            return rounds
    return trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None


def last_evaluation(trainer: L.Trainer) -> tuple[int, float] | None:
    """The round and global accuracy of the federation's last evaluated round (None before the first)."""
    for callback in trainer.callbacks:  # type: ignore[attr-defined]  # assigned by Lightning, undeclared on Trainer
        history = getattr(callback, "history", None)
        if type(callback).__name__ == "Federation" and history:
            return int(history[-1]["round"]), float(history[-1]["global_acc"])
    return None


def round_clients(trainer: L.Trainer, batches_done: int) -> tuple[int, int] | None:
    """Clients of the round that are done after ``batches_done`` training batches, and the round's clients.

    A method trains one client per training batch (the batched engine: one group of clients); any other module one
    local step per batch, client after client (the round's plan says how many each). None outside a federation's
    training round.
    """
    try:
        loader = trainer.train_dataloader
    except (AttributeError, RuntimeError):
        return None
    plan: Any = getattr(loader, "plan", None)
    clients = getattr(plan, "clients", None)
    if clients is None:
        return None
    group = getattr(loader, "group", None)
    if group:  # the batched engine: a training batch is a group of clients
        return min(batches_done * group, len(clients)), len(clients)
    per_client = plan.steps if getattr(loader, "flat", False) else (1,) * len(clients)
    return sum(1 for end in itertools.accumulate(per_client) if end <= batches_done), len(clients)


def round_metrics(metrics: dict[str, Any], trainer: L.Trainer) -> dict[str, Any]:
    """A bar's metrics in rounds: no ``v_num``, the global accuracy labelled with the round it was measured after."""
    metrics.pop("v_num", None)
    acc = metrics.pop("global_acc", None)
    last = last_evaluation(trainer)
    if last is not None:
        metrics[f"round {last[0]} acc"] = f"{last[1] * 100:.2f}%"
    elif acc is not None:
        metrics["last acc"] = f"{float(acc) * 100:.2f}%"
    return metrics


def use_round_bars(trainer: L.Trainer) -> None:
    """Put the round-counting bars in place of Lightning's own ``TQDMProgressBar`` and ``RichProgressBar``.

    Only those exact classes (the Trainer's default bar, or one the user added) are replaced, keeping their settings;
    the replacement draws wherever Lightning's would (``terminal_only=False``). Any other bar is left as it is.
    """
    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]  # assigned by Lightning, undeclared
    for i, bar in enumerate(callbacks):
        if type(bar) is TQDMProgressBar:
            callbacks[i] = RoundProgressBar(bar.refresh_rate, bar.process_position, terminal_only=False)
        elif type(bar) is RichProgressBar:
            callbacks[i] = RichRoundProgressBar(**rich_bar_settings(bar))


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class _CountsClients(ProgressBar):
    """Mixed into a progress bar: a round's bar counts its clients, not its training batches."""

    @property
    def total_train_batches(self) -> int | float:
        """The round's clients (Lightning's count, of training batches, outside a federation)."""
        progress = round_clients(self.trainer, 0)
        return progress[1] if progress is not None else super().total_train_batches


class RoundProgressBar(_CountsClients, TQDMProgressBar):
    """A progress bar in rounds: ``round r/R`` and ``client i/k`` of the round, with the round's elapsed time.

    One Lightning epoch is one round and one training batch is one client's whole local update, so the batch
    index is the client slot and the train dataloader's length the number of clients in the round. Each round draws
    its own bar and erases it once its last client has trained, before the round's line is printed; the accuracy it
    shows is labelled with the round it was measured after (``round 4 acc=96.11%`` while round 5 trains).

    Args:
        refresh_rate: redraw every this many clients.
        process_position: the bar's line, for several bars at once.
        leave: unused (each round's bar is erased); kept for Lightning's signature.
        terminal_only: draw only when stdout is a terminal; elsewhere (a log file, a pipe) :meth:`print` still
            prints the lines, so a log gets one line per round and no bar frames.
    """

    BAR_FORMAT = "{desc} |{bar:20}| client {n_fmt}/{total_fmt} [{elapsed}<{remaining}]{postfix}"

    def __init__(
        self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False, terminal_only: bool = True
    ) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position, leave=leave)
        self.terminal_only = terminal_only

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if self.terminal_only and not _is_terminal(sys.stdout):
            self.disable()

    @override
    def init_train_tqdm(self) -> Tqdm:
        """The bar of the round that starts: ``round r/R``, one step per client."""
        trainer = self._trainer
        return Tqdm(
            desc=self.round_label(trainer) if trainer is not None else "starting",
            total=convert_inf(self.total_train_batches) if trainer is not None else None,
            position=(2 * self.process_position),
            disable=self.is_disabled,
            leave=False,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            bar_format=self.BAR_FORMAT,
        )

    def close_bar(self) -> None:
        """Erase the round's bar (if one is drawn), so that the next line starts on a line of its own."""
        if self._train_progress_bar is not None:
            self._train_progress_bar.close()
            self._train_progress_bar = None

    @override
    def on_train_start(self, *_: Any) -> None:
        """No bar yet: each round draws its own."""

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        self.close_bar()
        self.train_progress_bar = self.init_train_tqdm()
        self.train_progress_bar.set_postfix(self.get_metrics(trainer, trainer.lightning_module))

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        bar = self._train_progress_bar
        if bar is None or bar.disable:
            return
        progress = round_clients(trainer, batch_idx + 1)
        n = progress[0] if progress is not None else batch_idx + 1
        if self._should_update(n, bar.total):
            bar.n = n
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # redraws
        if bar.total is not None and n >= bar.total:
            self.close_bar()  # the round's clients are done; its line comes next

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.close_bar()

    @override
    def on_train_end(self, *_: Any) -> None:
        self.close_bar()

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.close_bar()

    @override
    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """A line above the bar while one is drawn, else a plain line on stdout (also when the bar is disabled)."""
        bars = (self._train_progress_bar, self._val_progress_bar, self._test_progress_bar, self._predict_progress_bar)
        if any(bar is not None and not bar.disable for bar in bars):
            super().print(*args, sep=sep, **kwargs)
        else:
            print(*args, sep=sep, flush=True, **kwargs)

    @staticmethod
    def round_label(trainer: L.Trainer) -> str:
        """``round r/R`` of the trainer's current epoch (1-based)."""
        rounds = federation_rounds(trainer)
        return f"round {trainer.current_epoch + 1}/{rounds if rounds is not None else '?'}"

    @override
    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int | str | float | dict]:
        return round_metrics(super().get_metrics(trainer, pl_module), trainer)


class RichRoundProgressBar(_CountsClients, RichProgressBar):
    """Lightning's ``RichProgressBar`` in rounds: ``round r/R``, clients done of the round's, the last round's accuracy.

    It needs ``rich``, as Lightning's bar does, and takes the same arguments. Outside a federation's rounds
    (validate, test, predict) it is Lightning's bar.
    """

    @override
    def _get_train_description(self, current_epoch: int) -> str:
        description = RoundProgressBar.round_label(self.trainer)
        return f"{description:{len(self.validation_description)}}"  # as Lightning's: no flicker next to validation

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        progress = round_clients(trainer, batch_idx + 1)
        if progress is None:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        if not self.is_disabled and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        self._update(self.train_progress_bar_id, progress[0])
        self._update_metrics(trainer, pl_module)
        self.refresh()

    @override
    def configure_columns(self, trainer: L.Trainer) -> list:
        """Lightning's columns without the speed (clients per second would say little)."""
        return [c for c in super().configure_columns(trainer) if type(c).__name__ != "ProcessingSpeedColumn"]

    @override
    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, int | str | float | dict]:
        return round_metrics(super().get_metrics(trainer, pl_module), trainer)

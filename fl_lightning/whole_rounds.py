"""A federated round runs whole: a stop asked for in the middle of one waits for its end.

Lightning's ``max_time`` and any callback may set ``trainer.should_stop`` after a training batch, and Lightning then
ends the epoch: under a federation that would end the round after some of its clients, with one client's local
weights as the model and a checkpoint that counts the round as done. :class:`WholeRounds`, which the
:class:`~fl_lightning.Federation` callback places after every other callback but the checkpoints, holds such a stop
back and hands it on at the round's end; a run stopped after a round without an evaluation (``eval_every`` above 1)
has that round evaluated, so that the run's last round is always recorded.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import lightning as L
from lightning.pytorch.callbacks import Callback, Checkpoint
from typing_extensions import override

from fl_lightning.lightning_internals import can_stop_early


class Rounds(Protocol):
    """What :class:`WholeRounds` asks of the federation (:class:`~fl_lightning.Federation`)."""

    @property
    def round_running(self) -> int | None:
        """The round whose clients are training now (counted from 1), else ``None``."""
        ...

    def say(self, trainer: L.Trainer, message: str) -> None:
        """Print a line of the run's."""
        ...

    def measure_stopped_round(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Evaluate and record a stopped run's last round, if it was not evaluated."""
        ...


class WholeRounds(Callback):
    """Defers a stop asked for mid-round to the round's end; evaluates a stopped run's unevaluated last round."""

    def __init__(self, federation: Rounds) -> None:
        self.federation = federation
        self.deferred = False
        self._timer_lines = _OneTimeLimitLine()

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.deferred = False
        self._timer_lines.attach()

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._timer_lines.detach()

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._timer_lines.detach()

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Hold back a stop asked for mid-round; give it back once the round has ended."""
        running = self.federation.round_running
        if running is None:  # the round ended with this batch (or diverged): a stop may take effect
            if self.deferred:
                trainer.should_stop, self.deferred = True, False
            return
        if trainer.should_stop and can_stop_early(trainer):  # else Lightning goes on anyway (min_epochs)
            if not self.deferred:
                self.federation.say(trainer, f"round {running}: stop asked for mid-round; the round finishes first")
            trainer.should_stop, self.deferred = False, True

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A stop after a round without an evaluation: the round is evaluated before its checkpoint is saved."""
        self.federation.measure_stopped_round(trainer, pl_module)


def place_whole_rounds(trainer: L.Trainer, federation: Rounds) -> None:
    """Put ``federation``'s :class:`WholeRounds` after the Trainer's other callbacks, before its checkpoints.

    Called when the datamodule is attached and again at setup, once Lightning has added the module's own
    ``configure_callbacks`` (after the Trainer's, before the checkpoints it keeps last). Moving it later in the list
    while Lightning calls a hook on the callbacks (setup) calls that hook on each callback once.
    """
    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]  # assigned by Lightning, undeclared
    ours = [c for c in callbacks if isinstance(c, WholeRounds) and c.federation is federation]
    for callback in ours:
        callbacks.remove(callback)
    at = next((i for i, c in enumerate(callbacks) if isinstance(c, Checkpoint)), len(callbacks))
    callbacks.insert(at, ours[0] if ours else WholeRounds(federation))


class _OneTimeLimitLine(logging.Filter):
    """Lets Lightning's ``Time limit reached`` line through once a fit.

    Its Timer says it again after every batch for which :class:`WholeRounds` holds the stop back.
    """

    _LOGGER = "lightning.pytorch.utilities.rank_zero"

    def __init__(self) -> None:
        super().__init__()
        self.said = False

    def attach(self) -> None:
        self.said = False
        logger = logging.getLogger(self._LOGGER)
        if self not in logger.filters:
            logger.addFilter(self)

    def detach(self) -> None:
        logging.getLogger(self._LOGGER).removeFilter(self)

    @override
    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("Time limit reached."):
            return True
        seen, self.said = self.said, True
        return not seen

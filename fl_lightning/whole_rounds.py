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


class Rounds(Protocol):
    """What :class:`WholeRounds` asks of the federation (:class:`~fl_lightning.Federation`)."""

    def hold_stop(self, trainer: L.Trainer) -> None:
        """Hold back a stop asked for mid-round; hand it on once the round has ended."""
        ...

    def measure_stopped_round(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Evaluate and record a stopped run's last round, if it was not evaluated."""
        ...


class WholeRounds(Callback):
    """Defers a stop asked for mid-round to the round's end; evaluates a stopped run's unevaluated last round."""

    def __init__(self, federation: Rounds) -> None:
        self.federation = federation
        self._timer_lines = _OneTimeLimitLine()

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
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
        """A stop asked for by the callbacks after the federation's (the federation holds it; it holds its own)."""
        self.federation.hold_stop(trainer)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A stop after a round without an evaluation: the round is evaluated before its checkpoint is saved."""
        self.federation.measure_stopped_round(trainer, pl_module)


def place_whole_rounds(trainer: L.Trainer, federation: Rounds) -> None:
    """Put ``federation``'s :class:`WholeRounds` after the Trainer's other callbacks, before its checkpoints.

    Called when the datamodule is attached and again in the federation's ``setup``, once Lightning has added the
    module's own ``configure_callbacks`` (after the Trainer's, before the checkpoints it keeps last). The Trainer gets
    a new list: Lightning may be calling ``setup`` down the old one, which goes on as it was (changing that list in
    place would skip or repeat a callback's hook).
    """
    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]  # assigned by Lightning, undeclared
    ours = next((c for c in callbacks if isinstance(c, WholeRounds) and c.federation is federation), None)
    others = [c for c in callbacks if c is not ours]
    at = next((i for i, c in enumerate(others) if isinstance(c, Checkpoint)), len(others))
    placed = [*others[:at], ours if ours is not None else WholeRounds(federation), *others[at:]]
    if placed != callbacks:
        trainer.callbacks = placed  # type: ignore[attr-defined]


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

"""Every use fl_lightning makes of Lightning's private internals, one function each.

Lightning promises nothing about these names. ``tests/test_lightning_internals.py`` checks each assumption against the
installed Lightning and fails naming the one that no longer holds: run it first when raising the ``lightning`` pin.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks.progress.rich_progress import RichProgressBar
from lightning.pytorch.core.mixins import HyperparametersMixin

__all__ = ["has_trainer", "record_initial_hparam", "rich_bar_settings", "set_logged_step"]


def set_logged_step(trainer: L.Trainer, step: int) -> None:
    """Make ``step`` the step Lightning passes to the loggers with what is logged next.

    Lightning's logger connector logs at ``fit_loop.epoch_loop._batches_that_stepped``; a federation logs by round.
    """
    trainer.fit_loop.epoch_loop._batches_that_stepped = step


def record_initial_hparam(obj: HyperparametersMixin, name: str, value: Any) -> None:
    """Set a hyper-parameter resolved after ``__init__``, in ``hparams`` and in what the loggers receive at fit start.

    Lightning sends ``_hparams_initial`` (a copy taken by ``save_hyperparameters``) to the loggers, not ``hparams``.
    """
    obj.hparams[name] = value
    initial = getattr(obj, "_hparams_initial", None)
    if initial is not None:
        initial[name] = value


def rich_bar_settings(bar: RichProgressBar) -> dict[str, Any]:
    """The constructor arguments of a ``RichProgressBar``, to build a replacement with the same settings."""
    return {
        "refresh_rate": bar.refresh_rate,
        "leave": bar._leave,
        "theme": bar.theme,
        "console_kwargs": bar._console_kwargs,
    }


def has_trainer(module: L.LightningModule) -> bool:
    """Whether ``module.trainer`` would return a Trainer (or a Fabric stand-in) instead of raising."""
    return not (module._trainer is None and module._fabric is None and not module._jit_is_scripting)

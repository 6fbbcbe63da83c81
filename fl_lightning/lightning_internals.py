"""Every use fl_lightning makes of Lightning's private internals, one function each.

Lightning promises nothing about these names. ``tests/test_lightning_internals.py`` checks each assumption against the
installed Lightning and fails naming the one that no longer holds: run it first when raising the ``lightning`` pin.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint, Timer
from lightning.pytorch.callbacks.progress.rich_progress import RichProgressBar
from lightning.pytorch.core.mixins import HyperparametersMixin

__all__ = [
    "checkpoints_within_epochs",
    "count_optimizer_steps",
    "counted_step",
    "has_trainer",
    "record_initial_hparam",
    "rich_bar_settings",
    "set_logged_step",
    "step_only_logged_names",
]


def checkpoints_within_epochs(callback: ModelCheckpoint) -> bool:
    """Whether a ``ModelCheckpoint`` saves by training steps or time (``every_n_train_steps``, ``train_time_interval``).

    Lightning keeps both only as private attributes (``_every_n_train_steps``, ``_train_time_interval``).
    """
    return bool(callback._every_n_train_steps) or callback._train_time_interval is not None


def max_time_seconds(trainer: L.Trainer) -> float | None:
    """The ``max_time`` a Trainer was built with, in seconds (its ``Timer``'s duration; ``Timer._duration``)."""
    for callback in trainer.callbacks:  # type: ignore[attr-defined]  # assigned by Lightning, undeclared on Trainer
        if isinstance(callback, Timer) and callback._duration is not None:
            return float(callback._duration)
    return None


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


def count_optimizer_steps(optimizer: Any, steps: int) -> None:
    """Advance Lightning's step count (``trainer.global_step``) by ``steps`` without stepping ``optimizer``.

    ``optimizer`` is the ``LightningOptimizer`` of ``module.optimizers()``; its ``_on_before_step`` and
    ``_on_after_step`` hooks are what the training loop's step counter listens to.
    """
    for _ in range(steps):
        optimizer._on_before_step()
        optimizer._on_after_step()


def counted_step(optimizer: Any) -> None:
    """Step the wrapped torch optimizer of a ``LightningOptimizer`` once, counted in ``trainer.global_step``.

    Unlike ``LightningOptimizer.step`` this runs no closure, precision plugin or strategy hook chain.
    """
    optimizer._on_before_step()
    optimizer.optimizer.step()
    optimizer._on_after_step()


def step_only_logged_names(trainer: L.Trainer) -> set[str]:
    """The names a module logged during training with ``on_step`` only (from ``trainer._results``' metadata)."""
    results = getattr(trainer, "_results", None) or {}
    metas = (getattr(result, "meta", None) for result in results.values())
    return {m.name for m in metas if m is not None and m.logger and m.on_step and not m.on_epoch}

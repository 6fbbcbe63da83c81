"""Every use fl_lightning makes of Lightning's private internals, one function each.

Lightning promises nothing about these names. ``tests/test_lightning_internals.py`` checks each assumption against the
installed Lightning and fails naming the one that no longer holds: run it first when raising the ``lightning`` pin.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, Timer
from lightning.pytorch.callbacks.progress.rich_progress import RichProgressBar
from lightning.pytorch.core.mixins import HyperparametersMixin

__all__ = [
    "can_stop_early",
    "checkpoints_within_epochs",
    "count_optimizer_steps",
    "counted_step",
    "has_trainer",
    "keep_scheduler_monitors",
    "python_scalar_hparams",
    "record_initial_hparam",
    "restore_scheduler_monitors",
    "rich_bar_settings",
    "set_logged_batch_size",
    "set_logged_step",
    "set_process_group_timeout",
    "step_only_logged_names",
]


def checkpoints_within_epochs(callback: ModelCheckpoint) -> bool:
    """Whether a ``ModelCheckpoint`` saves by training steps or time (``every_n_train_steps``, ``train_time_interval``).

    Lightning keeps both only as private attributes (``_every_n_train_steps``, ``_train_time_interval``).
    """
    return bool(callback._every_n_train_steps) or callback._train_time_interval is not None


def can_stop_early(trainer: L.Trainer) -> bool:
    """Whether a ``trainer.should_stop`` ends the fit now (``min_epochs`` met): Lightning's ``_can_stop_early``."""
    return bool(trainer.fit_loop._can_stop_early)


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


def set_process_group_timeout(trainer: L.Trainer, seconds: float) -> bool:
    """Give a DDP strategy whose process group is not started yet ``seconds`` as its timeout; whether it did.

    Lightning keeps the timeout it passes to ``init_process_group`` as ``DDPStrategy._timeout`` (by default torch's
    30 minutes); with gloo it bounds every collective, so that a frozen process fails the others instead of holding
    them. A timeout given to the strategy itself (``DDPStrategy(timeout=...)``: any other than the default) is kept.
    """
    from datetime import timedelta

    import torch.distributed as dist
    from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
    from lightning.pytorch.strategies import DDPStrategy

    strategy = trainer.strategy
    if not isinstance(strategy, DDPStrategy) or (dist.is_available() and dist.is_initialized()):
        return False
    if strategy._timeout != default_pg_timeout:
        return False
    strategy._timeout = timedelta(seconds=seconds)
    return True


def set_logged_batch_size(module: L.LightningModule, size: int) -> None:
    """Make ``size`` the batch size of what ``module`` logs next with ``self.log`` (the weight of an ``on_epoch`` mean).

    Lightning infers it from the training batch (``trainer._results.batch_size``, reset per batch), but a method's
    training batch is a whole client: its local batches set it, one by one.
    """
    trainer = module._trainer
    results = getattr(trainer, "_results", None) if trainer is not None else None
    if results is not None:
        results.batch_size = size


def record_initial_hparam(obj: HyperparametersMixin, name: str, value: Any) -> None:
    """Set a hyper-parameter resolved after ``__init__``, in ``hparams`` and in what the loggers receive at fit start.

    Lightning sends ``_hparams_initial`` (a copy taken by ``save_hyperparameters``) to the loggers, not ``hparams``.
    """
    obj.hparams[name] = value
    initial = getattr(obj, "_hparams_initial", None)
    if initial is not None:
        initial[name] = value


def python_scalar_hparams(obj: HyperparametersMixin) -> None:
    """Record the numpy scalars among ``obj``'s hyper-parameters (also in a tuple or list) as Python's.

    Lightning refuses a fit whose module and datamodule share a key of different types (``num_classes``
    ``np.int64(10)`` and ``10``), and the loggers write YAML of Python's types.
    """
    for name, value in list(obj.hparams.items()):
        if isinstance(value, np.generic):
            record_initial_hparam(obj, name, value.item())
        elif isinstance(value, tuple | list) and any(isinstance(v, np.generic) for v in value):
            record_initial_hparam(obj, name, type(value)(v.item() if isinstance(v, np.generic) else v for v in value))


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


def keep_scheduler_monitors(module: L.LightningModule) -> dict[int, tuple[str | None, bool]]:
    """Keep the ``monitor`` and ``strict`` of a manual-optimization module's LR schedulers, which Lightning drops.

    Lightning's ``_configure_schedulers_manual_opt`` builds each ``LRSchedulerConfig`` without them (it leaves the
    stepping to the module), but fl_lightning steps the methods' schedulers once a round, a ``ReduceLROnPlateau`` on
    its monitored key. The module's next ``configure_optimizers`` call (the fit's) is wrapped to note them into the
    returned dict; hand it to :func:`restore_scheduler_monitors` once Lightning has built its configs.
    """
    had_own = "configure_optimizers" in vars(module)
    original = module.configure_optimizers
    found: dict[int, tuple[str | None, bool]] = {}

    def configure_optimizers() -> Any:
        if had_own:
            module.configure_optimizers = original  # type: ignore[method-assign]
        else:
            del module.configure_optimizers
        conf = original()
        _note_monitors(conf, None, True, found)
        return conf

    module.configure_optimizers = configure_optimizers  # type: ignore[method-assign]
    return found


def restore_scheduler_monitors(trainer: L.Trainer, found: dict[int, tuple[str | None, bool]]) -> None:
    """Put what :func:`keep_scheduler_monitors` noted (``found``) back into the Trainer's LR scheduler configs.

    A ``ReduceLROnPlateau`` is marked ``reduce_on_plateau``, as Lightning does for automatic optimization.
    """
    for config in trainer.lr_scheduler_configs:
        monitor, strict = found.get(id(config.scheduler), (None, True))
        config.monitor, config.strict = monitor, strict
        config.reduce_on_plateau = isinstance(config.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def _note_monitors(conf: Any, monitor: str | None, strict: bool, found: dict[int, tuple[str | None, bool]]) -> None:
    """Walk what ``configure_optimizers`` returned; note each scheduler's monitor and strictness by its ``id``."""
    if isinstance(conf, dict):
        monitor, strict = conf.get("monitor", monitor), bool(conf.get("strict", strict))
        if "scheduler" in conf:
            found[id(conf["scheduler"])] = (monitor, strict)
        if "lr_scheduler" in conf:
            _note_monitors(conf["lr_scheduler"], monitor, strict, found)
    elif isinstance(conf, list | tuple):
        for item in conf:
            _note_monitors(item, monitor, strict, found)
    elif hasattr(conf, "step") and not isinstance(conf, torch.optim.Optimizer):
        found[id(conf)] = (monitor, strict)

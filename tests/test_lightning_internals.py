"""Lightning's private internals that fl_lightning relies on (fl_lightning.lightning_internals), one test each.

A failure here names the internal that a new Lightning release changed: mend its function in
``fl_lightning/lightning_internals.py`` before raising the ``lightning`` pin.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.loggers.logger import Logger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fl_lightning.lightning_internals import (
    checkpoints_within_epochs,
    count_optimizer_steps,
    counted_step,
    has_trainer,
    keep_scheduler_monitors,
    record_initial_hparam,
    restore_scheduler_monitors,
    rich_bar_settings,
    set_logged_batch_size,
    set_logged_step,
    set_process_group_timeout,
    step_only_logged_names,
)


class _Tiny(L.LightningModule):
    def __init__(self, width: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)


class _Steps(Logger):
    """Records the step of every log_metrics call and the hyper-parameters sent at fit start."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[dict[str, float], int | None]] = []
        self.hparams: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return "steps"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.steps.append((metrics, step))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        self.hparams.update(dict(params))


def _trainer(tmp_path: Any, **kwargs: Any) -> L.Trainer:
    defaults: dict[str, Any] = {
        "accelerator": "cpu",
        "max_epochs": 1,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": str(tmp_path),
    }
    return L.Trainer(**{**defaults, **kwargs})


def test_logged_step_is_fit_loop_epoch_loop_batches_that_stepped(tmp_path):
    assert hasattr(L.Trainer().fit_loop.epoch_loop, "_batches_that_stepped"), (
        "Lightning no longer has fit_loop.epoch_loop._batches_that_stepped (set_logged_step)"
    )

    class LogAtEpochEnd(L.Callback):
        def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            set_logged_step(trainer, 41)
            pl_module.log("probe", 1.0)

    logger = _Steps()
    _trainer(tmp_path, logger=logger, callbacks=[LogAtEpochEnd()]).fit(_Tiny(), _loader())
    steps = [step for metrics, step in logger.steps if "probe" in metrics]
    # What is logged at an epoch's end goes out at the step before it (Federation sets ``round + 2`` there).
    assert steps == [40], f"the loggers' step no longer follows _batches_that_stepped (set_logged_step): {steps}"


def test_loggers_receive_hparams_initial(tmp_path):
    class Resolve(L.Callback):
        def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
            record_initial_hparam(pl_module, "resolved", 7)

    logger = _Steps()
    model = _Tiny()
    _trainer(tmp_path, logger=logger, callbacks=[Resolve()]).fit(model, _loader())
    assert model.hparams["resolved"] == 7
    assert logger.hparams.get("resolved") == 7, (
        "the loggers no longer receive LightningModule._hparams_initial (record_initial_hparam)"
    )


def test_rich_progress_bar_settings_round_trip():
    pytest.importorskip("rich")
    bar = RichProgressBar(refresh_rate=3, leave=True, console_kwargs={"width": 90})
    settings = rich_bar_settings(bar)
    again = RichProgressBar(**settings)
    assert rich_bar_settings(again) == settings, "RichProgressBar's _leave/_console_kwargs changed (rich_bar_settings)"
    assert settings["leave"] is True and settings["console_kwargs"] == {"width": 90}


def test_has_trainer_reads_lightning_modules_private_attachment(tmp_path):
    model = _Tiny()
    assert not has_trainer(model), "LightningModule._trainer/_fabric/_jit_is_scripting changed (has_trainer)"
    with pytest.raises(RuntimeError):
        _ = L.LightningModule.trainer.fget(model)  # type: ignore[attr-defined]
    trainer = _trainer(tmp_path, logger=False)
    trainer.fit(model, _loader())
    assert has_trainer(model) and model.trainer is trainer


def test_datamodule_is_attached_before_the_fit_loop_reads_max_epochs(tmp_path):
    """FederatedDataModule's ``trainer`` setter sets the rounds: Lightning must assign it before the loop starts."""
    order: list[str] = []

    class Attach(L.LightningDataModule):
        @property
        def trainer(self) -> L.Trainer | None:
            return self.__dict__.get("_t")

        @trainer.setter
        def trainer(self, trainer: L.Trainer | None) -> None:
            self.__dict__["_t"] = trainer
            if trainer is not None:
                order.append("attached")
                trainer.fit_loop.max_epochs = 2

        def train_dataloader(self) -> DataLoader:
            return _loader()

    trainer = _trainer(tmp_path, logger=False, max_epochs=5)
    trainer.fit(_Tiny(), datamodule=Attach())
    assert order and trainer.current_epoch == 2, (
        "Lightning no longer assigns LightningDataModule.trainer before the fit loop reads max_epochs "
        "(FederatedDataModule.trainer's setter)"
    )


class _ManualTiny(_Tiny):
    """``_Tiny`` with manual optimization, as fl_lightning's methods."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


def test_counting_optimizer_steps_advances_global_step(tmp_path):
    class Manual(_ManualTiny):
        """A training batch takes 3 counted steps, none applied."""

        def training_step(self, batch: Any, batch_idx: int) -> None:
            count_optimizer_steps(self.optimizers(), 3)
            before = self.layer.weight.detach().clone()
            self.manual_backward(self.layer(batch[0]).pow(2).mean())
            counted_step(self.optimizers())
            assert not torch.equal(before, self.layer.weight), "counted_step did not step the optimizer"

    trainer = _trainer(tmp_path, logger=False)
    trainer.fit(Manual(), _loader())
    assert trainer.global_step == 2 * 4, (
        "LightningOptimizer._on_before_step/_on_after_step no longer count trainer.global_step (count_optimizer_steps)"
    )


def test_step_only_logged_names_read_the_trainers_results(tmp_path):
    class Logs(_Tiny):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = super().training_step(batch, batch_idx)
            self.log("per_step", loss, on_step=True, on_epoch=False)
            self.log("per_epoch", loss, on_step=False, on_epoch=True)
            return loss

    seen: list[set[str]] = []

    class Read(L.Callback):
        def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            seen.append(step_only_logged_names(trainer))

    _trainer(tmp_path, logger=False, callbacks=[Read()]).fit(Logs(), _loader())
    assert seen == [{"per_step"}], f"trainer._results' metadata changed (step_only_logged_names): {seen}"


def test_checkpoints_within_epochs_reads_model_checkpoints_private_settings():
    from datetime import timedelta

    from lightning.pytorch.callbacks import ModelCheckpoint

    assert not checkpoints_within_epochs(ModelCheckpoint())
    assert not checkpoints_within_epochs(ModelCheckpoint(every_n_epochs=2))
    assert checkpoints_within_epochs(ModelCheckpoint(every_n_train_steps=5))
    assert checkpoints_within_epochs(ModelCheckpoint(train_time_interval=timedelta(minutes=1)))


def test_set_logged_batch_size_weights_an_epoch_mean(tmp_path):
    class Logs(_Tiny):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            for value, size in ((1.0, 1), (4.0, 3)):  # two "local steps" inside one training batch
                set_logged_batch_size(self, size)
                self.log("weighted", value, on_step=False, on_epoch=True)
            return super().training_step(batch, batch_idx)

    trainer = _trainer(tmp_path, logger=False, max_epochs=1)
    trainer.fit(Logs(), DataLoader(TensorDataset(torch.randn(2, 2)), batch_size=2))
    assert float(trainer.callback_metrics["weighted"]) == pytest.approx((1.0 * 1 + 4.0 * 3) / 4), (
        "trainer._results.batch_size no longer weights self.log(on_epoch=True) (set_logged_batch_size)"
    )


def test_scheduler_monitors_survive_manual_optimization(tmp_path):
    class Manual(_ManualTiny):
        def training_step(self, batch: Any, batch_idx: int) -> None:
            return None

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "m", "strict": False}}

    seen: list[tuple[Any, ...]] = []

    class Read(L.Callback):
        def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            restore_scheduler_monitors(trainer, found)
            config = trainer.lr_scheduler_configs[0]
            seen.append((config.monitor, config.strict, config.reduce_on_plateau))

    module = Manual()
    found = keep_scheduler_monitors(module)
    _trainer(tmp_path, logger=False, callbacks=[Read()]).fit(module, _loader())
    assert seen == [("m", False, True)], f"Lightning's manual-optimization scheduler configs changed: {seen}"
    assert "configure_optimizers" not in vars(module)  # the wrapper removed itself


def test_the_process_group_timeout_is_the_ddp_strategys_own() -> None:
    """``DDPStrategy._timeout`` is what Lightning passes to ``init_process_group``; one given to the strategy stays."""
    from datetime import timedelta

    from lightning.pytorch.strategies import DDPStrategy

    from fl_lightning import Federation

    trainer = L.Trainer(accelerator="cpu", devices=1, strategy=DDPStrategy(), logger=False)
    assert set_process_group_timeout(trainer, Federation().process_timeout or 0) is True
    assert trainer.strategy._timeout == timedelta(seconds=300)
    own = L.Trainer(accelerator="cpu", devices=1, strategy=DDPStrategy(timeout=timedelta(seconds=7)), logger=False)
    assert set_process_group_timeout(own, 60) is False and own.strategy._timeout == timedelta(seconds=7)
    single = L.Trainer(accelerator="cpu", devices=1, logger=False)
    assert set_process_group_timeout(single, 60) is False  # one process: no group

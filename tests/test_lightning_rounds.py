"""Lightning's own tools next to Federation (issue: "Lightning's own tools work next to Federation"), engine side.

LR schedulers set the LR of a round; validation, checkpoint monitoring and early stopping see the round's global
model and every key a run logs; weight averaging is refused; one checkpoint file; Lightning's logged keys use the
round as their step. (The model's use after fit, typing and quiet output: tests/test_lightning_contract.py.)
"""

from __future__ import annotations

import csv

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import bare_trainer, read_metrics, read_summary
from lightning.pytorch.callbacks import (
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    StochasticWeightAveraging,
    Timer,
)
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.trainer.states import RunningStage

from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.core.evaluation import evaluate
from fl_lightning.core.run_lock import RunDirError
from fl_lightning.core.rundir import rounds_done


def _dm(**kwargs):
    args = {"num_clients": 3, "partition": "iid", "batch_size": 64, "holdout_per_class": 5, **kwargs}
    return FederatedDataModule("digits", **args)


def _model(cls=FedAvg, **kwargs):
    L.seed_everything(0, verbose=False)
    return cls(net="lenet", num_classes=10, in_channels=1, image_size=8, lr=0.1, **kwargs)


class _StepLR(FedAvg):
    """FedAvg whose configure_optimizers returns a StepLR; records the LR each client trained with."""

    interval = "epoch"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.used: dict[tuple[int, int], float] = {}

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": self.interval}}

    def client_loss(self, x, y):
        self.used[(self.client.round, self.client.client)] = self.optimizers().param_groups[0]["lr"]
        return super().client_loss(x, y)


class _PlainStepLR(L.LightningModule):
    """An ordinary LightningModule (automatic optimization) with a per-epoch StepLR."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
        self.used: list[tuple[int, float]] = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        self.used.append((self.current_epoch, self.optimizers().param_groups[0]["lr"]))
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]


# ---- LR schedulers ----------------------------------------------------------------------------------------------


def test_an_epoch_scheduler_sets_the_lr_of_every_client_of_a_round(tmp_path):
    model = _model(_StepLR)
    bare_trainer(tmp_path, Federation(rounds=3)).fit(model, datamodule=_dm())
    for (round_idx, _), lr in model.used.items():
        assert lr == pytest.approx(0.1 * 0.5**round_idx), (round_idx, lr)
    assert {r for r, _ in model.used} == {0, 1, 2}
    logged = [float(row["lr"]) for row in read_metrics(tmp_path)]
    assert logged == pytest.approx([0.1, 0.05, 0.025])  # the LR the round trained with


def test_a_plain_modules_epoch_scheduler_steps_once_per_round(tmp_path):
    model = _PlainStepLR()
    bare_trainer(tmp_path, Federation(rounds=3)).fit(model, datamodule=_dm())
    by_round = {}
    for round_idx, lr in model.used:
        by_round.setdefault(round_idx, set()).add(lr)
    assert by_round == {0: {0.1}, 1: {0.05}, 2: {0.025}}
    assert [float(row["lr"]) for row in read_metrics(tmp_path)] == pytest.approx([0.1, 0.05, 0.025])


def test_a_step_interval_scheduler_is_refused(tmp_path):
    model = _model(_StepLR)
    model.interval = "step"
    with pytest.raises(ValueError, match="interval 'epoch'"):
        bare_trainer(tmp_path, Federation(rounds=2)).fit(model, datamodule=_dm())
    assert not (tmp_path / "summary.json").exists()


def test_a_scheduler_and_lr_decay_together_are_refused(tmp_path):
    with pytest.raises(ValueError, match="use one"):
        bare_trainer(tmp_path, Federation(rounds=2, lr_decay=0.9)).fit(_model(_StepLR), datamodule=_dm())


def test_a_scheduled_run_resumes_exactly(tmp_path):
    bare_trainer(tmp_path / "full", Federation(rounds=3), enable_checkpointing=True).fit(
        _model(_StepLR), datamodule=_dm()
    )
    bare_trainer(tmp_path / "cut", Federation(rounds=2), enable_checkpointing=True).fit(
        _model(_StepLR), datamodule=_dm()
    )
    resumed = _model(_StepLR)
    bare_trainer(tmp_path / "cut", Federation(rounds=3), enable_checkpointing=True).fit(
        resumed, datamodule=_dm(), ckpt_path="last"
    )
    assert {r: lr for (r, _), lr in resumed.used.items()} == {2: pytest.approx(0.025)}
    full, cut = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")
    for key in ("global_acc", "global_loss", "train_loss", "lr"):
        assert [row[key] for row in full] == [row[key] for row in cut], key


# ---- validation and monitoring ----------------------------------------------------------------------------------


class _Validated(FedAvg):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), reduce_fx="mean", batch_size=len(y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), batch_size=len(y))


def test_validation_sees_the_global_model_of_the_round(tmp_path):
    dm, model = _dm(), _model(_Validated)
    trainer = bare_trainer(tmp_path, Federation(rounds=2), num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm)
    expected = evaluate(model, [(dm.aux_x, dm.aux_y)], 10, transform=lambda x: dm.transform(x, False))
    assert float(trainer.callback_metrics["val_acc"]) == pytest.approx(expected.acc, abs=1e-6)
    assert float(trainer.callback_metrics["val_loss"]) == pytest.approx(expected.loss, rel=1e-5)
    rows = read_metrics(tmp_path)
    assert float(rows[-1]["val_acc"]) == pytest.approx(expected.acc, abs=1e-6)  # recorded with its own round


def test_a_round_without_validation_records_no_validation_metrics(tmp_path):
    """Validation every second round: the rounds between leave its columns empty, not the last round's values."""
    trainer = bare_trainer(tmp_path, Federation(rounds=4), num_sanity_val_steps=0, check_val_every_n_epoch=2)
    trainer.fit(_model(_Validated), datamodule=_dm())
    rows = read_metrics(tmp_path)
    assert [row["val_acc"] != "" for row in rows] == [False, True, False, True]
    assert rows[2]["val_loss"] == "" and rows[3]["val_loss"] != ""


def test_a_users_validation_split_is_validated(tmp_path):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8)
    y = torch.tensor(y)
    val = (x[1500:1600], y[1500:1600])
    dm = FederatedDataModule.from_tensors(
        x[:1200], y[:1200], x[1200:1500], y[1200:1500], val=val, num_clients=3, partition="iid", batch_size=64
    )
    model = _model(_Validated)
    trainer = bare_trainer(tmp_path, Federation(rounds=2), num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm)
    expected = evaluate(model, [val], 10, transform=lambda t: dm.transform(t, False))
    assert float(trainer.callback_metrics["val_acc"]) == pytest.approx(expected.acc, abs=1e-6)


def test_a_best_checkpoint_holds_the_weights_that_scored_it(tmp_path):
    dm, model = _dm(), _model(_Validated)
    best = ModelCheckpoint(dirpath=tmp_path / "best", monitor="val_acc", mode="max", save_top_k=1)
    trainer = bare_trainer(tmp_path, Federation(rounds=4), best, enable_checkpointing=True, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm)
    reloaded = _Validated.load_from_checkpoint(best.best_model_path)
    score = evaluate(reloaded, [(dm.aux_x, dm.aux_y)], 10, transform=lambda x: dm.transform(x, False))
    assert score.acc == pytest.approx(float(best.best_model_score), abs=1e-6)


def test_every_logged_key_can_be_monitored(tmp_path):
    """One checkpoint callback per key, in one fit: each keeps its key's best round."""
    columns = {
        "global/acc": "global_acc",
        "global_acc": "global_acc",
        "global/loss": "global_loss",
        "train/loss": "train_loss",
        "global/acc_best": "best_acc",
    }
    modes = {key: "min" if "loss" in key else "max" for key in columns}
    best = {
        key: ModelCheckpoint(dirpath=tmp_path / f"best{i}", monitor=key, mode=modes[key], save_top_k=1)
        for i, key in enumerate(columns)
    }
    trainer = bare_trainer(tmp_path, Federation(rounds=2), *best.values(), enable_checkpointing=True)
    trainer.fit(_model(), datamodule=_dm())
    rows = read_metrics(tmp_path)
    for key, column in columns.items():
        values = [float(row[column]) for row in rows]
        expected = min(values) if modes[key] == "min" else max(values)
        assert float(best[key].best_model_score) == pytest.approx(expected), key


def test_early_stopping_ends_the_run_completed(tmp_path):
    stop = EarlyStopping(monitor="global/acc", mode="max", patience=0, min_delta=0.5)
    trainer = bare_trainer(tmp_path, Federation(rounds=6), stop)
    trainer.fit(_model(), datamodule=_dm())
    summary = read_summary(tmp_path)
    assert summary["status"] == "completed"
    assert summary["stopped_early_round"] == summary["rounds_done"] == 2 < summary["rounds"]
    assert len(read_metrics(tmp_path)) == 2


class _StopAfter(L.Callback):
    """Asks the Trainer to stop after the second training batch (the second client) of the second round."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch == 1 and batch_idx == 1:
            trainer.should_stop = True


class _SlowTimer(Timer):
    """Lightning's ``max_time`` Timer whose time runs out after the fourth training batch (mid-round 2 of 3 clients)."""

    batches = 0

    def on_train_batch_end(self, trainer, *args, **kwargs):
        self.batches += 1
        super().on_train_batch_end(trainer, *args, **kwargs)

    def time_elapsed(self, stage=RunningStage.TRAINING):
        return 1e9 if self.batches >= 4 else 0.0


@pytest.mark.parametrize(
    ("stopper", "timer_lines"),
    [(_StopAfter, 0), (lambda: _SlowTimer(duration={"hours": 1}), 1)],  # the Timer's line once, not every batch
    ids=["callback", "timer"],
)
def test_a_stop_asked_for_mid_round_waits_for_the_round_to_end(tmp_path, stopper, timer_lines, caplog):
    """Before: the fit ended after some of the round's clients, its checkpoint held one client's local weights as
    the round done, the resume skipped the round and the summary said it completed."""
    fed = Federation(rounds=3, plots=False)
    trainer = bare_trainer(tmp_path, fed, stopper(), ModelCheckpoint(save_last=True), enable_checkpointing=True)
    model = _model()
    with caplog.at_level("INFO"):
        trainer.fit(model, datamodule=_dm())
    assert caplog.text.count("round 2: stop asked for mid-round; the round finishes first") == 1
    assert caplog.text.count("Time limit reached.") == timer_lines
    rows = read_metrics(tmp_path)
    assert [int(r["round"]) for r in rows] == [1, 2]
    summary = read_summary(tmp_path)
    assert summary["status"] == "completed" and summary["rounds_done"] == summary["stopped_early_round"] == 2
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["epoch"] == 1  # the checkpoint of round 2, which ran whole
    # the checkpoint's weights are the global model of round 2: its accuracy is the one recorded
    model.load_state_dict(saved["state_dict"])
    assert fed.evaluate(model).acc == pytest.approx(float(rows[-1]["global_acc"]))


class _StopsItself(FedAvg):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.trainer.current_epoch == 1 and batch_idx == 0:
            self.trainer.should_stop = True


class _Validations(L.Callback):
    """The rounds (epochs) whose validation ran."""

    def __init__(self):
        self.epochs = []

    def on_validation_end(self, trainer, pl_module):
        self.epochs.append(trainer.current_epoch)


def test_a_module_that_stops_mid_round_fails_the_fit_before_its_checkpoint(tmp_path):
    # Before, in this fit that validates (FedAvg on the holdout), round 2 was validated first: one client's weights.
    validations = _Validations()
    fed = Federation(rounds=3, plots=False)
    trainer = bare_trainer(tmp_path, fed, validations, ModelCheckpoint(), enable_checkpointing=True)
    with pytest.raises(RuntimeError, match=r"the fit stopped in the middle of round 2: the module set"):
        trainer.fit(_model(_StopsItself), datamodule=_dm())
    assert validations.epochs == [0, 0]  # the sanity check and round 1
    assert read_summary(tmp_path)["status"] == "failed"
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["epoch"] == 0  # round 1's
    # the failed fit's half round is not held against a validate on this Trainer (before, it refused to run)
    trainer.validate(_model(), datamodule=_dm())
    assert len(validations.epochs) == 3


def test_resuming_an_early_stopped_run_with_its_rounds_is_refused(tmp_path):
    stop = EarlyStopping(monitor="global/acc", mode="max", patience=0, min_delta=0.5)
    bare_trainer(tmp_path, Federation(rounds=4, plots=False), stop, enable_checkpointing=True).fit(
        _model(), datamodule=_dm()
    )
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    again = bare_trainer(tmp_path, Federation(rounds=4, plots=False), enable_checkpointing=True)
    with pytest.raises(RunDirError, match=r"holds a completed run of 4 rounds, stopped early after round 2; there is"):
        again.fit(_model(), datamodule=_dm(), ckpt_path="last")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    # more rounds than it was run with extend it
    bare_trainer(tmp_path, Federation(rounds=5, plots=False), enable_checkpointing=True).fit(
        _model(), datamodule=_dm(), ckpt_path="last"
    )
    assert read_summary(tmp_path)["rounds_done"] == 5


def test_resuming_a_completed_run_from_python_is_refused_unless_a_file_is_missing(tmp_path):
    # Before, trainer.fit(..., ckpt_path="last") on a completed run rewrote its summary.json, metrics.csv and plots.
    bare_trainer(tmp_path, Federation(rounds=2), enable_checkpointing=True).fit(_model(), datamodule=_dm())
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    again = bare_trainer(tmp_path, Federation(rounds=2), enable_checkpointing=True)
    with pytest.raises(RunDirError, match=r"holds a completed run of 2 rounds; there is nothing to resume \(raise"):
        again.fit(_model(), datamodule=_dm(), ckpt_path="last")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    (tmp_path / "curve.png").unlink()  # a fault during the final writes: the resume completes the record
    bare_trainer(tmp_path, Federation(rounds=2), enable_checkpointing=True).fit(
        _model(), datamodule=_dm(), ckpt_path="last"
    )
    assert (tmp_path / "curve.png").exists() and read_summary(tmp_path)["status"] == "completed"
    assert (tmp_path / "metrics.csv").read_bytes() == before["metrics.csv"]


class _Plateau(FedAvg):
    """FedAvg with a ReduceLROnPlateau on ``global/loss`` in ``mode="max"``: a falling test loss halves the LR."""

    def __init__(self, strict: bool = True, monitor: str | None = "global/loss", **kwargs):
        super().__init__(**kwargs)
        self.strict, self.monitor = strict, monitor

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", patience=0, factor=0.5)
        config = {"scheduler": plateau, "strict": self.strict}
        if self.monitor is not None:
            config["monitor"] = self.monitor
        return {"optimizer": opt, "lr_scheduler": config}


def test_a_methods_reduce_lr_on_plateau_steps_on_its_monitored_key(tmp_path):
    """Before: ``ReduceLROnPlateau.step() missing 1 required positional argument: 'metrics'`` at the first round's end
    (Lightning drops a manual-optimization module's ``monitor``)."""
    bare_trainer(tmp_path, Federation(rounds=4, plots=False)).fit(_model(_Plateau), datamodule=_dm())
    rows = read_metrics(tmp_path)
    losses = [float(r["global_loss"]) for r in rows]
    assert losses == sorted(losses, reverse=True)  # fell every round: worse every time in mode "max"
    # the first round's loss is the best so far; each later one is worse, and halves the next round's LR
    assert [float(r["lr"]) for r in rows] == [0.1, 0.1, 0.05, 0.025]


def test_reduce_lr_on_plateau_without_a_monitor_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau needs the key it monitors: return \{'scheduler'"):
        bare_trainer(tmp_path, Federation(rounds=2, plots=False)).fit(_model(_Plateau, monitor=None), datamodule=_dm())


def test_watchers_of_round_metrics_with_eval_every_say_how_to_wait_for_evaluations(tmp_path):
    """Before: each raised at the end of round 1, which has no evaluation with ``eval_every=2``."""
    cases = [
        (_model(_Plateau), [], {}, r"ReduceLROnPlateau monitors 'global/loss', a key measured only every 2 rounds"),
        (_model(), [EarlyStopping(monitor="global/acc")], {}, r"pass strict=False \(it then skips the rounds"),
        (
            _model(),
            [ModelCheckpoint(monitor="global/acc", dirpath=tmp_path / "best")],
            {"holdout_per_class": 5},  # validation runs (FedAvg validates on the holdout)
            r"ModelCheckpoint\(monitor='global/acc'\) watches a key measured only every 2 rounds \(eval_every=2\); "
            r"pass every_n_epochs=2",
        ),
    ]
    for i, (model, callbacks, data, message) in enumerate(cases):
        fed = Federation(rounds=4, eval_every=2, plots=False)
        trainer = bare_trainer(tmp_path / str(i), fed, *callbacks, enable_checkpointing=True)
        with pytest.raises(ValueError, match=message):
            trainer.fit(model, datamodule=_dm(**data))


def test_with_eval_every_a_plateau_and_early_stopping_see_only_evaluated_rounds(tmp_path, recwarn):
    """With ``strict: False`` they wait for the evaluated rounds; before, the last evaluation's values stayed in the
    callback metrics, so that a round without one counted as no improvement (and stepped the plateau)."""
    stop = EarlyStopping(monitor="global/loss", mode="min", patience=0, strict=False)
    fed = Federation(rounds=6, eval_every=2, plots=False)
    bare_trainer(tmp_path, fed, stop).fit(_model(_Plateau, strict=False), datamodule=_dm())
    rows = read_metrics(tmp_path)
    assert [int(r["round"]) for r in rows] == [2, 4, 6]  # the test loss falls every evaluation: never stopped
    # stepped after rounds 2 (the best so far) and 4 (worse) only: a step on round 3 would have halved round 4's LR
    assert [float(r["lr"]) for r in rows] == [0.1, 0.1, 0.05]


def test_a_stop_after_a_round_without_evaluation_evaluates_it(tmp_path):
    """A run's last round is always evaluated, also when ``max_time`` ends the run after one that was not."""
    timer = _SlowTimer(duration={"hours": 1})
    timer.batches = -4  # its time runs out after the 8th batch: the end of round 3 of 3 clients
    fed = Federation(rounds=4, eval_every=2, plots=False)
    trainer = bare_trainer(tmp_path, fed, timer, ModelCheckpoint(save_last=True), enable_checkpointing=True)
    trainer.fit(_model(), datamodule=_dm())
    assert [int(r["round"]) for r in read_metrics(tmp_path)] == [2, 3]
    summary = read_summary(tmp_path)
    assert summary["status"] == "completed" and summary["rounds_done"] == summary["stopped_early_round"] == 3
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["epoch"] == 2 and rounds_done(saved) == 3


class _StopsAtEpochEnd(FedAvg):
    """Stops the fit from its own ``on_train_epoch_end`` (after the callbacks') at the end of round ``at``."""

    at = 3

    def on_train_epoch_end(self):
        if self.trainer.current_epoch + 1 == self.at:
            self.trainer.should_stop = True


def test_a_stop_by_the_module_at_a_rounds_end_is_in_its_checkpoint(tmp_path):
    """The late evaluation of a stopped run's last round reaches the checkpoint saved after the module's hook."""
    fed = Federation(rounds=6, eval_every=2, plots=False)
    trainer = bare_trainer(tmp_path, fed, ModelCheckpoint(save_last=True), enable_checkpointing=True)
    trainer.fit(_model(_StopsAtEpochEnd), datamodule=_dm())
    assert [int(r["round"]) for r in read_metrics(tmp_path)] == [2, 3]
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["epoch"] == 2 and rounds_done(saved) == 3


class _StopCallbackOfTheModel(FedAvg):
    """A module whose ``configure_callbacks`` adds a callback that stops mid-round (Lightning adds it last)."""

    def configure_callbacks(self):
        return [_StopAfter()]


def test_a_stop_by_a_callback_of_the_module_waits_for_the_round_to_end(tmp_path):
    bare_trainer(tmp_path, Federation(rounds=3, plots=False)).fit(_model(_StopCallbackOfTheModel), datamodule=_dm())
    assert [int(r["round"]) for r in read_metrics(tmp_path)] == [1, 2]
    assert read_summary(tmp_path)["stopped_early_round"] == 2


class _StopAtOnce(L.Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        trainer.should_stop = True


def test_a_stop_held_by_min_epochs_neither_repeats_nor_evaluates_each_round(tmp_path, caplog):
    """Lightning keeps ``should_stop`` set while ``min_epochs`` holds the fit: no round is deferred or evaluated
    for it until the fit can stop (round 5), whose round is then evaluated."""
    fed = Federation(rounds=6, eval_every=2, plots=False)
    with caplog.at_level("INFO"):
        bare_trainer(tmp_path, fed, _StopAtOnce(), min_epochs=5).fit(_model(), datamodule=_dm())
    assert [int(r["round"]) for r in read_metrics(tmp_path)] == [2, 4, 5]
    assert "stop asked for mid-round" not in caplog.text


def test_whole_rounds_goes_after_the_other_callbacks_in_a_new_list():
    """Placed before the checkpoints, in a list the Trainer gets anew: Lightning may be going down the old one."""
    from lightning.pytorch.callbacks import Callback

    from fl_lightning.whole_rounds import WholeRounds, place_whole_rounds

    class Holder:
        callbacks: list

    fed, other, ckpt = Federation(rounds=2), Callback(), ModelCheckpoint()
    trainer = Holder()
    trainer.callbacks = [fed, other, ckpt]
    place_whole_rounds(trainer, fed)
    assert [type(c) for c in trainer.callbacks] == [Federation, Callback, WholeRounds, ModelCheckpoint]
    ours = trainer.callbacks[2]
    for order in ([fed, ours, other, ckpt], [ours, fed, other, ckpt]):  # the module's callbacks; a second fit's
        trainer.callbacks = old = list(order)
        place_whole_rounds(trainer, fed)
        assert trainer.callbacks == [fed, other, ours, ckpt] and old == order
    placed = trainer.callbacks
    place_whole_rounds(trainer, fed)
    assert trainer.callbacks is placed  # nothing to move: the same list


class _FederationOfTheModel(FedAvg):
    """A module whose ``configure_callbacks`` returns its federation and a callback that stops mid-round."""

    def __init__(self, federation: Federation, **kwargs):
        super().__init__(**kwargs)
        self.federation = federation

    def configure_callbacks(self):
        return [self.federation, _StopAfter()]


def test_a_stop_mid_round_waits_in_a_fit_after_a_validate_with_the_modules_federation(tmp_path):
    # Before: the validate left WholeRounds before the federation, the fit's stop was not held, and the fit failed
    # saying that the module had stopped in the middle of round 2.
    L.seed_everything(0, verbose=False)
    model = _FederationOfTheModel(
        Federation(rounds=3, plots=False), net="lenet", num_classes=10, in_channels=1, image_size=8, lr=0.1
    )
    trainer, dm = bare_trainer(tmp_path), _dm()
    trainer.validate(model, datamodule=dm)
    trainer.fit(model, datamodule=dm)
    assert [int(r["round"]) for r in read_metrics(tmp_path)] == [1, 2]
    assert read_summary(tmp_path)["stopped_early_round"] == 2


# ---- other callbacks, checkpoints, logger steps -------------------------------------------------------------------


def test_weight_averaging_is_refused_before_anything_is_written(tmp_path):
    swa = StochasticWeightAveraging(swa_lrs=0.01)
    with pytest.raises(ValueError, match="StochasticWeightAveraging is not supported"):
        bare_trainer(tmp_path, Federation(rounds=2), swa).fit(_model(), datamodule=_dm())
    assert not (tmp_path / "summary.json").exists()


def test_a_checkpoint_within_a_round_is_refused_before_anything_is_written(tmp_path):
    """Saved by local steps, a checkpoint falls mid-round (and under DDP, whose processes' steps differ, it hangs)."""
    mine = ModelCheckpoint(every_n_train_steps=24)
    with pytest.raises(ValueError, match="every_n_train_steps or train_time_interval would save in the middle of a"):
        bare_trainer(tmp_path, Federation(rounds=2), mine, enable_checkpointing=True).fit(_model(), datamodule=_dm())
    assert not (tmp_path / "summary.json").exists()


def test_a_run_writes_one_checkpoint_file(tmp_path):
    L.Trainer(
        callbacks=[Federation(rounds=2)],
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        accelerator="cpu",
    ).fit(_model(), datamodule=_dm())
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.ckpt"]


def test_a_users_own_checkpoint_callback_is_kept(tmp_path):
    mine = ModelCheckpoint(dirpath=tmp_path / "mine", monitor="global/acc", mode="max", save_top_k=2)
    bare_trainer(tmp_path, Federation(rounds=3), mine, enable_checkpointing=True).fit(_model(), datamodule=_dm())
    assert len(list((tmp_path / "mine").glob("*.ckpt"))) == 2
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()  # the run's own, beside the user's


def test_a_users_save_last_false_in_the_run_directory_is_kept(tmp_path):
    mine = ModelCheckpoint(monitor="global/acc", mode="max", save_last=False)
    trainer = bare_trainer(tmp_path, Federation(rounds=2), mine, enable_checkpointing=True)
    trainer.fit(_model(), datamodule=_dm())
    assert trainer.checkpoint_callbacks == [mine] and mine.save_last is False
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()


def test_a_users_checkpoint_elsewhere_still_leaves_last_to_resume_from(tmp_path):
    mine = ModelCheckpoint(dirpath=tmp_path / "mine", monitor="global/acc", mode="max")
    bare_trainer(tmp_path, Federation(rounds=2), mine, enable_checkpointing=True).fit(_model(), datamodule=_dm())
    mine = ModelCheckpoint(dirpath=tmp_path / "mine", monitor="global/acc", mode="max")
    trainer = bare_trainer(tmp_path, Federation(rounds=3), mine, enable_checkpointing=True)
    trainer.fit(_model(), datamodule=_dm(), ckpt_path="last")
    assert [int(row["round"]) for row in read_metrics(tmp_path)] == [1, 2, 3]
    assert sum(isinstance(c, ModelCheckpoint) for c in trainer.callbacks) == 2


@pytest.mark.parametrize("damage", ["cut", "random"])
def test_a_python_fit_refuses_a_damaged_checkpoint_in_one_line(tmp_path, damage):
    bare_trainer(tmp_path, Federation(rounds=2), enable_checkpointing=True).fit(_model(), datamodule=_dm())
    last = tmp_path / "checkpoints" / "last.ckpt"
    data = last.read_bytes()
    last.write_bytes(data[:20000] if damage == "cut" else bytes(range(256)) * 40)
    before = (tmp_path / "metrics.csv").read_bytes()
    trainer = bare_trainer(tmp_path, Federation(rounds=3), enable_checkpointing=True)
    with pytest.raises(ValueError, match=f"checkpoint {last}.*(cut short|no PyTorch checkpoint)") as err:
        trainer.fit(_model(), datamodule=_dm(), ckpt_path="last")
    assert "\n" not in str(err.value)
    assert (tmp_path / "metrics.csv").read_bytes() == before


def test_a_checkpoint_saved_on_a_gpu_resumes_on_the_cpu(tmp_path, monkeypatch):
    """The checked checkpoint IO keeps Lightning's default of loading onto the CPU (map_location)."""
    import torch.serialization

    bare_trainer(tmp_path / "run", Federation(rounds=1), enable_checkpointing=True).fit(_model(), datamodule=_dm())
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    with monkeypatch.context() as patch:  # torch records each storage's device: say cuda:0, as a GPU run's would
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(ckpt, tmp_path / "gpu.ckpt")
    trainer = bare_trainer(tmp_path / "run", Federation(rounds=2), enable_checkpointing=True)
    trainer.fit(_model(), datamodule=_dm(), ckpt_path=str(tmp_path / "gpu.ckpt"))
    assert [int(row["round"]) for row in read_metrics(tmp_path / "run")] == [1, 2]


def test_lightnings_logged_keys_use_the_round_as_step(tmp_path):
    logger = CSVLogger(tmp_path / "csv", name="", version="")
    bare_trainer(tmp_path, Federation(rounds=3), logger=logger, num_sanity_val_steps=0).fit(
        _model(_Validated), datamodule=_dm()
    )
    with open(tmp_path / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    val_steps = [int(row["step"]) for row in rows if row.get("val_acc")]
    fl_steps = [int(row["step"]) for row in rows if row.get("global/acc")]
    assert val_steps == fl_steps == [1, 2, 3]


class _EpochEndLogs(FedAvg):
    """Logs in its own ``on_train_epoch_end``: ``round_seen`` every round, ``even_only`` every second round; and
    ``third_start`` as the third round starts (its server start)."""

    def on_round_start(self, server):
        if self.current_epoch == 2:
            self.log("third_start", 3.0)
        return super().on_round_start(server)

    def on_train_epoch_end(self):
        self.log("round_seen", float(self.current_epoch + 1))
        if self.current_epoch % 2 == 1:
            self.log("even_only", 10.0 * (self.current_epoch + 1))


@pytest.mark.parametrize("checkpointing", [True, False])
def test_what_a_module_logs_in_its_own_epoch_end_joins_its_rounds_row(tmp_path, checkpointing):
    """Lightning calls the module's on_train_epoch_end after the callback's: its values still join that round's row."""
    fed = Federation(rounds=4)
    bare_trainer(tmp_path, fed, enable_checkpointing=checkpointing).fit(_model(_EpochEndLogs), datamodule=_dm())
    rows = read_metrics(tmp_path)
    assert [float(row["round_seen"]) for row in rows] == [1.0, 2.0, 3.0, 4.0]
    assert [row["even_only"] for row in rows] == ["", "20.0", "", "40.0"]
    assert [row["third_start"] for row in rows] == ["", "", "3.0", ""]  # the next round's, not the last row's
    assert [row.get("round_seen") for row in fed.history] == [1.0, 2.0, 3.0, 4.0]


def test_a_run_that_diverges_keeps_what_the_module_logged_in_its_last_rounds_epoch_end(tmp_path, monkeypatch):
    from fl_lightning.recorder import RunRecorder

    monkeypatch.setattr(RunRecorder, "divergence", lambda self, *_: (2, "told to") if len(self.history) == 2 else None)
    fed = Federation(rounds=4)
    bare_trainer(tmp_path, fed, enable_checkpointing=True).fit(_model(_EpochEndLogs), datamodule=_dm())
    assert fed.status == "diverged"
    assert [row["round_seen"] for row in read_metrics(tmp_path)] == ["1.0", "2.0"]


def test_a_resumed_run_keeps_what_the_module_logged_in_its_own_epoch_end(tmp_path):
    bare_trainer(tmp_path, Federation(rounds=2), enable_checkpointing=True).fit(_model(_EpochEndLogs), datamodule=_dm())
    trainer = bare_trainer(tmp_path, Federation(rounds=3), enable_checkpointing=True)
    trainer.fit(_model(_EpochEndLogs), datamodule=_dm(), ckpt_path="last")
    rows = read_metrics(tmp_path)
    assert [row["round_seen"] for row in rows] == ["1.0", "2.0", "3.0"]
    assert [row["even_only"] for row in rows] == ["", "20.0", ""]


# ---- the same safety in Python as on the command line -------------------------------------------------------------


def test_a_second_python_fit_into_a_finished_run_is_refused(tmp_path):
    def fit(**kwargs):
        trainer = L.Trainer(
            callbacks=[Federation(rounds=2)], default_root_dir=tmp_path, logger=False, enable_progress_bar=False
        )
        trainer.fit(_model(), datamodule=_dm(), **kwargs)

    fit()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    with pytest.raises(ValueError, match="already holds a completed run"):
        fit()
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert after == before  # summary.json, metrics.csv, ... untouched
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ckpts == ["last.ckpt"]


@pytest.mark.parametrize(
    ("option", "match"),
    [({"fast_dev_run": True}, "fast_dev_run"), ({"max_steps": 5}, "max_steps"), ({"max_epochs": 7}, "max_epochs=7")],
)
def test_python_options_that_cut_rounds_are_refused_before_anything_is_written(tmp_path, option, match):
    with pytest.raises(ValueError, match=match):
        bare_trainer(tmp_path, Federation(rounds=2), **option).fit(_model(), datamodule=_dm())
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "checkpoints").exists()


def test_learning_rate_monitor_logs_the_lr_of_each_round(tmp_path):
    logger = CSVLogger(tmp_path / "csv", name="", version="")
    monitor = LearningRateMonitor(logging_interval="epoch")
    bare_trainer(tmp_path, Federation(rounds=3), monitor, logger=logger).fit(_model(_StepLR), datamodule=_dm())
    with open(tmp_path / "csv" / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row.get("lr-SGD")]
    assert [(int(row["step"]), float(row["lr-SGD"])) for row in rows] == [(1, 0.1), (2, 0.05), (3, 0.025)]
    with pytest.raises(ValueError, match="logging_interval='epoch'"):
        bare_trainer(tmp_path / "b", Federation(rounds=1), LearningRateMonitor("step")).fit(_model(), datamodule=_dm())


class _LogsPerStep(FedAvg):
    def client_loss(self, x, y):
        loss = super().client_loss(x, y)
        self.log("my/step_loss", loss)  # a training-step metric: Lightning itself would log it every n steps
        return loss


def test_a_methods_step_metric_reaches_the_loggers_once_per_round(tmp_path):
    logger = CSVLogger(tmp_path / "csv", name="", version="")
    bare_trainer(tmp_path, Federation(rounds=3), logger=logger, num_sanity_val_steps=0).fit(
        _model(_LogsPerStep), datamodule=_dm()
    )
    with open(tmp_path / "csv" / "metrics.csv") as f:
        steps = [int(row["step"]) for row in csv.DictReader(f) if row.get("my/step_loss")]
    assert steps == [1, 2, 3]
    assert [float(row["my/step_loss"]) > 0 for row in read_metrics(tmp_path)] == [True] * 3


def test_a_python_fit_may_start_over_a_run_killed_before_its_first_checkpoint(tmp_path):
    # what --ckpt_path last does on the command line: nothing to resume, nothing finished to protect
    (tmp_path / "metrics.csv").write_text("round,global_acc\n1,0.5\n")
    (tmp_path / "summary.json").write_text('{"status": "interrupted", "rounds_done": 1}')
    bare_trainer(tmp_path, Federation(rounds=1)).fit(_model(), datamodule=_dm())
    assert read_summary(tmp_path)["status"] == "completed"

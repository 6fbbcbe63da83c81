"""What a Lightning user importing fl_lightning meets from Python: refusals in one line at start, Lightning's views.

Each case was found by a review as a Python API user; the comment under each test says what happened before.
"""

from __future__ import annotations

import signal

import lightning as L
import numpy as np
import pytest
import torch
from helpers import bare_trainer, read_summary
from lightning.pytorch.callbacks import GradientAccumulationScheduler
from lightning.pytorch.loggers import CSVLogger

from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.methods import FedNTD


def _data() -> FederatedDataModule:
    return FederatedDataModule("digits", num_clients=3, batch_size=64)


def test_lightnings_gradient_clipping_on_a_method_names_the_methods_own(tmp_path):
    # Before: Lightning's "Automatic gradient clipping is not supported for manual optimization. Remove
    # `Trainer(gradient_clip_val=0.5)` or switch to automatic optimization.", which a method's user cannot do.
    trainer = bare_trainer(tmp_path, Federation(rounds=1, plots=False), gradient_clip_val=0.5)
    with pytest.raises(ValueError, match=r"not supported by fedntd, .*clip_grad_norm=0.5"):
        trainer.fit(FedNTD(net="lenet", lr=0.05), datamodule=_data())
    assert not (tmp_path / "summary.json").exists()


def test_lightnings_gradient_clipping_still_serves_a_plain_module(tmp_path):
    class Plain(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    bare_trainer(tmp_path, Federation(rounds=1, plots=False), gradient_clip_val=0.5).fit(Plain(), datamodule=_data())
    assert read_summary(tmp_path)["status"] == "completed"


@pytest.mark.parametrize("module", [FedAvg, "plain"])
def test_a_gradient_accumulation_scheduler_is_refused_before_anything_is_written(tmp_path, module):
    # Before: a plain module trained silently with half the optimizer steps, an accumulated step spanning two clients'
    # batches (accumulate_grad_batches=2 is refused); a method's run failed in its first round with Lightning's
    # "not supported for manual optimization. Please remove the callback or switch to automatic optimization".
    from test_own_module import PlainClassifier

    model = FedAvg(net="lenet", lr=0.05) if module is FedAvg else PlainClassifier()
    trainer = bare_trainer(tmp_path, Federation(rounds=1, plots=False), GradientAccumulationScheduler({0: 2}))
    with pytest.raises(ValueError, match="GradientAccumulationScheduler is not supported with Federation"):
        trainer.fit(model, datamodule=_data())
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        # Before: accepted; the fit failed in Lightning's fit loop with a bare AssertionError.
        ({"rounds": 2.5}, r"^rounds must be an integer, got 2.5$"),
        # Before: TypeError: '>=' not supported between instances of 'str' and 'int'.
        ({"rounds": "3"}, r"^rounds must be an integer, got '3'$"),
        ({"local_epochs": 1.5}, r"^local_epochs must be an integer, got 1.5$"),
        ({"eval_every": 2.0}, r"^eval_every must be an integer, got 2.0$"),
        # Before: accepted; the fit failed in numpy: "expected non-negative integer", "seed must be integer".
        ({"seed": -1}, r"^seed must be an integer of at least 0, got -1$"),
        ({"seed": 1.5}, r"^seed must be an integer of at least 0, got 1.5$"),
    ],
)
def test_federation_counts_and_seed_must_be_integers(options, match):
    with pytest.raises(ValueError, match=match):
        Federation(**options)


def test_integers_of_numpy_are_counts_and_seeds():
    fed = Federation(rounds=np.int64(3), local_epochs=np.int32(2), seed=np.int64(7))
    assert (fed.rounds, fed.local_epochs, fed.seed) == (3, 2, 7)


def test_a_datamodules_seed_must_be_a_non_negative_integer():
    # Before: accepted; the fit failed at the partition in numpy: "expected non-negative integer".
    with pytest.raises(ValueError, match=r"^seed must be an integer of at least 0, got -1$"):
        FederatedDataModule("digits", num_clients=3, seed=-1)


def test_logged_metrics_hold_what_the_loggers_received(tmp_path):
    # Before: trainer.logged_metrics was {} after a fit whose loggers had every round's global/acc, train/loss, ...
    logger = CSVLogger(tmp_path, name="csv")
    trainer = bare_trainer(tmp_path, Federation(rounds=2, plots=False), logger=logger)
    trainer.fit(FedAvg(net="lenet", lr=0.05), datamodule=_data())
    logged = trainer.logged_metrics
    assert float(logged["global/acc"]) == pytest.approx(read_summary(tmp_path)["final_acc"])
    assert {"global/loss", "train/loss", "train/lr", "global/acc_best"} <= set(logged)


def test_a_python_users_quick_run_and_rounds_are_named_as_python_spells_them(tmp_path):
    # Before: "for a quick run use --federation.rounds 1 --data.num_clients 2 (or --federation.sample_ratio ...)" and
    # "leave max_epochs unset or use --federation.rounds": command-line options only, to a user of L.Trainer.
    with pytest.raises(ValueError, match=r"in Python Federation\(rounds=1\) and FederatedDataModule\(\.\.\., num_"):
        bare_trainer(tmp_path, Federation(rounds=1), fast_dev_run=True).fit(FedAvg(net="lenet"), datamodule=_data())
    with pytest.raises(ValueError, match=r"give the rounds to the federation \(Federation\(rounds=\.\.\.\), --fed"):
        bare_trainer(tmp_path, Federation(rounds=1), max_epochs=3).fit(FedAvg(net="lenet"), datamodule=_data())


def test_an_interrupted_python_fit_says_how_python_resumes_it(tmp_path):
    # Before: "run interrupted; resume it with --ckpt_path last (results so far in ...)".
    class CtrlC(L.Callback):
        def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            raise KeyboardInterrupt

    handler = signal.getsignal(signal.SIGINT)  # Lightning ignores SIGINT once it has handled a KeyboardInterrupt
    try:
        trainer = bare_trainer(tmp_path, Federation(rounds=2, plots=False), CtrlC())
        with (
            pytest.warns(UserWarning, match=r"in Python trainer.fit\(\.\.\., ckpt_path='last'\)"),
            pytest.raises(SystemExit),
        ):
            trainer.fit(FedAvg(net="lenet", lr=0.05), datamodule=_data())
    finally:
        signal.signal(signal.SIGINT, handler)
    assert read_summary(tmp_path)["status"] == "interrupted"


def test_validate_without_validation_data_says_so(tmp_path):
    # Before: trainer.validate returned [] without a word (the command line refuses it: "validate has no validation
    # data: give the run's --data.holdout_per_class N ...").
    trainer = bare_trainer(tmp_path)
    model = FedAvg(net="lenet", lr=0.05, num_classes=10, in_channels=1, image_size=8)
    with pytest.warns(UserWarning, match=r"trainer.validate: digits has no validation data, .*holdout_per_class=N"):
        assert trainer.validate(model, datamodule=_data(), verbose=False) == []
    with_holdout = FederatedDataModule("digits", num_clients=3, holdout_per_class=2)
    assert trainer.validate(model, datamodule=with_holdout, verbose=False)[0]["val/acc"] >= 0

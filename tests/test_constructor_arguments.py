"""Bad arguments found by a sweep of the public constructors: refused when built, in one line that names the argument.

Each case was accepted before (a string, a bool, NaN or infinity where a number is wanted, a float where an integer
is, anything truthy where a bool is), or failed later or in a line that named no argument; the comment of each test
says how. The checks are :mod:`fl_lightning.core.messages`' ``require_number``, ``require_integer`` and
``require_bool``.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from helpers import bare_trainer
from lightning.pytorch.callbacks import StochasticWeightAveraging
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.types import LRSchedulerConfig

from fl_lightning import FedAvg, FederatedDataModule, Federation, rules
from fl_lightning import methods as M
from fl_lightning.core.partitions import Dirichlet
from fl_lightning.core.server import FederatedServer
from fl_lightning.core.server_optim import FedAdagrad, FedAdam, FedYogi, ServerSGD

NAN, INF = math.nan, math.inf
SAMPLE_RATIO = "give a fraction of the clients (--federation.sample_ratio, in Python Federation(sample_ratio=...))"


def _refused(build: Any, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as err:
        build(**kwargs)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # Before: TypeError: '<' not supported between instances of 'int' and 'str'.
        ({"sample_ratio": "0.5"}, f"sample_ratio must be a number in (0, 1], got '0.5'; {SAMPLE_RATIO}"),
        # Before: accepted (True is 1).
        ({"sample_ratio": True}, f"sample_ratio must be a number in (0, 1], got True; {SAMPLE_RATIO}"),
        # Before: "...; give a fraction of the clients (--federation.sample_ratio)", the command line's name only.
        ({"sample_ratio": 0}, f"sample_ratio must be in (0, 1], got 0; {SAMPLE_RATIO}"),
        # Before: TypeError: '<' not supported between instances of 'int' and 'NoneType'.
        ({"lr_decay": None}, "lr_decay must be a number in (0, 1], got None"),
        ({"lr_decay": True}, "lr_decay must be a number in (0, 1], got True"),  # before: accepted
        # Before: accepted (float("0.5")).
        ({"server_lr": "0.5"}, "server_lr must be a finite number > 0, got '0.5'"),
        # Before: "ServerSGD: lr must be a finite number > 0, got 0.0", an argument the user did not give.
        ({"server_lr": 0}, "server_lr must be > 0, got 0"),
        ({"server_momentum": False}, "server_momentum must be a number in [0, 1), got False"),  # before: accepted
        # Before: accepted, as falsy and truthy ("no" drew the plots).
        ({"plots": None}, "plots must be True or False, got None"),
        ({"plots": "no"}, "plots must be True or False, got 'no'"),
        ({"eval_local": "yes"}, "eval_local must be True or False, got 'yes'"),
        ({"eval_local": 1}, "eval_local must be True or False, got 1"),
        # Before: TypeError: '>=' not supported between instances of 'str' and 'int'.
        ({"client_state_mb": "100"}, "client_state_mb must be a finite number >= 0 (or None), got '100'"),
        # Before: accepted; the fit failed at its start with "OverflowError: cannot convert float infinity to integer".
        ({"client_state_mb": INF}, "client_state_mb must be a finite number >= 0 (or None), got inf"),
        # Before: accepted (a fractional count of rounds in a row; True for one).
        ({"collapse_rounds": 2.5}, "collapse_rounds must be an integer of at least 1 (or None), got 2.5"),
        ({"collapse_rounds": True}, "collapse_rounds must be an integer of at least 1 (or None), got True"),
        # Before: accepted; a batched fit failed in its first round in itertools ("Stop argument for islice() must be
        # None or an integer").
        ({"group_size": 2.5}, "group_size must be an integer of at least 1 (or None), got 2.5"),
        # Before: TypeError: '>=' not supported between instances of 'str' and 'int'.
        ({"group_size": "4"}, "group_size must be an integer of at least 1 (or None), got '4'"),
        # Before: accepted (an infinite budget; a timeout that a DDP fit's timedelta cannot hold: "cannot convert
        # float infinity to integer").
        ({"memory_budget_gb": INF}, "memory_budget_gb must be a finite number > 0 (or None), got inf"),
        ({"process_timeout": INF}, "process_timeout must be a finite number > 0 (or None), got inf"),
        # Before: TypeError: '>' not supported between instances of 'str' and 'int'.
        ({"process_timeout": "60"}, "process_timeout must be a finite number > 0 (or None), got '60'"),
    ],
    ids=repr,
)
def test_federation(kwargs, message):
    _refused(Federation, kwargs, message)


def test_a_federated_server_takes_a_server_optimizer_or_its_name():
    # Before: accepted; the fit's setup failed with "AttributeError: 'int' object has no attribute 'reset'".
    with pytest.raises(TypeError, match="^server_optimizer must be a ServerOptimizer or its name, got int$"):
        FederatedServer(server_optimizer=5)  # type: ignore[arg-type]
    assert type(FederatedServer(server_optimizer="fedadam").server_optimizer) is FedAdam  # type: ignore[arg-type]


def _digits(**kwargs: Any) -> FederatedDataModule:
    return FederatedDataModule("digits", **{"num_clients": 3, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # Before: accepted; the partition failed later with "num_clients must be an integer, got 2.5".
        ({"num_clients": 2.5}, "num_clients must be an integer of at least 1 (or None), got 2.5"),
        # Before: TypeError: '<' not supported between instances of 'str' and 'int'.
        ({"num_clients": "3"}, "num_clients must be an integer of at least 1 (or None), got '3'"),
        # Before: accepted; the fit failed at its setup or first round with a TypeError from torch ("expected a
        # sequence of integers or a single integer, got 'True'", "'float' object cannot be interpreted as an
        # integer", "randint() received an invalid combination of arguments"); num_workers=1.5 trained as given.
        ({"holdout_per_class": True}, "holdout_per_class must be an integer of at least 0, got True"),
        ({"batch_size": 2.5}, "batch_size must be an integer, got 2.5"),
        ({"crop_padding": 2.5}, "crop_padding must be an integer, got 2.5"),
        ({"num_workers": 1.5}, "num_workers must be an integer of at least 0, got 1.5"),
        # Before: TypeError: '<' not supported between instances of 'str' and 'int' (or 'NoneType' and 'int').
        ({"eval_batch_size": "64"}, "eval_batch_size must be an integer, got '64'"),
        ({"cutout": None}, "cutout must be an integer, got None"),
        # Before: "digits has 10 classes, not num_classes=10".
        ({"num_classes": "10"}, "num_classes must be an integer of at least 1 (or None), got '10'"),
        # Before: accepted, as truthy or falsy ("false" normalised the inputs).
        ({"hflip": "yes"}, "hflip must be True or False, got 'yes'"),
        ({"normalize": "false"}, "normalize must be True or False, got 'false'"),
        ({"drop_last": None}, "drop_last must be True or False, got None"),
        ({"download": 1}, "download must be True or False, got 1"),
        ({"pin_memory": "yes"}, "pin_memory must be True or False, got 'yes'"),
        ({"in_memory": "no"}, "in_memory must be True, False or None, got 'no'"),
        # Before: accepted (float("0.5")).
        (
            {"alpha": "0.5"},
            "the Dirichlet concentration must be a positive number, got alpha='0.5'; give a finite alpha > 0 "
            "(--data.alpha, in Python FederatedDataModule(alpha=...); e.g. 0.5, smaller is more skewed)",
        ),
        # Before: accepted; a dataset that reads files failed at setup: "TypeError: expected str, bytes or
        # os.PathLike object, not int".
        ({"root": 5}, "root must be a folder's path or None, got 5"),
    ],
    ids=repr,
)
def test_federated_datamodule(kwargs, message):
    _refused(_digits, kwargs, message)


def test_federated_datamodule_from_tensors_and_from_datasets_name_their_data_with_a_string():
    # Before: accepted; results recorded the dataset as 5.
    x, y = torch.rand(20, 4), torch.arange(20) % 2
    _refused(FederatedDataModule.from_tensors, {"train_x": x, "train_y": y, "test_x": x, "test_y": y, "name": 5},
             "name must be a non-empty string, got 5")  # fmt: skip
    data = torch.utils.data.TensorDataset(x, y)
    _refused(FederatedDataModule.from_datasets, {"train": data, "test": data, "name": 5},
             "name must be a string or None, got 5")  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": "0.1"}, "lr must be a finite number > 0, got '0.1'"),  # before: TypeError comparing a str
        ({"lr": NAN}, "lr must be a finite number > 0, got nan"),  # before: accepted; the run diverged in round 1
        ({"lr": True}, "lr must be a finite number > 0, got True"),  # before: accepted
        ({"lr": 0}, "lr must be > 0, got 0"),  # before: "lr must be positive, got 0"
        ({"momentum": "0.9"}, "momentum must be a number in [0, 1), got '0.9'"),  # before: TypeError
        ({"momentum": False}, "momentum must be a number in [0, 1), got False"),  # before: accepted
        ({"weight_decay": INF}, "weight_decay must be a finite number >= 0, got inf; give 0 for none"),  # accepted
        # Before: accepted; the run diverged in its first round.
        (
            {"clip_grad_norm": NAN},
            "clip_grad_norm must be a finite number > 0 (or None), got nan; give None for no clipping",
        ),
        ({"step_hooks": "yes"}, "step_hooks must be True or False, got 'yes'"),  # before: accepted
        # Before: accepted; refused only at fit start ("the model predicts 0 classes but digits has 10"), or with
        # all three given torch's "in_channels must be divisible by groups" while building the network.
        ({"num_classes": 0}, "num_classes must be an integer of at least 1 (or None), got 0"),
        ({"num_classes": "10"}, "num_classes must be an integer of at least 1 (or None), got '10'"),
        ({"in_channels": 2.5}, "in_channels must be an integer of at least 1 (or None), got 2.5"),
        ({"image_size": (8, 0)}, "image_size[1] must be an integer of at least 1, got 0"),
        ({"image_size": "8"}, "image_size must be an integer of at least 1 (or None), got '8'"),
    ],
    ids=repr,
)
def test_fedavg(kwargs, message):
    _refused(FedAvg, kwargs, message)


@pytest.mark.parametrize(
    ("method", "kwargs", "message"),
    [
        # Before: accepted (NaN or infinity compares False; True is 1), or a TypeError comparing a str; a float
        # count failed in the first round ("slice indices must be integers", MOON's head: "argument 'size' must be
        # tuple of ints").
        (M.KD, {"tau": NAN}, "KD: tau must be a finite number > 0, got nan"),
        (M.KD, {"beta": True}, "KD: beta must be a number in [0, 1], got True"),
        (M.FedNTD, {"beta": NAN}, "FedNTD: beta must be a finite number >= 0, got nan"),
        (M.FedNTD, {"tau": "1"}, "FedNTD: tau must be a finite number > 0, got '1'"),
        # Before: accepted as truthy ("no" trained FedLMD-Tf).
        (M.FedLMD, {"teacher_free": "no"}, "FedLMD: teacher_free must be True or False, got 'no'"),
        # Before: "switch_round needs teacher_free=true and a round >= 0 (FedLMD-Tf until then)", for a float too.
        (
            M.FedLMD,
            {"teacher_free": True, "switch_round": 2.5},
            "FedLMD: switch_round must be an integer of at least 0 (or None), got 2.5",
        ),
        (
            M.FedLMD,
            {"switch_round": 3},
            "FedLMD: switch_round=3 needs teacher_free=True (FedLMD-Tf until that round, then FedLMD)",
        ),
        (M.FedLMDTf, {"tau": INF}, "FedLMDTf: tau must be a finite number > 0, got inf"),
        (M.FedSSD, {"m_max": NAN}, "FedSSD: m_max must be a finite number >= 0 (or None), got nan"),
        (M.FedSSD, {"aux_per_class": 2.5}, "FedSSD: aux_per_class must be an integer of at least 1, got 2.5"),
        (M.FedCAD, {"tau": NAN}, "FedCAD: tau must be a finite number > 0, got nan"),
        (M.FedCAD, {"gamma": "0.5"}, "FedCAD: gamma must be a number in [0, 1], got '0.5'"),
        # Before: "FedCAD needs 0 <= beta <= gamma <= 1 and tau > 0, got 0.6, 0.5, 1.0".
        (M.FedCAD, {"beta": 0.6}, "FedCAD needs beta <= gamma (the bounds of alpha), got beta=0.6, gamma=0.5"),
        (M.FedKA, {"mu": 2.5}, "FedKA: mu must be an integer of at least 1, got 2.5"),
        (M.FedKA, {"beta": NAN}, "FedKA: beta must be a finite number >= 0, got nan"),
        # Before: "FedKA needs beta >= 0, mu >= 1 and gamma in (0, 1], got 0.1, 10, 0".
        (M.FedKA, {"gamma": 0}, "FedKA: gamma must be in (0, 1] (or None), got 0"),
        (M.FedProx, {"mu": NAN}, "FedProx: mu must be a finite number >= 0, got nan"),
        (M.FedProx, {"mu": "0.01"}, "FedProx: mu must be a finite number >= 0, got '0.01'"),
        (M.FedRS, {"alpha": True}, "FedRS: alpha must be a number in [0, 1], got True"),
        (M.FedDyn, {"alpha": INF}, "FedDyn: alpha must be a finite number > 0, got inf"),
        (M.MOON, {"proj_dim": 2.5}, "MOON: proj_dim must be an integer of at least 1, got 2.5"),
        (M.MOON, {"tau": NAN}, "MOON: tau must be a finite number > 0, got nan"),
        (M.FedCurv, {"fisher_samples": 2.5}, "FedCurv: fisher_samples must be an integer of at least 1, got 2.5"),
        (M.FedCurv, {"lam": INF}, "FedCurv: lam must be a finite number >= 0, got inf"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else repr(v),
)
def test_methods(method, kwargs, message):
    _refused(method, kwargs, message)


@pytest.mark.parametrize(
    ("build", "kwargs", "message"),
    [
        # Before: accepted (float("0.5"), and True as 1).
        (
            Dirichlet,
            {"alpha": True},
            "the Dirichlet concentration must be a positive number, got alpha=True; give a finite alpha > 0 "
            "(--data.alpha, in Python FederatedDataModule(alpha=...); e.g. 0.5, smaller is more skewed)",
        ),
        (ServerSGD, {"lr": "0.5"}, "ServerSGD: lr must be a finite number > 0, got '0.5'"),
        (ServerSGD, {"momentum": False}, "ServerSGD: momentum must be a number in [0, 1), got False"),
        (FedAdam, {"tau": True}, "FedAdam: tau must be a finite number > 0, got True"),
        (FedAdagrad, {"lr": "1"}, "FedAdagrad: lr must be a finite number > 0, got '1'"),
        (FedYogi, {"beta1": False}, "FedYogi: beta1 must be a number in [0, 1), got False"),
        # Before: TypeError: float() argument must be a string or a real number, not 'NoneType'.
        (FedYogi, {"beta2": None}, "FedYogi: beta2 must be a number in [0, 1), got None"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else repr(v),
)
def test_partitioners_and_server_optimizers(build, kwargs, message):
    _refused(build, kwargs, message)


def test_messages_a_python_user_meets_give_the_python_spelling_too():
    # Before: only --trainer.precision 32-true, --trainer.limit_val_batches 0, --federation.server_optimizer and
    # --federation.lr_decay 1, options of a command line the user of L.Trainer does not run.
    with pytest.raises(ValueError, match=r"in Python L\.Trainer\(precision='32-true'\)\)$"):
        rules.check_precision("16-true", on_cpu=True)
    with pytest.raises(ValueError, match=r"in Python L\.Trainer\(precision='bf16-mixed'\)\)$"):
        rules.check_precision("16-mixed", on_cpu=False, exact_steps_method="scaffold")
    with pytest.raises(ValueError, match=r"limit_val_batches 0 \(in Python L\.Trainer\(limit_val_batches=0\)\)$"):
        rules.check_trainer_values({"check_val_every_n_epoch": 0})
    trainer = L.Trainer(callbacks=[StochasticWeightAveraging(swa_lrs=0.1)], logger=False)
    with pytest.raises(ValueError, match=r"--federation.server_optimizer, in Python Federation\(server_optimizer="):
        rules.check_callbacks(trainer)
    scheduler = torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)]), 1)
    fake = SimpleNamespace(lr_scheduler_configs=[LRSchedulerConfig(scheduler, interval="epoch")])
    with pytest.raises(ValueError, match=r"use one \(Federation\(lr_decay=1\), --federation.lr_decay 1, or no"):
        rules.check_lr_schedulers(fake, lr_decay=0.9)  # type: ignore[arg-type]


def test_good_values_are_kept_and_numpy_scalars_become_pythons():
    fed = Federation(
        sample_ratio=np.float32(0.5),
        lr_decay=np.float64(0.9),
        server_lr=np.float32(0.5),
        plots=np.bool_(False),
        eval_local=True,
        client_state_mb=0,
        collapse_rounds=np.int64(3),
        group_size=np.int32(2),
        memory_budget_gb=np.float32(1.5),
        process_timeout=60,
    )
    assert (fed.sample_ratio, fed.lr_decay, fed.server_optimizer.lr) == (0.5, pytest.approx(0.9), 0.5)
    assert (fed.plots, fed.eval_local, fed.client_state_mb, fed.collapse_rounds, fed.group_size) == (
        False, True, 0.0, 3, 2)  # fmt: skip
    assert (fed.memory_budget_gb, fed.process_timeout) == (1.5, 60.0)
    assert all(
        type(v) in (float, bool, int) for v in (fed.sample_ratio, fed.plots, fed.group_size, fed.client_state_mb)
    )
    assert (
        Federation(collapse_rounds=None, group_size=None, memory_budget_gb=None, process_timeout=None).group_size
        is None
    )
    assert M.FedLMD(teacher_free=np.bool_(True), switch_round=np.int64(2), beta=0).switch_round == 2
    assert type(M.FedNTD(beta=np.float32(0.5)).beta) is float
    assert M.FedCAD(beta=0, gamma=1, tau=np.float64(2)).tau == 2.0
    assert FedAvg(image_size=[8, 8], num_classes=np.int64(10), in_channels=1).net is not None
    assert FedAdam(lr=np.float32(0.5), beta1=0, tau=np.float64(1e-3)).lr == 0.5
    dm = _digits(batch_size=np.int64(32), holdout_per_class=np.int64(1), hflip=np.bool_(False), num_clients=np.int64(3))
    assert (type(dm.batch_size), type(dm.num_clients), dm.holdout_per_class) == (int, int, 1)


def test_a_fit_of_numpy_scalars_writes_its_results(tmp_path):
    # Before: the fit failed at its end writing summary.json ("TypeError: Object of type int64 is not JSON
    # serializable": num_clients=np.int64(3)); with a logger, at its start: "Error while merging hparams: the keys
    # ['num_classes'] are present in both the LightningModule's and LightningDataModule's hparams but have different
    # values" (np.int64(10) and 10).
    fed = Federation(rounds=np.int64(1), sample_ratio=np.float32(1.0), plots=np.bool_(False))
    dm = _digits(num_clients=np.int64(3), batch_size=np.int64(64), alpha=np.float32(0.5))
    model = M.FedNTD(beta=np.float32(1.0), lr=np.float32(0.05), num_classes=np.int64(10), in_channels=1, image_size=8)
    bare_trainer(tmp_path, fed, logger=CSVLogger(tmp_path, name="csv")).fit(model, datamodule=dm)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["num_clients"], summary["sample_ratio"]) == ("completed", 3, 1.0)
    assert type(model.hparams["lr"]) is float and type(dm.hparams["batch_size"]) is int

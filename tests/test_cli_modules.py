"""Any LightningModule on the command line (``--model mypkg.MyModule``), and W&B names for a user's own data."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from helpers import read_summary

from fl_lightning.cli import EXIT_CODES, resolve_config, run

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "fl_cli_own"  # the user's package, written into a temporary folder on the path
SOURCE = '''
import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.data import DataSource


class Plain(L.LightningModule):
    """A plain module: takes the data's num_classes (linked), but not in_channels or image_size."""

    def __init__(self, num_classes: int = 3, hidden: int = 16, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class NotAModule:
    def __init__(self, lr: float = 0.1) -> None:
        self.lr = lr


class Wine(DataSource):
    name = "wine"

    def __init__(self, test_size: float = 0.25, region: str = "north") -> None:
        self.test_size, self.region = test_size, region


class UnnamedSourceWithAVeryLongClassNameThatGoesOnAndOnPastSixtyFourCharacters(DataSource):
    pass


import numpy as np

from fl_lightning import FedAvg
from fl_lightning.core.partitions import Partitioner
from fl_lightning.core.server_optim import ServerSGD


class RoundRobin(Partitioner):
    """Sample i to client i mod N."""

    name = "round_robin"

    def __call__(self, labels, num_clients, seed):
        index = np.arange(len(labels))
        return [index[k::num_clients] for k in range(num_clients)]

    @property
    def label(self):
        return "round robin"


class TinyNet(nn.Module):
    def __init__(self, hidden: int = 16, num_classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.body(x)


class HalfStep(ServerSGD):
    """Half of plain averaging's step."""

    def __init__(self) -> None:
        super().__init__(lr=0.5)


class Smoothed(FedAvg):
    """A method of the user's that sets no method_name."""

    def client_loss(self, x, y):
        return F.cross_entropy(self(x), y, label_smoothing=0.1)
'''


@pytest.fixture(scope="module")
def own_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the user's module ``fl_cli_own``, put on ``sys.path`` for in-process runs."""
    folder = tmp_path_factory.mktemp("own")
    (folder / f"{PACKAGE}.py").write_text(textwrap.dedent(SOURCE))
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    sys.modules.pop(PACKAGE, None)


def fit_args(run_dir: Path, *extra: str) -> list[str]:
    return [
        "fit",
        "--config",
        "quickstart",
        "--data.num_clients",
        "3",
        "--federation.rounds",
        "2",
        "--federation.local_epochs",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--federation.plots",
        "false",
        "--trainer.default_root_dir",
        str(run_dir),
        *extra,
    ]


@pytest.mark.slow
def test_plain_module_by_class_path_runs(tmp_path, own_package):
    # Before: "error: --model: Expected a path but fl_cli_own.Plain either not accessible or invalid" (exit 2).
    run_dir = tmp_path / "r"
    out = subprocess.run(
        [sys.executable, "cli.py", *fit_args(run_dir, "--model", f"{PACKAGE}.Plain", "--model.hidden", "8")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(own_package)},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["rounds_done"] == 2 and summary["method"] == "Plain"
    model = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]
    # The config's lr (0.05) carries over to the new class, as jsonargparse does for arguments of the same name.
    assert model == {"class_path": f"{PACKAGE}.Plain", "init_args": {"hidden": 8, "lr": 0.05}}
    # The data's num_classes reached the module (10 outputs, not its default 3); the links it has no argument for
    # are neither passed nor recorded, so its checkpoint loads back.
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    hparams = ckpt["hyper_parameters"]
    assert hparams["num_classes"] == 10 and "in_channels" not in hparams and "image_size" not in hparams
    assert ckpt["state_dict"]["net.3.bias"].shape == (10,)


def test_plain_module_help_and_methods_by_name(own_package, capsys):
    assert run(["fit", "--model.help", f"{PACKAGE}.Plain"]) == 0
    assert "--model.hidden" in capsys.readouterr().out
    assert run(["fit", "--model.help", "FedNTD"]) == 0
    assert "--model.beta" in capsys.readouterr().out
    config = resolve_config(["fit", "--config", "quickstart", "--model", "fedntd"])
    assert config["model"]["class_path"] == "fl_lightning.methods.FedNTD"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["--model", f"{PACKAGE}.NotAModule"], f"error: --model: {PACKAGE}.NotAModule is not a LightningModule"),
        (["--model", "torch.nn.Linear"], "error: --model: torch.nn.Linear is not a LightningModule"),
        (["--model.class_path", f"{PACKAGE}.NotAModule"], f"error: --model: {PACKAGE}.NotAModule is not a Light"),
        (["--model", f"{PACKAGE}.Nope"], f"error: --model: cannot import {PACKAGE}.Nope: module '{PACKAGE}' has no"),
        (["--model", "no_such_pkg.Net"], "error: --model: cannot import no_such_pkg.Net: No module named 'no_such_"),
        (["--data.dataset", f"{PACKAGE}.Plain"], f"error: --data.dataset: {PACKAGE}.Plain is not a DataSource"),
        (
            ["--federation.server_optimizer", "halfstep"],
            "error: --federation.server_optimizer: unknown server optimizer 'halfstep'; choose one of sgd, fedadagrad",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_unusable_class_is_one_line_with_the_reason(tmp_path, capsys, own_package, given, message):
    # Before: "error: --model: Expected a path but ... either not accessible or invalid" for each of them.
    assert run(fit_args(tmp_path / "r", *given)) == EXIT_CODES["bad input"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
    assert not (tmp_path / "r").exists()


def test_a_partition_network_and_server_optimizer_of_your_own_by_class_path(tmp_path, own_package):
    # Before: "error: unknown partition 'fl_cli_own.RoundRobin'", "error: unknown model 'fl_cli_own.TinyNet'" (only
    # `.class_path` worked, as rounds.md did not say), and the method recorded as "fedavg".
    run_dir = tmp_path / "r"
    own = ("--model", f"{PACKAGE}.Smoothed", "--data.partition", f"{PACKAGE}.RoundRobin")
    own += ("--model.net", f"{PACKAGE}.TinyNet", "--model.net.init_args.hidden", "8")
    assert run(fit_args(run_dir, *own, "--federation.server_optimizer", f"{PACKAGE}.HalfStep")) == 0
    summary = read_summary(run_dir)
    assert (
        summary["status"] == "completed" and summary["method"] == "smoothed" and summary["partition"] == "round robin"
    )
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["data"]["partition"]["class_path"] == f"{PACKAGE}.RoundRobin"
    net = config["model"]["init_args"]["net"]
    assert net["class_path"] == f"{PACKAGE}.TinyNet" and net["init_args"]["hidden"] == 8
    assert config["federation"]["server_optimizer"]["class_path"] == f"{PACKAGE}.HalfStep"
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["state_dict"]["net.body.1.weight"].shape == (8, 64)
    # The same command resumes (the checkpoint names the network by its class path, the config in full).
    server = ("--federation.server_optimizer", f"{PACKAGE}.HalfStep")
    assert run(fit_args(run_dir, *own, *server, "--federation.rounds", "3", "--ckpt_path", "last")) == 0
    assert read_summary(run_dir)["rounds_done"] == 3


@pytest.mark.parametrize("name", ["fedadam", "FedAdam", "FEDADAM"])
def test_a_server_optimizer_by_name_takes_its_arguments(name):
    config = resolve_config(
        ["fit", "--config", "quickstart", "--federation.server_optimizer", name]
        + ["--federation.server_optimizer.init_args.lr", "0.05"]
    )
    optimizer = config["federation"]["server_optimizer"]
    assert optimizer["class_path"] == "fl_lightning.core.server_optim.FedAdam"
    assert optimizer["init_args"]["lr"] == 0.05 and optimizer["init_args"]["beta2"] == 0.99


def test_a_server_optimizer_by_name_in_yaml_is_the_same_setting_as_on_the_command_line(tmp_path):
    # A YAML file may keep the name; the command line writes the class and its arguments: one setting for a resume.
    from fl_lightning.core.rundir import science_diff

    named = yaml.safe_load("federation: {server_optimizer: fedadam}")
    full = resolve_config(["fit", "--config", "quickstart", "--federation.server_optimizer", "fedadam"])
    assert science_diff(named, {"federation": {"server_optimizer": full["federation"]["server_optimizer"]}}) == []
    faster = resolve_config(["fit", "--config", "quickstart", "--federation.server_optimizer", "fedadam"] + [
        "--federation.server_optimizer.init_args.lr", "0.05"])  # fmt: skip
    assert science_diff(named, {"federation": {"server_optimizer": faster["federation"]["server_optimizer"]}}) == [
        "federation.server_optimizer.init_args.lr: 0.01 -> 0.05"
    ]


def test_not_a_module_from_yaml(tmp_path, capsys, own_package):
    config = tmp_path / "mine.yaml"
    config.write_text(yaml.safe_dump({"model": {"class_path": f"{PACKAGE}.NotAModule", "init_args": {"lr": 0.2}}}))
    assert run(fit_args(tmp_path / "r", "--config", str(config))) == EXIT_CODES["bad input"]
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --model: {PACKAGE}.NotAModule is not a LightningModule"
    ]


def _wandb_args(tmp_path: Path, *extra: str) -> dict:
    config = resolve_config(fit_args(tmp_path / "r", "--trainer.logger", "WandbLogger", *extra))
    return config["trainer"]["logger"]["init_args"]


def test_wandb_group_and_tags_for_a_data_source(tmp_path, own_package, monkeypatch):
    pytest.importorskip("wandb")
    # Before: group "Namespace(class_path='fl_cli_own.Wine', init_args=Namespace(test_size=0.25, ...))_dirichlet",
    # and W&B refused the run: a tag over 64 characters.
    monkeypatch.setenv("WANDB_MODE", "offline")
    data = tmp_path / "data.yaml"
    data.write_text(yaml.safe_dump({"data": {"dataset": {"class_path": f"{PACKAGE}.Wine", "init_args": {}}}}))
    args = _wandb_args(tmp_path, "--config", str(data), "--model", f"{PACKAGE}.Plain", "--seed_everything", "2")
    assert args["group"] == "wine_dirichlet" and args["tags"] == ["plain", "wine", "dirichlet", "seed2"]
    # On the command line, with a partition object: its label.
    partition = '{"class_path": "fl_lightning.core.partitions.Dirichlet", "init_args": {"alpha": 0.1}}'
    args = _wandb_args(tmp_path, "--data.dataset", f"{PACKAGE}.Wine", "--data.partition", partition)
    assert args["group"] == "wine_dirichlet(0.1)" and args["tags"] == ["fedavg", "wine", "dirichlet(0.1)", "seed0"]
    # A source without a name goes by its class name, cut to W&B's 64 characters.
    args = _wandb_args(
        tmp_path,
        "--data.dataset",
        f"{PACKAGE}.UnnamedSourceWithAVeryLongClassNameThatGoesOnAndOnPastSixtyFourCharacters",
    )
    assert args["tags"][1].startswith("UnnamedSourceWithAVeryLong") and len(args["tags"][1]) == 64
    assert all(len(tag) <= 64 for tag in args["tags"]) and len(args["group"]) <= 64

"""Your own network (an nn.Module, also from YAML), seeded built-in networks, the plain Python API and packaging."""

from __future__ import annotations

import ast
import signal
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import read_metrics, read_summary
from torch import nn

from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.core.models import build_model, require_features
from fl_lightning.methods import FedNTD

ROOT = Path(__file__).resolve().parent.parent


class TinyNet(nn.Module):
    """A user's network: logits only, no features()."""

    def __init__(self, hidden: int = 16, num_classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _fit(tmp_path, model, dm=None, rounds=2, **trainer_kwargs) -> Federation:
    dm = dm or FederatedDataModule("digits", num_clients=3, partition="iid", batch_size=64)
    fed = Federation(rounds=rounds, local_epochs=1, plots=False)
    kwargs = {"accelerator": "cpu", "logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
    L.Trainer(callbacks=[fed], default_root_dir=str(tmp_path), **{**kwargs, **trainer_kwargs}).fit(model, datamodule=dm)
    return fed


def test_module_net_is_used_as_given_and_recorded(tmp_path):
    net = TinyNet()
    model = FedNTD(net=net, lr=0.2)
    assert model.net is net and model.hparams.net == "test_byo_net.TinyNet"
    fed = _fit(tmp_path, model, rounds=3)
    assert model.net is net and model.num_classes == 10  # taken from the datamodule
    assert fed.history[-1]["global_acc"] > 0.6
    assert read_summary(tmp_path)["model"] == "test_byo_net.TinyNet"


@pytest.mark.parametrize(
    ("net", "match"),
    [
        # Before: "IndexError: Target 7 is out of bounds" in round 1 (too few outputs), or a run trained to its end on
        # 12 outputs for 10 classes; a wrong input size failed deep in the first layer.
        (
            TinyNet(num_classes=5),
            r"returns \(2, 5\) for 2 inputs, but the data has 10 classes: give --model.net "
            r"\(in Python FedAvg\(net=...\)\) one .*num_classes 10; in Python a network built for 10 classes\)$",
        ),
        (TinyNet(num_classes=12), r"returns \(2, 12\) for 2 inputs, but the data has 10 classes"),
        (nn.Sequential(nn.Flatten(), nn.Linear(60, 10)), r"failed on two of the data's inputs of shape \(1, 8, 8\)"),
    ],
    ids=["too-few-outputs", "too-many-outputs", "wrong-input-size"],
)
def test_a_network_that_does_not_fit_the_data_is_refused_before_training(tmp_path, net, match):
    with pytest.raises(ValueError, match=match):
        _fit(tmp_path, FedAvg(net=net), rounds=1)
    assert not (tmp_path / "summary.json").exists()


class _InPlace(TinyNet):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.clamp_(-5, 5))  # works on its input in place


def test_a_network_working_on_its_input_in_place_passes_the_check(tmp_path):
    # Found by review: the check's two inputs were one expanded row, which an in-place op refuses.
    fed = _fit(tmp_path, FedAvg(net=_InPlace()), rounds=1)
    assert len(fed.history) == 1 and read_summary(tmp_path)["status"] == "completed"


class _Stop(Exception):
    pass


class _StartWeights(L.Callback):
    def on_train_start(self, trainer, pl_module):
        self.weights = torch.cat([p.detach().flatten().clone() for p in pl_module.parameters()])
        raise _Stop


def test_built_in_net_is_seeded_by_the_data_seed(tmp_path):
    def start_weights(global_seed: int, data_seed: int) -> torch.Tensor:
        torch.manual_seed(global_seed)
        model = FedAvg(net="lenet", lr=0.05)
        assert model.net is None  # built once, at fit start, for the data
        dm = FederatedDataModule("digits", num_clients=3, partition="iid", seed=data_seed)
        probe = _StartWeights()
        trainer = L.Trainer(
            accelerator="cpu",
            callbacks=[Federation(rounds=1, plots=False), probe],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            default_root_dir=str(tmp_path / f"{global_seed}-{data_seed}"),  # a new run: never over an earlier one
        )
        with pytest.raises(_Stop):
            trainer.fit(model, datamodule=dm)
        return probe.weights

    a, b, c = start_weights(1, 0), start_weights(2, 0), start_weights(1, 5)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_non_square_built_in_nets():
    for name in ("lenet", "cnn", "tcnn", "resnet8"):
        net = build_model(name, 3, (20, 36), 7).eval()
        with torch.no_grad():
            assert net(torch.randn(2, 3, 20, 36)).shape == (2, 7)


def test_methods_needing_features_name_the_missing_attribute():
    with pytest.raises(TypeError, match=r"MOON needs .* TinyNet lacks a features\(x\) method and .* feature_dim"):
        require_features(TinyNet(), "MOON")
    require_features(build_model("lenet", 1, 28, 10), "MOON")


def test_a_network_registered_in_models_is_built_by_name(tmp_path, monkeypatch):
    # Before: MODELS was a tuple of names and the builders private: a name of yours could not be added.
    from fl_lightning.core.models import MODELS

    monkeypatch.setitem(
        MODELS, "tiny", lambda channels, size, classes: TinyNet(hidden=channels * size, num_classes=classes)
    )
    model = FedAvg(net="tiny")
    _fit(tmp_path, model, rounds=1)
    assert (
        isinstance(model.net, TinyNet) and model.net.body[1].out_features == 8 and model.net.body[3].out_features == 10
    )
    assert build_model("tiny", 2, 8, 3).body[1].out_features == 16


def test_a_method_of_yours_is_recorded_by_its_own_name():
    # Before: a subclass without method_name inherited its parent's, and summary.json recorded it as that method.
    from fl_lightning.methods import METHODS

    class MyNTD(FedNTD):
        pass

    assert (MyNTD.method_name, FedNTD.method_name, FedAvg.method_name) == ("myntd", "fedntd", "fedavg")
    assert all(cls.method_name == name for name, cls in METHODS.items())


def test_bad_net():
    with pytest.raises(ValueError, match="nn.Module"):
        FedAvg(net="vgg")
    with pytest.raises(TypeError, match="nn.Module"):
        FedAvg(net=3)


def test_module_net_from_yaml_and_cli(tmp_path):
    from fl_lightning.cli import cli_main

    cli = cli_main(
        [
            "--config",
            str(ROOT / "configs/quickstart.yaml"),
            "--model.net",
            '{"class_path": "test_byo_net.TinyNet", "init_args": {"hidden": 8}}',
            "--trainer.default_root_dir",
            str(tmp_path),
        ],
        run=False,
    )
    assert isinstance(cli.model.net, TinyNet) and cli.model.net.body[1].out_features == 8
    assert cli.model.hparams.net == "test_byo_net.TinyNet"


class _InterruptAt(L.Callback):
    def __init__(self, round_idx: int) -> None:
        self.round_idx = round_idx

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.round_idx:
            raise KeyboardInterrupt


def _plain_run(run_dir: Path, ckpt_path: str | None = None, interrupt: int | None = None) -> None:
    """The README's plain Python API: no Trainer arguments beyond callbacks and the run directory."""
    x, y = torch.randn(120, 5, generator=torch.Generator().manual_seed(0)), torch.arange(120) % 3
    x[:, 0] += y.float() * 2
    dm = FederatedDataModule.from_tensors(x, y, x[:30], y[:30], num_clients=3, partition="iid", batch_size=16)
    torch.manual_seed(0)
    model = FedAvg(net=nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3)), lr=0.05)
    callbacks = [Federation(rounds=4, local_epochs=1, plots=False, lr_decay=0.9)]
    callbacks += [_InterruptAt(interrupt)] if interrupt is not None else []
    trainer = L.Trainer(callbacks=callbacks, default_root_dir=str(run_dir), enable_progress_bar=False)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)


def test_plain_python_resume_with_ckpt_path_last(tmp_path):
    _plain_run(tmp_path / "full")
    try:
        with pytest.raises(SystemExit):
            _plain_run(tmp_path / "cut", interrupt=2)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert (tmp_path / "cut" / "checkpoints" / "last.ckpt").exists()
    _plain_run(tmp_path / "cut", ckpt_path="last")
    full, resumed = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")
    assert len(resumed) == 4
    for a, b in zip(full, resumed, strict=True):
        assert {k: v for k, v in a.items() if "seconds" not in k} == {k: v for k, v in b.items() if "seconds" not in k}


def test_plain_python_sets_max_epochs_without_a_warning(tmp_path, recwarn):
    _plain_run(tmp_path)
    assert not [w for w in recwarn if "max_epochs" in str(w.message)]
    assert read_summary(tmp_path)["rounds_done"] == 4


def _top_level_imports(module: str) -> list[str]:
    path = ROOT / (module.replace(".", "/") + ("/__init__.py" if module == "fl_lightning" else ".py"))
    names = []
    for node in ast.parse(path.read_text()).body:  # module level only: imports inside functions are lazy
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            if node.module == "fl_lightning":
                names += [f"fl_lightning.{a.name}" for a in node.names]
    return names


def test_import_pulls_in_neither_the_cli_nor_matplotlib():
    # What importing fl_lightning's public names loads of the package, followed statically. (lightning itself loads
    # matplotlib through torchmetrics when it is installed; fl_lightning's own modules import it only to draw a figure.)
    import fl_lightning

    seen: set[str] = set()
    todo = sorted(set(fl_lightning._EXPORTS.values()))
    while todo:
        module = todo.pop()
        if module in seen or not (ROOT / (module.replace(".", "/") + ".py")).exists() and module != "fl_lightning":
            continue
        seen.add(module)
        imports = _top_level_imports(module)
        assert not [m for m in imports if m.split(".")[0] == "matplotlib"], module
        todo += [m for m in imports if m.startswith("fl_lightning")]
    assert {"fl_lightning.data", "fl_lightning.federation", "fl_lightning.recorder"} <= seen
    assert "fl_lightning.cli" not in seen and "fl_lightning.experiments.compare" not in seen

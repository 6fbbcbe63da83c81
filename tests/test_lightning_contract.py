"""Lightning's own tools next to the Federation callback (issue 18): each works as documented, or is refused."""

from __future__ import annotations

import importlib.util
import inspect
import logging
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import bare_trainer, read_metrics, read_summary, tiny_run
from lightning.pytorch.callbacks import TQDMProgressBar
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fl_lightning import FedAvg, FederatedDataModule, Federation, methods
from fl_lightning.core.augment import InputNormalization
from fl_lightning.core.evaluation import Evaluation, add_counts, batch_counts
from fl_lightning.module import INPUT_NORMALIZATION_KEY
from fl_lightning.progress import RoundProgressBar, use_round_bars

ROOT = Path(__file__).resolve().parent.parent


class PlainClassifier(L.LightningModule):
    """A plain LightningModule: Lightning's own predict_step; under a Federation one training batch per local step."""

    def __init__(self, in_features: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


# ---- using the trained model ----------------------------------------------------------------------------------------


class Validating(FedAvg):
    """FedAvg with a ``validation_step`` (the same counts as ``test_step``), for ``trainer.validate``."""

    def on_validation_epoch_start(self) -> None:
        self._val_counts = None

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self._val_counts = add_counts(self._val_counts, batch_counts(logits, y, logits.shape[-1]))

    def on_validation_epoch_end(self) -> None:
        if self._val_counts is not None:
            self.log("val/acc", Evaluation.from_counts(self._val_counts).acc)


def _files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _test_set(dm: FederatedDataModule) -> tuple[torch.Tensor, torch.Tensor]:
    """The raw test inputs (as the datamodule holds them: uint8 for digits) and labels."""
    xs, ys = zip(*dm.test_batches(), strict=True)
    return torch.cat(xs), torch.cat(ys)


def _accuracy(predictions: list[torch.Tensor], y: torch.Tensor) -> float:
    return (torch.cat(predictions).argmax(1) == y).double().mean().item()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A completed 2-round run of 3 clients on digits: (trainer, federation, model, run directory)."""
    run_dir = tmp_path_factory.mktemp("finished")
    trainer, fed, model = tiny_run(run_dir, method=Validating, rounds=2, data_kwargs={"num_clients": 3})
    assert read_summary(run_dir)["status"] == "completed"
    return trainer, fed, model, run_dir


def test_predict_after_fit_leaves_the_run_untouched(finished):
    trainer, fed, model, run_dir = finished
    before = _files(run_dir)
    dm = trainer.datamodule
    _, y = _test_set(dm)
    # The test set's raw inputs, normalised by the method: with the model in hand, and from the run's checkpoint
    # (no model: Lightning restores it, callbacks included).
    for predictions in (trainer.predict(model, datamodule=dm), trainer.predict(datamodule=dm)):
        assert _accuracy(predictions, y) == pytest.approx(fed.history[-1]["global_acc"], abs=1e-6)
    bad = DataLoader(TensorDataset(torch.zeros(4, 3, 8, 8)))  # 3-channel images for a 1-channel net
    for with_model in ((model,), ()):
        with pytest.raises(RuntimeError):  # a failing predict is not the run's failure
            trainer.predict(*with_model, dataloaders=bad)
    assert _files(run_dir) == before  # summary.json byte-identical, no file added or removed
    assert fed.status == "completed" and read_summary(run_dir)["status"] == "completed"


def test_validate_and_test_after_fit_leave_the_run_untouched(finished):
    trainer, fed, model, run_dir = finished
    before = _files(run_dir)
    dm = trainer.datamodule
    final = fed.history[-1]["global_acc"]
    for with_model in ((model,), ()):  # () restores the run's checkpoint
        (tested,) = trainer.test(*with_model, datamodule=dm, verbose=False)
        assert tested["test/acc"] == pytest.approx(final, abs=1e-6)
    x, y = _test_set(dm)
    normalised = DataLoader(TensorDataset(dm.transform(x, False), y), batch_size=128)
    for with_model in ((model,), ()):
        (validated,) = trainer.validate(*with_model, dataloaders=normalised, verbose=False)
        assert validated["val/acc"] == pytest.approx(final, abs=1e-6)
    assert _files(run_dir) == before
    assert fed.status == "completed" and len(fed.history) == 2  # the record is the run's, not a checkpoint's
    assert read_summary(run_dir)["status"] == "completed"


def test_reloaded_method_on_raw_inputs_reproduces_the_final_accuracy(finished):
    trainer, fed, _, run_dir = finished
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    # The statistics travel in the checkpoint, outside state_dict (which the federation averages and loads).
    assert not any("input_normalization" in key for key in ckpt["state_dict"])
    assert torch.equal(ckpt[INPUT_NORMALIZATION_KEY]["mean"], trainer.datamodule.transform.mean.cpu())
    model = Validating.load_from_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    x, y = _test_set(trainer.datamodule)
    assert x.dtype == torch.uint8
    loader = DataLoader(TensorDataset(x), batch_size=100)
    predictions = bare_trainer(run_dir / "elsewhere").predict(model, dataloaders=loader)
    assert _accuracy(predictions, y) == pytest.approx(fed.history[-1]["global_acc"], abs=1e-6)
    # The same through a fresh datamodule of the same data, without a Federation callback.
    fresh = FederatedDataModule("digits", num_clients=3, partition="dirichlet", alpha=1.0)
    predictions = bare_trainer(run_dir / "elsewhere").predict(model, datamodule=fresh)
    assert _accuracy(predictions, y) == pytest.approx(fed.history[-1]["global_acc"], abs=1e-6)


def test_input_normalization_is_the_evaluation_transform():
    from fl_lightning.core.augment import BatchTransform

    transform = BatchTransform([0.1, 0.2, 0.3], [0.5, 0.6, 0.7], crop_padding=2, hflip=True, image=True)
    norm = InputNormalization()
    norm.copy_from(transform)
    x = torch.randint(0, 256, (4, 3, 5, 5), dtype=torch.uint8)
    assert torch.equal(norm(x), transform(x, train=False))  # bit for bit: no second rounding
    assert norm.state_dict() == {}  # non-persistent: out of the weights the federation averages


def test_predict_dataloader_yields_raw_test_inputs_for_any_module(tmp_path):
    class Items(torch.utils.data.Dataset):  # not a TensorDataset: streamed, item by item
        def __init__(self, x, y):
            self.x, self.y = x, y

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return self.x[i], int(self.y[i])

    x = torch.randint(0, 256, (60, 1, 8, 8), dtype=torch.uint8)
    y = torch.arange(60) % 3
    for dm in (
        FederatedDataModule.from_tensors(x[:40], y[:40], x[40:], y[40:], num_clients=2, eval_batch_size=8),
        FederatedDataModule.from_datasets(
            Items(x[:40], y[:40]), Items(x[40:], y[40:]), num_clients=2, eval_batch_size=8
        ),
    ):
        dm.setup("predict")
        assert torch.equal(torch.cat(list(dm.predict_dataloader())), x[40:])  # raw, in order, inputs only
        plain = PlainClassifier(in_features=64, classes=3)  # Lightning's default predict_step: self(batch)
        logits = torch.cat(bare_trainer(tmp_path).predict(plain, datamodule=dm))
        assert torch.allclose(logits, plain(dm.transform(x[40:], False)), atol=1e-6)  # normalised by the datamodule


class WineMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(13, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_features_standardised_per_feature_travel_with_the_model(tmp_path):
    """The issue's wine case: raw features span 0.1 to 1680; the model must standardise them itself."""
    from sklearn.datasets import load_wine

    data = load_wine()
    x, y = torch.tensor(data.data, dtype=torch.float32), torch.tensor(data.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    dm = FederatedDataModule.from_tensors(x[:130], y[:130], x[130:], y[130:], num_clients=2, partition="iid")
    torch.manual_seed(0)
    fed = Federation(rounds=2, plots=False)
    last = L.pytorch.callbacks.ModelCheckpoint(save_last=True, save_top_k=0)
    trainer = bare_trainer(tmp_path, fed, last, max_epochs=2, enable_checkpointing=True)
    trainer.fit(FedAvg(net=WineMLP(), lr=0.05), datamodule=dm)
    assert read_summary(tmp_path)["status"] == "completed"
    model = FedAvg.load_from_checkpoint(tmp_path / "checkpoints" / "last.ckpt", net=WineMLP())
    assert model.input_normalization.mean.shape == (1, 13)  # per feature
    predictions = bare_trainer(tmp_path / "predict").predict(model, dataloaders=DataLoader(TensorDataset(x[130:])))
    assert _accuracy(predictions, y[130:]) == pytest.approx(fed.history[-1]["global_acc"], abs=1e-6)


def test_default_predict_step_takes_a_tensor_or_a_tensor_dataset_batch():
    model = FedAvg(net="lenet", num_classes=10, in_channels=1, image_size=8).eval()
    model.input_normalization.set_stats(torch.full((1, 1, 1, 1), 0.3), torch.full((1, 1, 1, 1), 0.2))
    x = torch.randint(0, 256, (5, 1, 8, 8), dtype=torch.uint8)
    expected = model((x.float() / 255 - 0.3) / 0.2)
    (tensors,) = DataLoader(TensorDataset(x), batch_size=5)  # a TensorDataset batch is a list [x]
    (pairs,) = DataLoader(TensorDataset(x, torch.zeros(5).long()), batch_size=5)
    for batch in (x, (x,), tensors, pairs):
        assert torch.allclose(model.predict_step(batch, 0), expected)


def test_resuming_a_checkpoint_written_before_normalisation_was_saved(tmp_path):
    kwargs = {"data_kwargs": {"num_clients": 2}}
    _, full, _ = tiny_run(tmp_path / "full", rounds=2, **kwargs)
    tiny_run(tmp_path / "cut", rounds=1, **kwargs)
    ckpt = torch.load(tmp_path / "cut" / "checkpoints" / "last.ckpt", weights_only=False)
    del ckpt[INPUT_NORMALIZATION_KEY]  # as an earlier fl_lightning wrote it
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    with pytest.warns(UserWarning, match="no input normalisation"):
        FedAvg.load_from_checkpoint(old)  # for prediction: said, not silently wrong
    trainer, resumed, model = tiny_run(tmp_path / "cut", rounds=2, ckpt_path=str(old), **kwargs)
    assert [r["global_acc"] for r in resumed.history] == [r["global_acc"] for r in full.history]
    assert read_metrics(tmp_path / "cut")[-1]["global_loss"] == read_metrics(tmp_path / "full")[-1]["global_loss"]
    assert torch.equal(model.input_normalization.mean, trainer.datamodule.transform.mean)


def test_exports_of_a_trained_method(finished):
    trainer, _, model, _ = finished
    model = model.cpu().eval()
    raw, _ = _test_set(trainer.datamodule)
    raw = raw[:16]
    x = model.input_normalization(raw)
    expected = model(x)
    scripted = model.to_torchscript()
    assert torch.allclose(scripted(x), expected, atol=1e-6)
    exported = torch.export.export(model, (x,))
    assert torch.allclose(exported.module()(x), expected, atol=1e-6)
    # Raw inputs in, logits out: the model's normalisation in front of it.
    end_to_end = torch.export.export(nn.Sequential(model.input_normalization, model).eval(), (raw,))
    assert torch.allclose(end_to_end.module()(raw), model.predict_step(raw), atol=1e-6)


def test_onnx_export_of_a_trained_method(finished, tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    trainer, _, model, _ = finished
    x = model.input_normalization(_test_set(trainer.datamodule)[0][:4]).cpu()
    model.cpu().to_onnx(tmp_path / "model.onnx", x)
    assert (tmp_path / "model.onnx").stat().st_size > 0


METHOD_CLASSES = [FedAvg] + [c for _, c in inspect.getmembers(methods, inspect.isclass) if issubclass(c, FedAvg)]


@pytest.mark.parametrize("cls", METHOD_CLASSES, ids=lambda c: c.__name__)
def test_probing_a_method_before_fit_raises_only_attribute_errors(cls):
    model = cls(net="lenet")  # the network is built at fit start
    for name in ("teacher", "num_classes", "trainer"):
        assert not hasattr(model, name)
    inspect.getmembers(model)
    with pytest.raises(AttributeError, match="not known before fit"):
        model.num_classes  # noqa: B018 (the property's own message, not nn.Module's "has no attribute")
    with pytest.raises(AttributeError, match="no teacher"):
        model.teacher  # noqa: B018
    with pytest.raises(AttributeError, match="built at fit start"):
        model.to_torchscript()
    built = cls(net="lenet", num_classes=10, in_channels=1, image_size=8)
    inspect.getmembers(built)
    assert built.to_torchscript() is not None


# ---- typed and quiet ------------------------------------------------------------------------------------------------


def test_py_typed_is_in_the_built_package(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("fl_lightning", "configs"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    subprocess.run([*command, "-w", str(tmp_path / "out"), str(src)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "out").glob("fl_lightning-*.whl")
    assert "fl_lightning/py.typed" in zipfile.ZipFile(wheel).namelist()


@pytest.fixture
def fresh_lightning_logging():
    """Lightning's loggers as in a new process: without the filters an earlier Federation (or the CLI) added."""
    names = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
    saved = {name: list(logging.getLogger(name).filters) for name in names}
    for name in names:
        for f in saved[name]:
            logging.getLogger(name).removeFilter(f)
    yield
    for name in names:
        for f in saved[name]:
            if f not in logging.getLogger(name).filters:
                logging.getLogger(name).addFilter(f)


TIPS = ("💡", "Tip:", "LitLogger", "GPU available", "TPU available", "Tensor Cores")


def test_no_lightning_tips_in_a_python_run(tmp_path, fresh_lightning_logging, capfd, caplog):
    caplog.set_level(logging.INFO)
    L.Trainer(accelerator="cpu", default_root_dir=str(tmp_path / "control"))  # no Federation: Lightning's lines
    control = capfd.readouterr()
    assert "GPU available" in control.out + control.err + caplog.text  # the capture sees them
    caplog.clear()
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", batch_size=64)
    fed = Federation(rounds=1, plots=False)
    trainer = L.Trainer(accelerator="cpu", callbacks=[fed], default_root_dir=str(tmp_path), enable_progress_bar=False)
    trainer.fit(FedAvg(net="lenet", lr=0.05), datamodule=dm)
    from lightning.fabric.utilities.rank_zero import rank_zero_info  # what Lightning's CUDA accelerator calls

    rank_zero_info("You are using a CUDA device ('NVIDIA H100') that has Tensor Cores. To properly utilize them, ...")
    captured = capfd.readouterr()
    text = captured.out + captured.err + caplog.text
    assert "round 1/1" in text  # the run's own lines still print
    assert not [tip for tip in TIPS if tip in text], text


class _BarCounts(L.Callback):
    """What the round's bar counts before each training batch: (round, batch, clients done, clients)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, int, int]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        bar = trainer.progress_bar_callback._train_progress_bar
        if bar is not None:
            self.seen.append((trainer.current_epoch, batch_idx, bar.n, bar.total))


@pytest.mark.skipif(importlib.util.find_spec("rich") is not None, reason="with rich, Lightning's default bar is Rich's")
@pytest.mark.parametrize("module", [FedAvg(net="lenet"), PlainClassifier()], ids=["method", "plain module"])
def test_lightning_progress_bar_counts_rounds_and_clients(tmp_path, capsys, module):
    dm = FederatedDataModule("digits", num_clients=3, partition="iid", batch_size=32)
    fed, counts = Federation(rounds=2, plots=False), _BarCounts()
    trainer = L.Trainer(  # Lightning's default progress bar (TQDMProgressBar without rich)
        accelerator="cpu", callbacks=[fed, counts], logger=False, enable_checkpointing=False, default_root_dir=tmp_path
    )
    trainer.fit(module, datamodule=dm)
    assert isinstance(trainer.progress_bar_callback, RoundProgressBar)
    out = capsys.readouterr().out
    assert "round 1/2" in out and "round 2/2" in out and "client 3/3" in out and "Epoch" not in out
    steps = fed.plan(0).steps  # each client's local steps (a plain module trains one per batch)
    assert len(counts.seen) == (3 if isinstance(module, FedAvg) else sum(steps)) * 2
    for _, batch_idx, done, total in counts.seen:
        ends = [sum(steps[: i + 1]) for i in range(3)] if not isinstance(module, FedAvg) else [1, 2, 3]
        assert (done, total) == (sum(end <= batch_idx for end in ends), 3)  # clients done, not local steps


def test_only_lightnings_own_bars_are_replaced(tmp_path):
    class MyBar(TQDMProgressBar):
        pass

    mine = MyBar()
    trainer = L.Trainer(accelerator="cpu", callbacks=[mine], logger=False, default_root_dir=str(tmp_path))
    use_round_bars(trainer)
    assert trainer.progress_bar_callback is mine
    trainer = L.Trainer(accelerator="cpu", callbacks=[TQDMProgressBar(refresh_rate=3)], logger=False)
    use_round_bars(trainer)
    assert type(trainer.progress_bar_callback) is RoundProgressBar and trainer.progress_bar_callback.refresh_rate == 3


def test_rich_progress_bar_counts_rounds_and_clients(tmp_path, capsys):
    pytest.importorskip("rich")
    from lightning.pytorch.callbacks import RichProgressBar

    from fl_lightning.progress import RichRoundProgressBar

    dm = FederatedDataModule("digits", num_clients=3, partition="iid", batch_size=32)
    trainer = L.Trainer(
        accelerator="cpu",
        callbacks=[Federation(rounds=2, plots=False), RichProgressBar(leave=True)],
        logger=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(PlainClassifier(), datamodule=dm)
    assert isinstance(trainer.progress_bar_callback, RichRoundProgressBar)
    out = capsys.readouterr().out
    assert "round 2/2" in out and "3/3" in out and "Epoch" not in out

"""Your own data: tensors and datasets of any shape and dtype, streamed datasets, natural (given) clients."""

from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest
import torch
from helpers import bare_trainer, read_summary
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.core.batches import RoundBatches
from fl_lightning.core.datasets import load_dataset
from fl_lightning.core.rounds import RoundPlan, client_steps
from fl_lightning.data import DataSource


def _digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    data = load_dataset("digits")
    return data.train_x, data.train_y, data.test_x, data.test_y


class CountingDataset(Dataset):
    """A dataset that is not a tensor pair and records which items are read."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y
        self.targets = y.tolist()
        self.reads: list[int] = []

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        self.reads.append(int(i))
        return self.x[i], int(self.y[i])


def _transformed_train(dm: FederatedDataModule) -> torch.Tensor:
    dm.setup("fit")
    x = torch.cat([dm.client_data(c)[0] for c in range(dm.num_clients)])
    return dm.transform(x, train=False)


def test_uint8_and_float_images_normalise_alike():
    x, y, xt, yt = _digits()
    as_bytes = FederatedDataModule.from_tensors(x, y, xt, yt, num_clients=3, partition="iid")
    as_float = FederatedDataModule.from_tensors(x / 255.0, y, xt / 255.0, yt, num_clients=3, partition="iid")
    a, b = _transformed_train(as_bytes), _transformed_train(as_float)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert abs(a.mean().item()) < 1e-4 and abs(a.std().item() - 1) < 1e-2  # standardised on the [0, 1] scale


def test_tabular_features_standardised_per_feature():
    rng = np.random.default_rng(0)
    scale = np.array([1e4, 1.0, 1e-3], dtype=np.float32)
    x = rng.normal(5, 2, (300, 3)).astype(np.float32) * scale
    y = rng.integers(0, 3, 300)
    dm = FederatedDataModule.from_tensors(x, y, x[:50], y[:50], num_clients=4, partition="iid")
    assert dm.input_shape == (3,) and not dm.is_image and dm.in_channels is None and dm.image_size is None
    out = _transformed_train(dm)
    torch.testing.assert_close(out.mean(0), torch.zeros(3), atol=1e-4, rtol=0)
    torch.testing.assert_close(out.std(0, unbiased=False), torch.ones(3), atol=1e-4, rtol=0)
    raw = FederatedDataModule.from_tensors(x, y, x[:50], y[:50], num_clients=4, partition="iid", normalize=False)
    assert torch.equal(_transformed_train(raw).sort(0).values, torch.from_numpy(x).sort(0).values)


def test_augmentation_refused_for_feature_vectors():
    x, y = torch.randn(40, 5), torch.arange(40) % 2
    with pytest.raises(ValueError, match="image inputs"):
        FederatedDataModule.from_tensors(x, y, x, y, num_clients=2, hflip=True)


def test_non_square_images_federate_with_a_built_in_net(tmp_path):
    rng = torch.Generator().manual_seed(0)
    y = torch.arange(120) % 3
    x = torch.randint(0, 60, (120, 3, 12, 20), dtype=torch.uint8, generator=rng)
    for i, c in enumerate(y.tolist()):
        x[i, c, :, 5 * c : 5 * c + 6] = 250  # a class-dependent bright band
    dm = FederatedDataModule.from_tensors(
        x, y, x[:30], y[:30], num_clients=3, partition="iid", batch_size=16, crop_padding=2, hflip=True, cutout=3
    )
    assert dm.image_size == (12, 20) and dm.in_channels == 3
    model = FedAvg(net="cnn", lr=0.05)  # shapes taken from the datamodule at fit start
    fed = Federation(rounds=3, local_epochs=2, plots=False)
    bare_trainer(tmp_path, fed).fit(model, datamodule=dm)
    assert model.hparams.image_size == (12, 20) and model.num_classes == 3
    assert fed.history[-1]["global_acc"] > 0.6


def _global_weights(tmp_path, dm: FederatedDataModule, rounds: int = 2, ratio: float = 1.0) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    model = FedAvg(net=net, lr=0.05)
    bare_trainer(tmp_path, Federation(rounds=rounds, sample_ratio=ratio, local_epochs=2, plots=False)).fit(
        model, datamodule=dm
    )
    return model.state_dict()


@pytest.mark.parametrize("augment", [{}, {"crop_padding": 1, "hflip": True, "cutout": 2}], ids=["plain", "augmented"])
def test_streamed_dataset_gives_the_in_memory_weights(tmp_path, augment):
    """Augmented, before: reading a streamed client's batches drew from torch's global generator (the loader's base
    seed), which the augmentation draws from, so that the two trained on other crops and flips."""
    x, y, xt, yt = _digits()
    opts = {
        "num_clients": 4,
        "partition": "dirichlet",
        "alpha": 0.5,
        "batch_size": 32,
        "holdout_per_class": 2,
        **augment,
    }
    in_memory = FederatedDataModule.from_tensors(x, y, xt, yt, **opts)
    streamed = FederatedDataModule.from_datasets(CountingDataset(x, y), CountingDataset(xt, yt), **opts)
    a = _global_weights(tmp_path / "a", in_memory)
    b = _global_weights(tmp_path / "b", streamed)
    assert streamed.streaming and not in_memory.streaming
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert torch.equal(in_memory.aux_x, streamed.aux_x)


def test_streaming_reads_only_the_sampled_clients(tmp_path):
    x, y, xt, yt = _digits()
    train = CountingDataset(x, y)
    dm = FederatedDataModule.from_datasets(
        train, CountingDataset(xt, yt), num_clients=10, partition="shard", batch_size=32, normalize=False
    )
    dm.setup("fit")
    train.reads.clear()
    fed = Federation(rounds=1, sample_ratio=0.2, local_epochs=2, plots=False)
    bare_trainer(tmp_path, fed).fit(FedAvg(net="lenet", lr=0.05), datamodule=dm)
    sampled = fed.plan(0).clients
    members = set(torch.cat([dm.client_indices[c] for c in sampled]).tolist())
    assert set(train.reads) == members  # every item of the two sampled clients, and nothing else
    assert len(members) < len(y) / 4
    counts = collections.Counter(train.reads)
    assert set(counts.values()) == {2}  # once per local epoch: FedAvg never asks for the client's data as a whole


def test_flat_round_batches_and_test_batches():
    x, y, xt, yt = _digits()
    for dm in (
        FederatedDataModule.from_tensors(x, y, xt, yt, num_clients=3, batch_size=50),
        FederatedDataModule.from_datasets(CountingDataset(x, y), CountingDataset(xt, yt), num_clients=3, batch_size=50),
    ):
        dm.setup("fit")
        steps = tuple(client_steps(dm.client_sizes[c], 50, 2) for c in (0, 2))
        plan = RoundPlan(round=1, clients=(0, 2), steps=steps, local_epochs=2, lr_scale=1.0)
        source = dm.train_x if dm.train_x is not None else dm._train_reader
        per_client = RoundBatches(source, dm.train_y, dm.client_indices, plan, 50, False, 0)
        nested = [b for client in per_client for b in client]
        flat = RoundBatches(source, dm.train_y, dm.client_indices, plan, 50, False, 0, flat=True)
        assert len(flat) == len(nested) == sum(steps)
        for (x1, y1), (x2, y2) in zip(nested, flat, strict=True):
            assert torch.equal(x1, x2) and torch.equal(y1, y2)
        test = list(dm.test_batches())
        assert torch.equal(torch.cat([b for b, _ in test]), xt) and torch.equal(torch.cat([t for _, t in test]), yt)


def test_given_partition_from_ids_and_from_an_attribute():
    x, y, xt, yt = _digits()
    writers = np.array([f"w{i % 7:02d}" for i in range(len(y))])
    dm = FederatedDataModule.from_tensors(x, y, xt, yt, partition="given", client_ids=writers)
    dm.setup("fit")
    assert dm.num_clients == 7 and dm.client_names == [f"w{i:02d}" for i in range(7)]
    for c, idx in enumerate(dm.client_indices):
        assert set(writers[idx.numpy()].tolist()) == {f"w{c:02d}"}
    train = CountingDataset(x, y)
    train.hospital = (np.arange(len(y)) % 4) * 10 + 3  # not contiguous: remapped to 0..3
    test = CountingDataset(xt, yt)
    by_attr = FederatedDataModule.from_datasets(train, test, partition="given", client_ids="hospital")
    by_attr.setup("fit")
    assert by_attr.num_clients == 4 and by_attr.client_sizes == [len(i) for i in np.array_split(np.arange(len(y)), 4)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"partition": "given"}, "needs client_ids"),
        ({"partition": "iid", "client_ids": [0] * 5}, "only used by partition 'given'"),
        ({"partition": "given", "client_ids": [0, 1, 2]}, "one id per sample"),
        ({"partition": "given", "client_ids": "writer"}, "has that attribute"),
        ({"partition": "given", "client_ids": list(range(40)), "num_clients": 3}, "distinct clients"),
    ],
)
def test_given_partition_bad_input(kwargs, match):
    x, y = torch.randn(40, 4), torch.arange(40) % 2
    with pytest.raises(ValueError, match=match):
        FederatedDataModule.from_tensors(x, y, x, y, **kwargs)


def test_bad_data_says_what_to_change():
    with pytest.raises(ValueError, match="from_tensors"):
        FederatedDataModule("my_data")
    with pytest.raises(ValueError, match="integer"):
        FederatedDataModule.from_tensors(torch.randn(4, 2), torch.rand(4), torch.randn(4, 2), torch.zeros(4).long())
    with pytest.raises(TypeError, match="map-style dataset"):
        FederatedDataModule.from_datasets(object(), object())
    pil = PilImages()
    with pytest.raises(TypeError, match="PILToTensor"):
        FederatedDataModule.from_datasets(pil, pil)
    x, y = torch.randn(8, 2), torch.arange(8) % 2
    with pytest.raises(ValueError, match="the test data is empty"):
        FederatedDataModule.from_tensors(x, y, x[:0], y[:0])
    with pytest.raises(ValueError, match="the training data is empty"):
        FederatedDataModule.from_tensors(x[:0], y[:0], x, y)


class PilImages(Dataset):
    """Items as an ImageFolder without a transform gives them."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return Image.new("RGB", (6, 4)), i % 2


class Blobs(DataSource):
    """A user's data source, as named by class_path in a YAML config."""

    name = "blobs"

    def __init__(self, n: int = 200) -> None:
        self.n = n

    def load(self):
        g = torch.Generator().manual_seed(0)
        y = torch.arange(self.n) % 2
        x = torch.randn(self.n, 6, generator=g) + 3 * y[:, None].float()
        return (x, y), (x[: self.n // 4], y[: self.n // 4])


def test_yaml_data_source_and_module_net(tmp_path):
    from fl_lightning.cli import cli_main

    cli_main(
        [
            "fit",
            "--config",
            "configs/quickstart.yaml",
            "--data.dataset",
            '{"class_path": "test_byo_data.Blobs", "init_args": {"n": 120}}',
            "--data.num_clients",
            "3",
            "--model.net",
            '{"class_path": "torch.nn.Linear", "init_args": {"in_features": 6, "out_features": 2}}',
            "--federation.rounds",
            "2",
            "--federation.local_epochs",
            "1",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.default_root_dir",
            str(tmp_path),
        ]
    )
    summary = read_summary(tmp_path)
    assert summary["dataset"] == "blobs" and summary["model"] == "torch.nn.modules.linear.Linear"
    assert summary["final_acc"] > 0.9
    config = (tmp_path / "config.yaml").read_text()
    assert "test_byo_data.Blobs" in config and "torch.nn.Linear" in config


class _Folder(Dataset):
    """Two items of a dataset that numbers its classes as torchvision's folder datasets do."""

    def __init__(self, classes: list[str]) -> None:
        self.class_to_idx = {c: i for i, c in enumerate(sorted(classes))}
        self.targets = [0, len(classes) - 1]

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.zeros(3), self.targets[i]


@pytest.mark.parametrize(
    ("test_classes", "val_classes", "match"),
    [
        (["a", "c"], None, r"test data's classes differ from the training data's \(missing 'b'\)"),
        (["a", "b", "c", "d"], None, r"test data's classes differ .*\(extra 'd'\)"),
        (["a", "b", "c"], ["b", "c"], r"validation data's classes differ .*missing 'a'"),
    ],
)
def test_folder_datasets_whose_classes_differ_are_refused(test_classes, val_classes, match):
    train = _Folder(["a", "b", "c"])
    val = _Folder(val_classes) if val_classes else None
    with pytest.raises(ValueError, match=match):
        FederatedDataModule.from_datasets(train, _Folder(test_classes), val=val, num_clients=1)


def test_folder_datasets_with_the_same_classes_or_no_class_map_are_accepted():
    from torch.utils.data import Subset

    from fl_lightning.core.sources import check_class_maps

    check_class_maps(_Folder(["a", "b"]), Subset(_Folder(["a", "b"]), [0]))
    check_class_maps(_Folder(["a", "b"]), [torch.zeros(2, 3), torch.zeros(2)])  # tensors carry no class names
    with pytest.raises(ValueError, match=r"'a', 'b' numbered differently"):
        other = _Folder(["a", "b"])
        other.class_to_idx = {"a": 1, "b": 0}
        check_class_maps(_Folder(["a", "b"]), other)


def test_classes_no_client_holds_are_warned_of_and_every_class_held_is_not():
    x, y = torch.randn(60, 3), torch.arange(60) % 6
    few = FederatedDataModule.from_tensors(
        x, y, x, y, partition="classes_per_client", classes_per_client=1, num_clients=4
    )
    with pytest.warns(
        UserWarning,
        match=r"no client holds classes 4, 5 .*raise --data.num_clients 6 "
        r"\(in Python FederatedDataModule\(num_clients=6\)\) or more",
    ):
        few.setup()
    assert few.client_class_counts.sum() == 40
    enough = FederatedDataModule.from_tensors(
        x, y, x, y, partition="classes_per_client", classes_per_client=1, num_clients=6
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enough.setup()


def test_a_source_returning_one_split_instead_of_two_says_so():
    # Before: "dataset items must be (x, y) pairs, got Tensor", naming neither load() nor what to return.
    from fl_lightning.core.sources import DataSource

    class Flat(DataSource):
        def load(self):
            return torch.randn(10, 3), torch.arange(10) % 2

    with pytest.raises(
        TypeError, match=r"^Flat.load\(\) returned 2 tensors; return the splits, .*\(x_test, y_test\)\)$"
    ):
        FederatedDataModule(Flat(), num_clients=2)

"""Dataset loaders, each on small files written here in the dataset's exact on-disk format."""

from __future__ import annotations

import gzip
import pickle
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fl_lightning.core import datasets
from fl_lightning.core.datasets import CACHE_NAME, DATASETS, DatasetInfo, ImageData, load_dataset, read_idx
from fl_lightning.data import DATASET_SHAPES, FederatedDataModule

IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CINIC_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)


def check(data: ImageData, name: str, n_train: int, n_test: int, channels: int, size: int, classes: int) -> None:
    assert data.name == name
    assert data.train_x.shape == (n_train, channels, size, size)
    assert data.test_x.shape == (n_test, channels, size, size)
    assert data.train_y.shape == (n_train,) and data.test_y.shape == (n_test,)
    assert data.train_x.dtype == data.test_x.dtype == torch.uint8
    assert data.train_y.dtype == data.test_y.dtype == torch.int64
    assert data.num_classes == classes
    assert data.in_channels == channels and data.image_size == size
    assert len(data.mean) == len(data.std) == channels


def expected_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = x.astype(np.float64) / 255
    return x.mean(axis=(0, 2, 3)), x.std(axis=(0, 2, 3))


# ---------------------------------------------------------------------------------------------------- IDX


def write_idx(path: Path, array: np.ndarray, magic: int | None = None, gz: bool = False) -> None:
    magic = magic if magic is not None else (2051 if array.ndim == 3 else 2049)
    payload = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    payload += array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(path.with_name(path.name + ".gz"), "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)


def make_idx(folder: Path, gz: bool, n_train: int = 20, n_test: int = 10) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    arrays = (
        rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        (np.arange(n_train) * 7) % 10,
        rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        (np.arange(n_test) * 3 + 1) % 10,
    )
    for name, array in zip(IDX_NAMES, arrays, strict=True):
        write_idx(folder / name, array, gz=gz)
    return arrays


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
@pytest.mark.parametrize("gz", [True, False], ids=["gz", "raw"])
@pytest.mark.parametrize("layout", ["flat", "torchvision"])
def test_idx_datasets(tmp_path: Path, name: str, gz: bool, layout: str) -> None:
    folder = tmp_path
    if layout == "torchvision":
        folder = tmp_path / {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}[name] / "raw"
    train_x, train_y, test_x, test_y = make_idx(folder, gz)
    data = load_dataset(name, str(tmp_path))
    check(data, name, 20, 10, 1, 28, 10)
    assert torch.equal(data.train_x[:, 0], torch.from_numpy(train_x))
    assert torch.equal(data.test_x[:, 0], torch.from_numpy(test_x))
    assert data.train_y.tolist() == train_y.tolist()
    assert data.test_y.tolist() == test_y.tolist()
    mean, std = expected_stats(train_x[:, None])
    assert np.allclose(data.mean, mean) and np.allclose(data.std, std)


def test_idx_bad_magic(tmp_path: Path) -> None:
    make_idx(tmp_path, gz=True)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((10, 28, 28), np.uint8), magic=2049, gz=True)
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte.gz.*magic"):
        load_dataset("mnist", str(tmp_path))


def test_read_idx_rejects_truncated(tmp_path: Path) -> None:
    path = tmp_path / "labels"
    write_idx(path, np.arange(5))
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ValueError, match="labels"):
        read_idx(path)


def test_mnist_download_uses_torchvision_raw_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torchvision.datasets

    if datasets._find_idx_files(Path("/usr/share/datasets/mnist")):
        pytest.skip("MNIST is installed system-wide")
    calls = []

    def fake_mnist(root: str, train: bool, download: bool) -> None:
        calls.append((root, train, download))
        make_idx(Path(root) / "MNIST" / "raw", gz=False)

    monkeypatch.setattr(torchvision.datasets, "MNIST", fake_mnist)
    data = load_dataset("mnist", str(tmp_path / "dl"), download=True)
    check(data, "mnist", 20, 10, 1, 28, 10)
    assert calls and all(download for _, _, download in calls)


def test_missing_mnist_names_searched_paths(tmp_path: Path) -> None:
    if datasets._find_idx_files(Path("/usr/share/datasets/mnist")):
        pytest.skip("MNIST is installed system-wide")
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("mnist", str(tmp_path))
    message = str(err.value)
    assert str(tmp_path) in message and str(tmp_path / "MNIST" / "raw") in message
    assert "--data.download true (in Python FederatedDataModule(download=True))" in message


FASHION_SYSTEM = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not FASHION_SYSTEM.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_from_debian_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no ./data here: the system copy is used because no root is given
    data = load_dataset("fashion_mnist")
    check(data, "fashion_mnist", 60000, 10000, 1, 28, 10)
    assert torch.bincount(data.train_y).tolist() == [6000] * 10
    assert torch.bincount(data.test_y).tolist() == [1000] * 10
    assert data.mean[0] == pytest.approx(0.2860, abs=1e-3) and data.std[0] == pytest.approx(0.3530, abs=1e-3)


# ---------------------------------------------------------------------------------------------------- CIFAR


def write_batch(path: Path, data: np.ndarray, labels: list[int], label_key: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump({b"batch_label": b"x", b"data": data.reshape(len(labels), -1), label_key: labels}, f, protocol=2)


def test_cifar10(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    folder = tmp_path / "cifar-10-batches-py"
    train_x = rng.integers(0, 256, (20, 3, 32, 32), dtype=np.uint8)
    train_y = [(i * 3) % 10 for i in range(20)]
    for b in range(5):
        write_batch(folder / f"data_batch_{b + 1}", train_x[4 * b : 4 * b + 4], train_y[4 * b : 4 * b + 4], b"labels")
    test_x = rng.integers(0, 256, (10, 3, 32, 32), dtype=np.uint8)
    write_batch(folder / "test_batch", test_x, list(range(10))[::-1], b"labels")

    data = load_dataset("cifar10", str(tmp_path))
    check(data, "cifar10", 20, 10, 3, 32, 10)
    assert torch.equal(data.train_x, torch.from_numpy(train_x))
    assert torch.equal(data.test_x, torch.from_numpy(test_x))
    assert data.train_y.tolist() == train_y and data.test_y.tolist() == list(range(10))[::-1]
    mean, std = expected_stats(train_x)
    assert np.allclose(data.mean, mean) and np.allclose(data.std, std)
    # the batch folder itself works as root too
    assert torch.equal(load_dataset("cifar10", str(folder)).train_x, data.train_x)


def test_cifar100_fine_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    train_x = rng.integers(0, 256, (20, 3, 32, 32), dtype=np.uint8)
    test_x = rng.integers(0, 256, (10, 3, 32, 32), dtype=np.uint8)
    for name, x, fine in (
        ("train", train_x, [i * 5 for i in range(20)]),
        ("test", test_x, [99 - i for i in range(10)]),
    ):
        path = tmp_path / "cifar-100-python" / name
        path.parent.mkdir(exist_ok=True)
        with open(path, "wb") as f:
            record = {b"data": x.reshape(len(fine), -1), b"fine_labels": fine, b"coarse_labels": [0] * len(fine)}
            pickle.dump(record, f, protocol=2)

    data = load_dataset("cifar100", str(tmp_path))
    check(data, "cifar100", 20, 10, 3, 32, 100)
    assert torch.equal(data.train_x, torch.from_numpy(train_x)) and torch.equal(data.test_x, torch.from_numpy(test_x))
    assert data.train_y.tolist() == [i * 5 for i in range(20)]
    assert data.test_y.tolist() == [99 - i for i in range(10)]


def test_a_cifar_folder_missing_one_batch_names_it_and_is_not_passed_over(tmp_path: Path) -> None:
    full = tmp_path / "full"
    for name in [f"data_batch_{b}" for b in range(1, 6)] + ["test_batch"]:
        write_batch(full / name, np.zeros((1, 3, 32, 32), np.uint8), [0], b"labels")
        if name != "data_batch_3":
            write_batch(full / "cifar-10-batches-py" / name, np.zeros((1, 3, 32, 32), np.uint8), [0], b"labels")
    with pytest.raises(
        FileNotFoundError, match=r"cifar-10-batches-py holds 5 of the 6 CIFAR-10 batches; missing: data_batch_3 "
    ):
        load_dataset("cifar10", str(full))  # a complete set in the root itself is not used instead


def test_a_partial_cifar_folder_is_left_to_torchvision_with_download(tmp_path: Path, monkeypatch) -> None:
    import torchvision.datasets as tvd

    names = [f"data_batch_{b}" for b in range(1, 6)] + ["test_batch"]
    folder = tmp_path / "cifar-10-batches-py"
    for name in names[1:]:
        write_batch(folder / name, np.zeros((1, 3, 32, 32), np.uint8), [0], b"labels")
    called = []

    def fake(root: str, train: bool, download: bool) -> None:  # extracts the batches again, as torchvision does
        called.append(train)
        write_batch(folder / names[0], np.zeros((1, 3, 32, 32), np.uint8), [1], b"labels")

    monkeypatch.setattr(tvd, "CIFAR10", fake)
    data = load_dataset("cifar10", str(tmp_path), download=True)
    assert called == [True, False] and data.train_y.tolist() == [1, 0, 0, 0, 0]


def test_missing_cifar(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py(.|\n)*--data.download true"):
        load_dataset("cifar10", str(tmp_path))


# ---------------------------------------------------------------------------------------------------- CINIC-10


def make_cinic(folder: Path, per_class: dict[str, int]) -> dict[str, tuple[np.ndarray, list[int]]]:
    """PNG folders of random 32x32 RGB images; returns the pixels [N, 3, 32, 32] and labels of each split."""
    rng = np.random.default_rng(3)
    out = {}
    for split, count in per_class.items():
        images, labels = [], []
        for label, cls in enumerate(CINIC_CLASSES):
            (folder / split / cls).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / split / cls / f"{cls}-{i}.png")
                images.append(pixels.transpose(2, 0, 1))
                labels.append(label)
        out[split] = (np.stack(images), labels)
    return out


def test_cinic10_and_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = make_cinic(tmp_path / "cinic-10", {"train": 2, "valid": 1, "test": 2})
    data = load_dataset("cinic10", str(tmp_path))
    check(data, "cinic10", 20, 20, 3, 32, 10)
    assert torch.equal(data.train_x, torch.from_numpy(expected["train"][0]))
    assert torch.equal(data.test_x, torch.from_numpy(expected["test"][0]))
    assert data.train_y.tolist() == expected["train"][1] == [c for c in range(10) for _ in range(2)]
    assert data.test_y.tolist() == expected["test"][1]
    cache = tmp_path / "cinic-10" / CACHE_NAME
    assert cache.is_file()

    def no_decoding(paths: object) -> torch.Tensor:
        raise AssertionError("images decoded although the cache is there")

    monkeypatch.setattr(datasets, "_decode_images", no_decoding)
    cached = load_dataset("cinic10", str(tmp_path))
    assert torch.equal(cached.train_x, data.train_x) and torch.equal(cached.test_y, data.test_y)
    assert cached.mean == data.mean and cached.std == data.std

    # a changed dataset (one more image) invalidates the cache
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "cinic-10" / "test" / "cat" / "extra.png")
    with pytest.raises(AssertionError, match="decoded"):
        load_dataset("cinic10", str(tmp_path))


def test_cinic10_cache_sees_a_file_moved_between_classes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same counts, one image relabelled: the cache no longer matches and the files are decoded again."""
    make_cinic(tmp_path / "cinic-10", {"train": 2, "test": 1})
    first = load_dataset("cinic10", str(tmp_path))
    train = tmp_path / "cinic-10" / "train"
    (train / "airplane" / "airplane-0.png").rename(train / "automobile" / "moved.png")
    (train / "automobile" / "automobile-0.png").rename(train / "airplane" / "moved.png")
    decoded: list[int] = []
    decode = datasets._decode_images
    monkeypatch.setattr(datasets, "_decode_images", lambda paths: decoded.append(len(paths)) or decode(paths))
    again = load_dataset("cinic10", str(tmp_path))
    assert decoded == [20, 10]
    assert again.train_y.tolist() == first.train_y.tolist()  # the same counts per class, other images
    assert not torch.equal(again.train_x, first.train_x)


def test_cinic10_unwritable_folder_skips_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_cinic(tmp_path, {"train": 1, "test": 1})

    def read_only(*args: object, **kwargs: object) -> None:
        raise PermissionError("read-only file system")

    monkeypatch.setattr(torch, "save", read_only)
    data = load_dataset("cinic10", str(tmp_path))
    check(data, "cinic10", 10, 10, 3, 32, 10)
    assert not any(p.name.startswith(CACHE_NAME) for p in tmp_path.iterdir())


def test_missing_cinic10_points_to_source(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"cinic-10(.|\n)*github.com/BayesWatch/cinic-10"):
        load_dataset("cinic10", str(tmp_path), download=True)


# ---------------------------------------------------------------------------------------------------- Tiny-ImageNet


def test_tinyimagenet(tmp_path: Path) -> None:
    root = tmp_path / "tiny-imagenet-200"
    wnids = ["n03", "n01", "n02"]  # labels follow the sorted order: n01 -> 0, n02 -> 1, n03 -> 2
    (root / "val" / "images").mkdir(parents=True)
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    shade = {"n01": 40, "n02": 120, "n03": 200}
    for wnid in wnids:
        images = root / "train" / wnid / "images"
        images.mkdir(parents=True)
        (root / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
        for i in range(3):
            Image.new("RGB", (64, 64), (shade[wnid], 10 * i, 255 - shade[wnid])).save(images / f"{wnid}_{i}.JPEG")
    Image.new("L", (64, 64), 90).save(root / "train" / "n02" / "images" / "n02_gray.JPEG")
    val = [("val_0.JPEG", "n03"), ("val_1.JPEG", "n01"), ("val_2.JPEG", "n01"), ("val_3.JPEG", "n02")]
    for fname, wnid in val:
        Image.new("RGB", (64, 64), (shade[wnid], 0, 0)).save(root / "val" / "images" / fname)
    Image.new("L", (64, 64), 170).save(root / "val" / "images" / "val_4.JPEG")
    val.append(("val_4.JPEG", "n03"))
    (root / "val" / "val_annotations.txt").write_text("".join(f"{f}\t{w}\t0\t0\t63\t63\n" for f, w in val))

    data = load_dataset("tinyimagenet", str(tmp_path))
    check(data, "tinyimagenet", 10, 5, 3, 64, 3)
    assert data.train_y.tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    assert data.test_y.tolist() == [2, 0, 0, 1, 2]
    assert (root / CACHE_NAME).is_file()
    # solid colours survive JPEG within a few levels; grayscale images come back as three equal channels
    first = data.train_x[0].to(torch.int16)
    assert (first - torch.tensor([40, 0, 215], dtype=torch.int16)[:, None, None]).abs().max() <= 3
    gray = data.train_x[6].to(torch.int16)  # "n02_gray" sorts after n02_0..2
    assert (gray - 90).abs().max() <= 3
    assert (data.test_x[4].to(torch.int16) - 170).abs().max() <= 3
    assert (data.test_x[0, 0].to(torch.int16) - 200).abs().max() <= 3


def test_tinyimagenet_annotations_naming_a_missing_image_say_so(tmp_path: Path) -> None:
    root = tmp_path / "tiny-imagenet-200"
    (root / "train" / "n01" / "images").mkdir(parents=True)
    (root / "val" / "images").mkdir(parents=True)
    (root / "wnids.txt").write_text("n01\n")
    Image.new("RGB", (64, 64)).save(root / "train" / "n01" / "images" / "a.JPEG")
    Image.new("RGB", (64, 64)).save(root / "val" / "images" / "val_0.JPEG")
    (root / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn01\nval_1.JPEG\tn01\n")
    with pytest.raises(FileNotFoundError, match=r"lists 1 image\(s\) that .*val.images lacks \(e.g. val_1.JPEG\)"):
        load_dataset("tinyimagenet", str(tmp_path))


def test_cinic10_with_too_few_classes_names_the_root(tmp_path: Path) -> None:
    make_cinic(tmp_path / "cinic-10", {"train": 1, "test": 1})
    for split in ("train", "test"):
        for cls in CINIC_CLASSES[3:]:
            shutil.rmtree(tmp_path / "cinic-10" / split / cls)
    with pytest.raises(
        ValueError,
        match=rf"cinic10: the files found under {tmp_path} hold 3 classes, but cinic10 has 10; point root at the "
        r"complete dataset \(--data.root, in Python FederatedDataModule\(root=...\)\)$",
    ):
        FederatedDataModule("cinic10", root=str(tmp_path), num_clients=2, partition="iid").setup()


def test_missing_tinyimagenet_points_to_source(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"tiny-imagenet-200(.|\n)*cs231n.stanford.edu/tiny-imagenet-200.zip"):
        load_dataset("tinyimagenet", str(tmp_path))


# ---------------------------------------------------------------------------------------------------- digits, misc


def test_digits() -> None:
    data = load_dataset("digits")
    check(data, "digits", 1437, 360, 1, 8, 10)
    assert int(data.train_x.max()) == 255 and int(data.train_x.min()) == 0
    assert sorted(data.train_y.unique().tolist()) == list(range(10))
    # stratified: every class has about 20 % of its samples in the test set
    counts_test = torch.bincount(data.test_y, minlength=10)
    counts_all = counts_test + torch.bincount(data.train_y, minlength=10)
    assert ((counts_test.double() / counts_all - 0.2).abs() < 0.02).all()
    # values are round(v * 255 / 16) of sklearn's 0..16 pixels
    allowed = {round(v * 255 / 16) for v in range(17)}
    assert set(data.train_x.unique().tolist()) <= allowed
    again = load_dataset("digits")
    assert torch.equal(again.train_x, data.train_x) and torch.equal(again.test_y, data.test_y)


def test_unknown_dataset() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'.*cifar10.*tinyimagenet"):
        load_dataset("imagenet")


def test_one_registry_names_every_dataset() -> None:
    assert list(DATASETS) == ["digits", "mnist", "fashion_mnist", "cifar10", "cifar100", "cinic10", "tinyimagenet"]
    assert all(info.name == name and callable(info.loader) for name, info in DATASETS.items())
    assert DATASETS["tinyimagenet"].shape == (3, 64, 200) and DATASETS["cifar100"].shape == (3, 32, 100)
    assert [name for name, info in DATASETS.items() if info.searches_system] == ["mnist", "fashion_mnist"]
    assert DATASET_SHAPES == {name: info.shape for name, info in DATASETS.items()}  # the datamodule's, derived


def test_a_dataset_registered_later_has_its_shape_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: DATASET_SHAPES was a copy made at import, without the datasets registered after it.
    monkeypatch.setitem(DATASETS, "tiny", replace(DATASETS["digits"], name="tiny", image_size=4))
    assert DATASET_SHAPES["tiny"] == (1, 4, 10) and "tiny" in DATASET_SHAPES and len(DATASET_SHAPES) == len(DATASETS)


def test_registered_shape_is_the_loaded_one() -> None:
    data = load_dataset("digits")
    assert (data.in_channels, data.image_size, data.num_classes) == DATASETS["digits"].shape


def test_one_entry_makes_a_dataset_known_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    def load(root: Path, download: bool) -> tuple:
        x = torch.arange(26 * 16).reshape(26, 1, 4, 4).to(torch.uint8)
        y = torch.arange(26) % 2
        return x[:20], y[:20], x[20:], y[20:], 2

    monkeypatch.setitem(DATASETS, "tiny", DatasetInfo("tiny", load, channels=1, image_size=4, num_classes=2))
    assert load_dataset("tiny").num_classes == 2
    dm = FederatedDataModule("tiny", num_clients=2, partition="iid", batch_size=4)
    assert dm.input_shape == (1, 4, 4) and dm.num_classes == 2
    dm.setup("fit")
    assert sum(dm.client_sizes) == 20 and len(dm.test_dataloader().dataset) == 6
    with pytest.raises(ValueError, match="unknown dataset 'nope'; choose one of digits, .*, tinyimagenet, tiny"):
        FederatedDataModule("nope")


def _tiny(**changes: object) -> tuple:
    x = torch.arange(26 * 16).reshape(26, 1, 4, 4).to(torch.uint8)
    y = torch.arange(26) % 2
    arrays = {"train_x": x[:20], "train_y": y[:20], "test_x": x[20:], "test_y": y[20:], "num_classes": 2, **changes}
    return tuple(arrays.values())


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (
            {"train_x": torch.zeros(20, 1, 3, 3, dtype=torch.uint8)},
            r"training images of shape \(20, 1, 3, 3\), but tiny images are \[N, 1, 4, 4\]: the files",
        ),
        ({"test_y": torch.zeros(5, dtype=torch.long)}, r"test labels of shape \(5,\) for 6 images"),
        ({"train_y": torch.zeros(20)}, "training labels of dtype torch.float32; return integer class indices"),
        ({"train_y": torch.full((20,), 2)}, r"training labels from 2 to 2; they must be in \[0, 2\)"),
    ],
    ids=["image-size", "label-count", "float-labels", "label-range"],
)
def test_a_registered_loaders_arrays_are_checked(monkeypatch: pytest.MonkeyPatch, changes: dict, match: str) -> None:
    monkeypatch.setitem(
        DATASETS, "tiny", DatasetInfo("tiny", lambda root, download: _tiny(**changes), 1, image_size=4, num_classes=2)
    )
    with pytest.raises(ValueError, match=f"dataset 'tiny': its loader returned {match}") as err:
        load_dataset("tiny")
    assert "\n" not in str(err.value)


def test_a_loaders_int32_labels_are_taken_as_int64(monkeypatch: pytest.MonkeyPatch) -> None:
    y = (torch.arange(26) % 2).int()
    info = DatasetInfo("tiny", lambda root, download: _tiny(train_y=y[:20], test_y=y[20:]), 1, 4, 2)
    monkeypatch.setitem(DATASETS, "tiny", info)
    data = load_dataset("tiny")
    assert data.train_y.dtype == data.test_y.dtype == torch.int64


def test_read_idx_magic(tmp_path: Path) -> None:
    path = tmp_path / "images.gz"
    write_idx(tmp_path / "images", np.full((2, 3, 4), 7, np.uint8), gz=True)
    assert read_idx(path, 2051).shape == (2, 3, 4)
    assert read_idx(path).tolist() == np.full((2, 3, 4), 7).tolist()
    with pytest.raises(ValueError, match="images.gz: bad IDX magic number 2051, expected 2049"):
        read_idx(path, 2049)
    write_idx(tmp_path / "other", np.zeros(3, np.uint8), magic=2052)
    with pytest.raises(ValueError, match="other: bad IDX magic number 2052"):
        read_idx(tmp_path / "other")


def test_truncated_gz_names_the_file(tmp_path: Path) -> None:
    # Before: a cut .gz raised "EOFError: Compressed file ended before the end-of-stream marker" naming no file.
    make_idx(tmp_path, gz=True)
    cut = tmp_path / "train-images-idx3-ubyte.gz"
    cut.write_bytes(cut.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz: cannot be read .*truncated"):
        load_dataset("fashion_mnist", str(tmp_path))


def test_not_gzip_names_the_file(tmp_path: Path) -> None:
    make_idx(tmp_path, gz=True)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte\.gz: cannot be read"):
        load_dataset("mnist", str(tmp_path))


def test_root_missing_one_file_fails_instead_of_using_the_system_copy(tmp_path: Path) -> None:
    # Before: with one of the four files missing in --data.root, Debian's copy was used silently.
    make_idx(tmp_path, gz=True)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match=r"holds 3 of the 4 IDX files; missing: t10k-labels-idx1-ubyte"):
        load_dataset("fashion_mnist", str(tmp_path))


def test_given_root_never_searches_the_system_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("fashion_mnist", str(tmp_path / "empty"))
    assert "/usr/share" not in str(err.value) and str(tmp_path / "empty") in str(err.value)


def test_truncated_cifar_batch_names_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batch = {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]}
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "data_batch_3").write_bytes(pickle.dumps(batch)[:50])
    with pytest.raises(ValueError, match=r"data_batch_3: cannot be read"):
        load_dataset("cifar10", str(tmp_path))

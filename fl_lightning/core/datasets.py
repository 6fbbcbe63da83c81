"""Image-classification datasets read from their standard on-disk formats into uint8 tensors."""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import os
import pickle
import sys
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from fl_lightning.core.augment import input_stats
from fl_lightning.core.files import atomic_path
from fl_lightning.core.messages import option, short
from fl_lightning.core.registry import Registry

#: Folder used when ``root`` is not given.
DEFAULT_ROOT = "./data"

#: Name of the decoded-tensor cache written next to image-folder datasets.
CACHE_NAME = "fl_lightning_cache.pt"
_CACHE_VERSION = 2  # 2: the fingerprint holds a digest of the files

_IDX_IMAGES_MAGIC = 2051
_IDX_LABELS_MAGIC = 2049
_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_IMAGE_SUFFIXES = (".png", ".jpeg", ".jpg")

CINIC10_URL = "https://github.com/BayesWatch/cinic-10"
TINYIMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"


@dataclass(frozen=True, eq=False)
class ImageData:
    """A dataset as tensors: images uint8 [N, C, H, W], labels int64 [N].

    Attributes:
        name: dataset name, one of :data:`DATASETS`.
        train_x: training images, uint8 [N, C, H, W].
        train_y: training labels, int64 [N].
        test_x: test images, uint8 [M, C, H, W].
        test_y: test labels, int64 [M].
        num_classes: number of classes.
        mean: per-channel mean of the training images on the [0, 1] scale.
        std: per-channel standard deviation of the training images on the [0, 1] scale.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def in_channels(self) -> int:
        """Number of image channels C."""
        return int(self.train_x.shape[1])

    @property
    def image_size(self) -> int:
        """Image height H (images are square)."""
        return int(self.train_x.shape[2])


@dataclass(frozen=True)
class DatasetInfo:
    """A built-in dataset, registered in :data:`DATASETS`: how its files are read, and its shape.

    Attributes:
        name: the name ``--data.dataset`` takes.
        loader: ``loader(root, download) -> (train_x, train_y, test_x, test_y, num_classes)``, uint8 images
            ``[N, C, H, W]`` and int64 labels; with ``searches_system`` it also takes ``system=True``.
        channels: image channels C.
        image_size: image side H = W.
        num_classes: number of classes.
        searches_system: when ``root`` is not given, also look where Debian's package installs the files.
    """

    name: str
    loader: Callable[..., _Arrays]
    channels: int
    image_size: int
    num_classes: int
    searches_system: bool = False

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(channels, image_size, num_classes)``, known before any file is read."""
        return self.channels, self.image_size, self.num_classes


def load_dataset(name: str, root: str | None = None, download: bool = False) -> ImageData:
    """Load a dataset by name.

    Args:
        name: one of :data:`DATASETS`.
        root: folder holding the dataset files (default ``./data``); ignored for ``digits``. Only when it is not
            given are MNIST/Fashion-MNIST also looked for where Debian's packages put them.
        download: fetch the data with torchvision when it is not found (MNIST, Fashion-MNIST, CIFAR-10/100).

    Returns:
        The training and test sets as tensors.

    Raises:
        ValueError: unknown name, or a file that is not in the expected format.
        FileNotFoundError: the dataset files were not found, or a folder holds only some of them; the message
            names the missing files and where they were looked for.
    """
    info = DATASETS.get(name)
    if info is None:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    root_dir = Path(root if root is not None else DEFAULT_ROOT).expanduser()
    if root_dir.exists() and not root_dir.is_dir():
        raise ValueError(
            f"root {root_dir} is a file; give the folder that holds (or is to hold) {name}'s files "
            f"({option('data.root', inside=True)})"
        )
    if root is None and info.searches_system:
        train_x, train_y, test_x, test_y, num_classes = info.loader(root_dir, download, system=True)
    else:
        train_x, train_y, test_x, test_y, num_classes = info.loader(root_dir, download)
    train_y = _checked_split(info, "training", train_x, train_y, num_classes)
    test_y = _checked_split(info, "test", test_x, test_y, num_classes)
    chunk = max(1, (1 << 24) // max(1, int(np.prod(train_x.shape[1:]))))
    mean, std = input_stats((train_x[i : i + chunk] for i in range(0, len(train_x), chunk)), image=True)
    return ImageData(name, train_x, train_y, test_x, test_y, num_classes, tuple(mean), tuple(std))


# ----------------------------------------------------------------------------------------------------------------------
# helpers

_Arrays = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]


def _missing(what: str, searched: Sequence[Path], how: str) -> FileNotFoundError:
    """``<what> not found in <a>, <b> or <c>. <how>``: one line of whole sentences (``how`` ends with a full stop)."""
    paths = list(dict.fromkeys(str(p) for p in searched))
    where = paths[0] if len(paths) == 1 else f"{', '.join(paths[:-1])} or {paths[-1]}"
    return FileNotFoundError(f"{what} not found in {where}. {how}")


def _checked_split(info: DatasetInfo, split: str, x: Any, y: Any, num_classes: int) -> torch.Tensor:
    """A loader's ``split``: its labels as int64, or a one-line error naming the dataset and what its loader broke."""
    where = f"dataset {info.name!r}: its loader returned {split}"
    expected = (info.channels, info.image_size, info.image_size)
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or tuple(x.shape[1:]) != expected:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(
            f"{where} images of shape {got}, but {info.name} images are [N, {', '.join(map(str, expected))}]: "
            f"the files are not {info.name}'s standard size (resize them), or a custom DatasetInfo's channels or "
            "image_size are wrong"
        )
    if not isinstance(y, torch.Tensor) or y.dim() != 1 or len(y) != len(x):
        got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"{where} labels of shape {got} for {len(x)} images; return one label per image")
    if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
        raise ValueError(f"{where} labels of dtype {y.dtype}; return integer class indices (int64)")
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"{where} labels from {int(y.min())} to {int(y.max())}; they must be in [0, {num_classes})")
    return y.long()


def _labels_tensor(labels: Sequence[int] | np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.asarray(labels, dtype=np.int64))


# ----------------------------------------------------------------------------------------------------------------------
# digits


@functools.cache
def _digits_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits as uint8 images ``[N, 1, 8, 8]`` and labels, with the stratified 80/20 split's indices.

    Read once a process (parsing scikit-learn's CSV takes longer than a tiny federation's set-up); every load gets
    copies of its own.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)[:, None]
    labels = digits.target.astype(np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=0.2, random_state=0, stratify=labels, shuffle=True
    )
    for array in (images, labels, train_idx, test_idx):
        array.flags.writeable = False
    return images, labels, train_idx, test_idx


def _load_digits(root: Path, download: bool) -> _Arrays:
    images, labels, train_idx, test_idx = _digits_arrays()
    return (
        torch.from_numpy(images[train_idx]),  # indexing copies: a caller may change its tensors in place
        torch.from_numpy(labels[train_idx]),
        torch.from_numpy(images[test_idx]),
        torch.from_numpy(labels[test_idx]),
        10,
    )


# ----------------------------------------------------------------------------------------------------------------------
# MNIST / Fashion-MNIST (IDX files)


def read_idx(path: str | os.PathLike[str], magic: int | None = None) -> np.ndarray:
    """Read an IDX file of unsigned bytes (images ``[N, H, W]`` or labels ``[N]``), gzipped or raw.

    Args:
        path: the file; a name ending in ``.gz`` is read as gzip.
        magic: the magic number the file must have (2051 for images, 2049 for labels); either when None.

    Returns:
        The uint8 array the file holds.

    Raises:
        ValueError: the file is not an IDX images/labels file or is truncated.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (EOFError, OSError, zlib.error) as err:
        raise ValueError(f"{path}: cannot be read ({err or type(err).__name__}); it is truncated or damaged") from err
    if len(raw) < 8:
        raise ValueError(f"{path}: too short to be an IDX file")
    found = int.from_bytes(raw[:4], "big")
    allowed = (magic,) if magic is not None else (_IDX_IMAGES_MAGIC, _IDX_LABELS_MAGIC)
    if found not in allowed or found not in (_IDX_IMAGES_MAGIC, _IDX_LABELS_MAGIC):
        expected = " or ".join(str(m) for m in allowed)
        raise ValueError(
            f"{path}: bad IDX magic number {found}, expected {expected} "
            f"({_IDX_IMAGES_MAGIC} = uint8 images, {_IDX_LABELS_MAGIC} = uint8 labels)"
        )
    ndim = 3 if found == _IDX_IMAGES_MAGIC else 1
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    size = int(np.prod(dims))
    if len(raw) - header != size:
        raise ValueError(f"{path}: IDX dimensions {dims} need {size} bytes of data, found {len(raw) - header}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()


def _find_idx_files(folder: Path) -> list[Path] | None:
    """The four MNIST-style IDX files in ``folder`` (raw preferred over ``.gz``), or None if there are none.

    Raises:
        FileNotFoundError: the folder holds some of the four files but not all (one was lost or not copied).
    """
    found, missing = [], []
    for stem in _IDX_FILES:
        hit = next((c for c in (folder / stem, folder / f"{stem}.gz") if c.is_file()), None)
        if hit is None:
            missing.append(stem)
        else:
            found.append(hit)
    if not found:
        return None
    if missing:
        names = ", ".join(f"{m}[.gz]" for m in missing)
        raise FileNotFoundError(f"{folder} holds {len(found)} of the 4 IDX files; missing: {names}")
    return found


def _idx_loader(tv_folder: str, system_dir: str, title: str, tv_class: str, apt_package: str | None) -> Callable:
    def load(root: Path, download: bool, system: bool = False) -> _Arrays:
        candidates = [root, root / tv_folder / "raw", *([Path(system_dir)] if system else [])]
        files = next((f for f in map(_find_idx_files, candidates) if f is not None), None)
        if files is None and download:
            import torchvision.datasets as tvd

            root.mkdir(parents=True, exist_ok=True)
            for train in (True, False):
                getattr(tvd, tv_class)(str(root), train=train, download=True)
            files = _find_idx_files(root / tv_folder / "raw")
        if files is None:
            how = f"Pass {option('data.download', True)} to download it with torchvision into {root}"
            if apt_package:
                how += f", or install Debian's package (apt-get install {apt_package}) and leave the root unset "
                how += "(no --data.root; in Python FederatedDataModule(root=None))"
            names = ", ".join(_IDX_FILES)
            raise _missing(f"{title} ({names}, raw or .gz)", candidates, how + ".")
        magics = (_IDX_IMAGES_MAGIC, _IDX_LABELS_MAGIC) * 2
        train_x, train_y, test_x, test_y = (read_idx(f, m) for f, m in zip(files, magics, strict=True))
        for images, labels, split in ((train_x, train_y, "train"), (test_x, test_y, "t10k")):
            if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
                raise ValueError(
                    f"{title} {split} files in {files[0].parent} disagree: images {images.shape}, labels {labels.shape}"
                )
        return (
            torch.from_numpy(train_x[:, None]),
            _labels_tensor(train_y),
            torch.from_numpy(test_x[:, None]),
            _labels_tensor(test_y),
            10,
        )

    return load


# ----------------------------------------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 (python pickles)


def _read_cifar_batch(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
    except (EOFError, OSError, pickle.UnpicklingError, ValueError) as err:
        raise ValueError(f"{path}: cannot be read ({err or type(err).__name__}); it is truncated or damaged") from err
    if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
        raise ValueError(f"{path}: not a CIFAR python batch (expected keys b'data' and {label_key!r})")
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    labels = np.asarray(batch[label_key], dtype=np.int64)
    if data.size != len(labels) * 3 * 32 * 32:
        raise ValueError(f"{path}: {data.size} pixel values for {len(labels)} labels, expected 3072 per label")
    return data.reshape(-1, 3, 32, 32), labels


def _cifar_loader(
    folder: str, train_files: tuple[str, ...], test_file: str, label_key: bytes, classes: int, tv_class: str
) -> Callable:
    title = tv_class.replace("CIFAR", "CIFAR-")

    def find(root: Path, download: bool = False) -> Path | None:
        """The first of ``root/folder`` and ``root`` that holds any batch; it must hold all (no fall-back).

        With ``download``, a partial ``root/folder`` is left to torchvision, which extracts the batches again.
        """
        for d in (root / folder, root):
            names = (*train_files, test_file)
            missing = [name for name in names if not (d / name).is_file()]
            if len(missing) < len(names):
                if missing and download and d == root / folder:
                    return None
                if missing:
                    raise FileNotFoundError(
                        f"{d} holds {len(names) - len(missing)} of the {len(names)} {title} batches; missing: "
                        f"{', '.join(missing)} (copy them there, or remove the folder to download it again)"
                    )
                return d
        return None

    def load(root: Path, download: bool) -> _Arrays:
        directory = find(root, download)
        if directory is None and download:
            import torchvision.datasets as tvd

            root.mkdir(parents=True, exist_ok=True)
            for train in (True, False):
                getattr(tvd, tv_class)(str(root), train=train, download=True)
            directory = find(root)
        if directory is None:
            names = ", ".join((*train_files, test_file))
            raise _missing(
                f"{title} python batches ({names})",
                [root / folder, root],
                f"Pass {option('data.download', True)} to download it with torchvision into {root}.",
            )
        batches = [_read_cifar_batch(directory / name, label_key) for name in train_files]
        test_x, test_y = _read_cifar_batch(directory / test_file, label_key)
        return (
            torch.from_numpy(np.concatenate([x for x, _ in batches])),
            torch.from_numpy(np.concatenate([y for _, y in batches])),
            torch.from_numpy(test_x),
            torch.from_numpy(test_y),
            classes,
        )

    return load


# ----------------------------------------------------------------------------------------------------------------------
# image folders (CINIC-10, Tiny-ImageNet), decoded once and cached


def _is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in _IMAGE_SUFFIXES


def _decode_rgb(path: Path) -> np.ndarray:
    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (OSError, SyntaxError, ValueError) as err:  # PIL's UnidentifiedImageError is an OSError
        raise ValueError(f"{path}: cannot be decoded ({err}); it is truncated or damaged") from err


def _decode_images(paths: Sequence[Path]) -> torch.Tensor:
    """Decode same-sized images to a uint8 tensor [N, 3, H, W]."""
    if not paths:
        return torch.zeros((0, 3, 0, 0), dtype=torch.uint8)
    first = _decode_rgb(paths[0])
    out = np.empty((len(paths), *first.shape), dtype=np.uint8)
    workers = min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for i, (path, img) in enumerate(zip(paths, pool.map(_decode_rgb, paths), strict=True)):
            if img.shape != first.shape:
                raise ValueError(f"{path}: image of shape {img.shape}, expected {first.shape} like {paths[0]}")
            out[i] = img
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


def _files_digest(directory: Path, splits: dict[str, tuple[list[Path], list[int]]]) -> str:
    """A digest of each split's image files as they are now: relative path, size, modification time, label."""
    digest = hashlib.sha256()
    for split in ("train", "test"):
        for path, label in zip(*splits[split], strict=True):
            stat = path.stat()
            digest.update(f"{split}|{path.relative_to(directory)}|{stat.st_size}|{stat.st_mtime_ns}|{label}\n".encode())
    return digest.hexdigest()


def _cached_or_decoded(
    name: str,
    directory: Path,
    splits: dict[str, tuple[list[Path], list[int]]],
    num_classes: int,
) -> _Arrays:
    """Decode the ``train`` and ``test`` splits, or reuse the cache in ``directory`` when it matches the files.

    The cache matches when every image's path (relative to ``directory``), size, modification time and label are as
    they were when it was written: a file moved to another class folder, replaced or edited is decoded again.
    """
    count = [len(splits["train"][0]), len(splits["test"][0])]
    fingerprint = [*count, num_classes, _files_digest(directory, splits)]
    cache = directory / CACHE_NAME
    if cache.is_file():
        try:
            saved = torch.load(cache, weights_only=True)
            if (
                saved.get("version") == _CACHE_VERSION
                and saved.get("name") == name
                and list(saved.get("fingerprint", [])) == fingerprint
            ):
                return saved["train_x"], saved["train_y"], saved["test_x"], saved["test_y"], num_classes
        except Exception:  # noqa: BLE001 - an unreadable cache is rebuilt
            pass
    total = count[0] + count[1]
    print(f"{name}: decoding {total} images from {directory} (cached afterwards in {cache})", file=sys.stderr)
    arrays: list[torch.Tensor] = []
    for split in ("train", "test"):
        paths, labels = splits[split]
        arrays += [_decode_images(paths), _labels_tensor(labels)]
    train_x, train_y, test_x, test_y = arrays
    payload = {
        "version": _CACHE_VERSION,
        "name": name,
        "fingerprint": fingerprint,
        "train_x": train_x,
        "train_y": train_y,
        "test_x": test_x,
        "test_y": test_y,
    }
    with contextlib.suppress(OSError), atomic_path(cache) as tmp:  # a read-only dataset folder: no cache
        torch.save(payload, tmp)
    return train_x, train_y, test_x, test_y, num_classes


def _load_cinic10(root: Path, download: bool) -> _Arrays:
    candidates = [root, root / "cinic-10", root / "CINIC-10"]
    directory = next((d for d in candidates if all((d / s).is_dir() for s in ("train", "test"))), None)
    if directory is None:
        raise _missing(
            "CINIC-10 (train/<class>/*.png and test/<class>/*.png; valid/ is not read)",
            candidates,
            f"It cannot be downloaded automatically; get it from {CINIC10_URL} and extract it into {root}.",
        )
    classes = sorted(p.name for p in (directory / "train").iterdir() if p.is_dir())
    splits: dict[str, tuple[list[Path], list[int]]] = {}
    for split in ("train", "test"):
        split_classes = sorted(p.name for p in (directory / split).iterdir() if p.is_dir())
        if split_classes != classes:
            raise ValueError(f"{directory / split}: class folders {split_classes} differ from train's {classes}")
        paths: list[Path] = []
        labels: list[int] = []
        for label, cls in enumerate(classes):
            files = sorted(p for p in (directory / split / cls).iterdir() if _is_image(p))
            paths += files
            labels += [label] * len(files)
        splits[split] = (paths, labels)
    return _cached_or_decoded("cinic10", directory, splits, len(classes))


def _load_tinyimagenet(root: Path, download: bool) -> _Arrays:
    candidates = [root / "tiny-imagenet-200", root]
    directory = next((d for d in candidates if (d / "wnids.txt").is_file() and (d / "train").is_dir()), None)
    if directory is None:
        raise _missing(
            "Tiny-ImageNet (wnids.txt, train/<wnid>/images/*.JPEG, val/images/*.JPEG, val/val_annotations.txt)",
            candidates,
            f"It cannot be downloaded automatically; get {TINYIMAGENET_URL} and unzip it into {root}.",
        )
    wnids = sorted({line.strip() for line in (directory / "wnids.txt").read_text().splitlines() if line.strip()})
    index = {wnid: i for i, wnid in enumerate(wnids)}
    train_paths: list[Path] = []
    train_labels: list[int] = []
    for wnid in wnids:
        image_dir = directory / "train" / wnid / "images"
        if not image_dir.is_dir():
            raise FileNotFoundError(f"Tiny-ImageNet: {image_dir} is missing (class {wnid} of wnids.txt)")
        files = sorted(p for p in image_dir.iterdir() if _is_image(p))
        train_paths += files
        train_labels += [index[wnid]] * len(files)
    annotations = directory / "val" / "val_annotations.txt"
    if not annotations.is_file():
        raise FileNotFoundError(f"Tiny-ImageNet: {annotations} is missing")
    test_paths: list[Path] = []
    test_labels: list[int] = []
    for n, line in enumerate(annotations.read_text().splitlines(), 1):
        fields = line.strip().split("\t")
        if not fields[0]:
            continue
        if len(fields) < 2 or fields[1] not in index:
            raise ValueError(f"{annotations}:{n}: expected 'filename<TAB>wnid...' with a wnid of wnids.txt: {line!r}")
        test_paths.append(directory / "val" / "images" / fields[0])
        test_labels.append(index[fields[1]])
    absent = [p for p in test_paths if not p.is_file()]
    if absent:
        raise FileNotFoundError(
            f"Tiny-ImageNet: {annotations} lists {len(absent)} image(s) that {directory / 'val' / 'images'} lacks "
            f"(e.g. {absent[0].name}); the annotations and the images disagree: extract val/ again"
        )
    splits = {"train": (train_paths, train_labels), "test": (test_paths, test_labels)}
    return _cached_or_decoded("tinyimagenet", directory, splits, len(wnids))


_load_mnist = _idx_loader("MNIST", "/usr/share/datasets/mnist", "MNIST", "MNIST", None)
_load_fashion_mnist = _idx_loader(
    "FashionMNIST", "/usr/share/datasets/fashion-mnist", "Fashion-MNIST", "FashionMNIST", "dataset-fashion-mnist"
)
_load_cifar10 = _cifar_loader(
    "cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)), "test_batch", b"labels", 10, "CIFAR10"
)
_load_cifar100 = _cifar_loader("cifar-100-python", ("train",), "test", b"fine_labels", 100, "CIFAR100")


#: Every built-in dataset by name, the one place a dataset is registered (its loader and shape); add a
#: :class:`DatasetInfo` here to make another name known to :func:`load_dataset` and ``--data.dataset``.
def _dataset_entry(name: str, entry: object) -> str | None:
    """What is wrong with a :data:`DATASETS` entry, if anything."""
    if not isinstance(entry, DatasetInfo):
        return f"must be a DatasetInfo, got {short(entry)}"
    return None if entry.name == name else f"must be registered under its name {entry.name!r}"


DATASETS: Registry[DatasetInfo] = Registry(
    "DATASETS",
    _dataset_entry,
    {
        info.name: info
        for info in (
            DatasetInfo("digits", _load_digits, channels=1, image_size=8, num_classes=10),
            DatasetInfo("mnist", _load_mnist, channels=1, image_size=28, num_classes=10, searches_system=True),
            DatasetInfo(
                "fashion_mnist", _load_fashion_mnist, channels=1, image_size=28, num_classes=10, searches_system=True
            ),
            DatasetInfo("cifar10", _load_cifar10, channels=3, image_size=32, num_classes=10),
            DatasetInfo("cifar100", _load_cifar100, channels=3, image_size=32, num_classes=100),
            DatasetInfo("cinic10", _load_cinic10, channels=3, image_size=32, num_classes=10),
            DatasetInfo("tinyimagenet", _load_tinyimagenet, channels=3, image_size=64, num_classes=200),
        )
    },
)

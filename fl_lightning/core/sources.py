"""A user's own data: :class:`DataSource`, its splits held as tensors or read item by item, and their labels.

A split is a pair of tensors ``(inputs, labels)`` or a map-style dataset of ``(x, y)`` items. :func:`load_source`
calls a source's ``load()`` once and checks what it returns; :func:`as_split` turns one split into a
:class:`SplitData`, whose labels are always in memory and whose inputs are either tensors or read through a
:class:`DatasetReader` (a ``DataLoader`` over the dataset, for data too large for memory).

>>> import torch
>>> split = as_split((torch.arange(12.0).reshape(6, 2), torch.tensor([0, 1, 0, 1, 2, 2])), "demo", None, 0, False)
>>> split.x.shape, split.reader is None
(torch.Size([6, 2]), True)
>>> [y.tolist() for _, y in split.chunks(4)]
[[0, 1, 0, 1], [2, 2]]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

__all__ = [
    "STATS_CHUNK",
    "DataSource",
    "DatasetReader",
    "GivenData",
    "InputsOf",
    "LoadedSource",
    "Split",
    "SplitData",
    "as_split",
    "check_class_maps",
    "dataset_labels",
    "first_input",
    "item_input",
    "load_source",
]

#: Items per chunk when input statistics are accumulated (the same chunks in memory and streamed, so both agree).
STATS_CHUNK = 1024

#: One split of a user's data: a pair of tensors (inputs, labels), or a map-style dataset whose items are (x, y).
Split = Union[tuple[Tensor, Tensor], Dataset]  # noqa: UP007 (a runtime alias, Python 3.10)

#: Where a message for the user goes (the datamodule passes Lightning's ``rank_zero_info``).
Info = Callable[[str], object]


class DataSource:
    """Your own data for a :class:`~fl_lightning.FederatedDataModule`; subclass it to name your data in a YAML config.

    Implement :meth:`load`; the datamodule calls it once, when it is constructed. In a config::

        data:
          dataset:
            class_path: mypkg.data.WineData      # a DataSource subclass
            init_args: {test_size: 0.25}
          partition: dirichlet

    ``client_ids`` (for ``partition: given``) may name an attribute of the training dataset or of this object.
    """

    #: Name recorded in results (``summary.json``'s ``dataset``); the class name when None.
    name: str | None = None

    def load(self) -> tuple[Split, Split] | tuple[Split, Split, Split]:
        """The training and test data, each a (inputs, labels) tensor pair or a dataset of (x, y) items.

        A third item, if returned, is validation data for a module's ``validation_step`` (instead of the holdout).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement load() -> (train, test)")


class GivenData(DataSource):
    """Data given in Python (what ``FederatedDataModule.from_tensors`` and ``from_datasets`` wrap)."""

    def __init__(self, train: Split, test: Split, name: str, val: Split | None = None) -> None:
        self.train, self.test, self.name, self.val = train, test, name, val

    def load(self) -> tuple[Split, Split] | tuple[Split, Split, Split]:
        """The training, test (and validation) data as given."""
        return (self.train, self.test) if self.val is None else (self.train, self.test, self.val)


class DatasetReader:
    """Reads a map-style dataset of ``(x, y)`` items in given batches of indices, through a ``DataLoader``.

    Args:
        dataset: the dataset; only the items of the requested batches are read.
        num_workers: loader worker processes (0: read in the main process).
        pin_memory: put batches in pinned memory, for faster non-blocking copies to a GPU.
    """

    def __init__(self, dataset: Dataset, num_workers: int = 0, pin_memory: bool = False) -> None:
        self.dataset, self.num_workers, self.pin_memory = dataset, num_workers, pin_memory

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def batches(self, index_batches: Sequence[list[int]]) -> Iterator[tuple[Tensor, Tensor]]:
        """The batches of items at ``index_batches``, in that order, as stacked ``(x, y)`` CPU tensors."""
        if len(index_batches) == 0:
            return
        loader = DataLoader(
            self.dataset,
            batch_sampler=index_batches,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
        )
        # Starting the loader draws its workers' base seed from torch's global generator, which a client's
        # augmentation and dropout draw from too: put it back, so that streamed data trains as in-memory data does.
        state = torch.random.get_rng_state()
        batches = iter(loader)
        torch.random.set_rng_state(state)
        for x, y in batches:
            yield x, torch.as_tensor(y).long()

    def read(self, indices: Sequence[int], chunk: int = STATS_CHUNK) -> tuple[Tensor, Tensor]:
        """The items at ``indices`` as two tensors."""
        idx = [int(i) for i in indices]
        parts = list(self.batches([idx[s : s + chunk] for s in range(0, len(idx), chunk)]))
        if not parts:
            x0, _ = self.dataset[0]
            return torch.empty((0, *torch.as_tensor(x0).shape), dtype=torch.as_tensor(x0).dtype), torch.empty(0).long()
        return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


def dataset_labels(dataset: Dataset, info: Info | None = None) -> Tensor:
    """Every item's label, read from the dataset's ``targets``/``labels`` when it has them, else item by item.

    Args:
        dataset: a map-style dataset of ``(x, y)`` items.
        info: told when the labels are read item by item (one pass over the dataset).
    """
    if isinstance(dataset, TensorDataset):
        return _as_labels(dataset.tensors[1], type(dataset).__name__)
    if isinstance(dataset, Subset):
        return dataset_labels(dataset.dataset, info)[torch.as_tensor(list(dataset.indices), dtype=torch.long)]
    for attr in ("targets", "labels"):
        values = getattr(dataset, attr, None)
        if values is not None and not callable(values) and len(values) == len(dataset):  # type: ignore[arg-type]
            return _as_labels(values, f"{type(dataset).__name__}.{attr}")
    if info is not None:
        info(
            f"{type(dataset).__name__} has no targets attribute: reading all {len(dataset)} items once for their labels"  # type: ignore[arg-type]
        )
    reader = DatasetReader(dataset)
    return reader.read(range(len(dataset)))[1]  # type: ignore[arg-type]


def _as_labels(values: Any, what: str) -> Tensor:
    y = torch.as_tensor(np.asarray(values))
    if y.ndim != 1 or y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"{what}: labels must be a 1-D integer array of class indices, got {y.dtype} {tuple(y.shape)}")
    if y.numel() and int(y.min()) < 0:
        raise ValueError(f"{what}: labels must be class indices >= 0, found {int(y.min())}")
    return y.long()


@dataclass
class SplitData:
    """A labelled set held as tensors (``x``) or read from a dataset (``reader``); ``y`` is always in memory."""

    y: Tensor
    x: Tensor | None = None
    reader: DatasetReader | None = None

    def gather(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        """The items at ``idx`` as tensors (read from the dataset when streamed)."""
        if self.x is not None:
            return self.x[idx], self.y[idx]
        assert self.reader is not None
        x, y = self.reader.read(idx.tolist())
        return x, y

    def chunks(self, size: int) -> Iterator[tuple[Tensor, Tensor]]:
        """All items in order, ``size`` at a time."""
        n = len(self.y)
        if self.x is not None:
            for start in range(0, n, size):
                yield self.x[start : start + size], self.y[start : start + size]
        else:
            assert self.reader is not None
            yield from self.reader.batches([list(range(s, min(n, s + size))) for s in range(0, n, size)])


def as_split(
    data: Split, what: str, in_memory: bool | None, num_workers: int, pin_memory: bool, info: Info | None = None
) -> SplitData:
    """A user's split as tensors or as a streamed dataset, checked.

    Args:
        data: an ``(inputs, labels)`` pair (tensors or arrays) or a map-style dataset of ``(x, y)`` items.
        what: what the split is, for error messages (``"the training data"``).
        in_memory: hold it as tensors (True) or read it item by item (False); None: tensors stay in memory, a
            ``TensorDataset`` is read into memory and other datasets are streamed.
        num_workers: ``DataLoader`` workers of a streamed split.
        pin_memory: pin a streamed split's batches in memory.
        info: told when a dataset's labels are read item by item.
    """
    if isinstance(data, tuple | list):
        if len(data) != 2:
            raise ValueError(f"{what} must be a pair (inputs, labels) or a dataset, got {len(data)} items")
        x, y = (torch.as_tensor(np.asarray(v)) if not isinstance(v, Tensor) else v for v in data)
        y = _as_labels(y, f"{what} labels")
        if x.ndim < 2 or len(x) != len(y):
            raise ValueError(f"{what}: inputs {tuple(x.shape)} need one row per label ({len(y)})")
        if in_memory is False:
            return SplitData(y, reader=DatasetReader(TensorDataset(x, y), num_workers, pin_memory))
        return SplitData(y, x=x)
    if not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
        raise TypeError(
            f"{what} must be a pair of tensors or a map-style dataset (with __getitem__ and __len__) of (x, y) items, "
            f"got {type(data).__name__}"
        )
    if len(data) == 0:
        raise ValueError(f"{what} is an empty dataset")
    item_input(data[0])
    y = dataset_labels(data, info)
    if in_memory is None and isinstance(data, TensorDataset):
        in_memory = True
    reader = DatasetReader(data, num_workers, pin_memory)
    if in_memory:
        x, y_read = reader.read(range(len(y)))
        return SplitData(y_read, x=x)
    return SplitData(y, reader=reader)


class InputsOf(Dataset):
    """The inputs of a dataset of ``(x, y)`` items."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Tensor:
        return item_input(self.dataset[index])


def first_input(split: SplitData) -> Tensor:
    """The split's first input."""
    if split.x is not None:
        return split.x[0]
    assert split.reader is not None
    return item_input(split.reader.dataset[0])


def item_input(item: Any) -> Tensor:
    """The input of a dataset item, checked to be a tensor (or array) in an (x, y) pair."""
    if not isinstance(item, tuple | list) or len(item) != 2:
        raise TypeError(f"dataset items must be (x, y) pairs, got {type(item).__name__}")
    x = item[0]
    if not isinstance(x, Tensor | np.ndarray):
        raise TypeError(
            f"dataset inputs must be tensors, got {type(x).__name__}; give the dataset a transform that makes "
            "tensors (for images: torchvision.transforms.PILToTensor())"
        )
    return torch.as_tensor(x)


@dataclass(frozen=True)
class LoadedSource:
    """A :class:`DataSource`'s splits, checked, with the inputs' shape and the number of classes they hold.

    Attributes:
        train: the training data.
        test: the test data.
        val: the validation data, when the source gives any.
        raw_train: the training data as ``load()`` returned it (``client_ids`` may name one of its attributes).
        input_shape: the shape of one input.
        input_dtype: the inputs' dtype.
        num_classes: the number of classes (the largest label + 1 unless given).
    """

    train: SplitData
    test: SplitData
    val: SplitData | None
    raw_train: Split
    input_shape: tuple[int, ...]
    input_dtype: torch.dtype
    num_classes: int


def _class_map(split: Split | None) -> dict[str, int] | None:
    mapping = getattr(split, "class_to_idx", None)
    if mapping is None and isinstance(split, Subset):
        mapping = getattr(split.dataset, "class_to_idx", None)
    return dict(mapping) if isinstance(mapping, dict) else None


def check_class_maps(train: Split, test: Split, val: Split | None = None) -> None:
    """Refuse splits whose ``class_to_idx`` (torchvision's folder datasets) give a class different labels.

    Two ``ImageFolder`` trees number their classes by the sorted folder names each holds, so a test tree that lacks
    one class shifts every label after it: a model would be scored against the wrong classes, silently.
    """
    reference = _class_map(train)
    if reference is None:
        return
    for split, what in ((test, "test"), (val, "validation")):
        other = _class_map(split)
        if other is None or other == reference:
            continue
        missing = sorted(set(reference) - set(other))
        extra = sorted(set(other) - set(reference))
        moved = sorted(c for c in set(reference) & set(other) if reference[c] != other[c])
        parts = [f"missing {_names(missing)}" if missing else "", f"extra {_names(extra)}" if extra else ""]
        detail = "; ".join(p for p in parts if p) or f"{_names(moved)} numbered differently"
        raise ValueError(
            f"the {what} data's classes differ from the training data's ({detail}): the labels would not mean the "
            f"same class; give both the same class folders (or build the {what} dataset with the training set's "
            "classes, e.g. an ImageFolder subclass whose find_classes returns them)"
        )


def _names(classes: Sequence[str], shown: int = 5) -> str:
    listed = ", ".join(repr(c) for c in classes[:shown])
    return listed + (f" and {len(classes) - shown} more" if len(classes) > shown else "")


def load_source(
    source: DataSource,
    name: str,
    num_classes: int | None,
    in_memory: bool | None,
    num_workers: int,
    pin_memory: bool,
    info: Info | None = None,
) -> LoadedSource:
    """Call ``source.load()`` and check its splits: the same input shape in training and test, at least 2 classes.

    Args:
        source: the user's data.
        name: what results call the data (for error messages).
        num_classes: the number of classes when it is not the largest label + 1.
        in_memory: as for :func:`as_split`.
        num_workers: as for :func:`as_split`.
        pin_memory: as for :func:`as_split`.
        info: told when a dataset's labels are read item by item.
    """
    loaded = source.load()
    if not isinstance(loaded, tuple | list) or len(loaded) not in (2, 3):
        raise TypeError(
            f"{type(source).__name__}.load() must return (train, test) or (train, test, val), "
            f"got {type(loaded).__name__}"
        )
    if all(isinstance(part, Tensor) for part in loaded):  # (x, y) of one split, not (train, test)
        raise TypeError(
            f"{type(source).__name__}.load() returned {len(loaded)} tensors; return the splits, each a pair of "
            "tensors or a dataset: ((x_train, y_train), (x_test, y_test))"
        )
    train, test, val = (*loaded, None)[:3]
    check_class_maps(train, test, val)
    opts = (in_memory, num_workers, pin_memory, info)
    train_split = as_split(train, "the training data", *opts)
    test_split = as_split(test, "the test data", *opts)
    val_split = as_split(val, "the validation data", *opts) if val is not None else None
    for split, what in ((train_split, "training"), (test_split, "test")):
        if len(split.y) == 0:
            raise ValueError(f"the {what} data is empty; the federation needs {what} samples")
    first, first_test = first_input(train_split), first_input(test_split)
    if first.shape != first_test.shape:
        raise ValueError(f"training inputs have shape {tuple(first.shape)}, test inputs {tuple(first_test.shape)}")
    largest = max(int(train_split.y.max()), int(test_split.y.max()) if len(test_split.y) else 0)
    if num_classes is not None and num_classes <= largest:
        raise ValueError(f"num_classes={num_classes} but the data has label {largest}; raise num_classes")
    classes = num_classes if num_classes is not None else largest + 1
    if classes < 2:
        raise ValueError(f"{name}: need at least 2 classes, the labels hold only {classes}")
    return LoadedSource(
        train_split, test_split, val_split, train, tuple(int(d) for d in first.shape), first.dtype, classes
    )

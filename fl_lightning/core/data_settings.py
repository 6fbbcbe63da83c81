"""A federated datamodule's options, checked, and what they settle before the data is split.

:func:`resolve_data_settings` checks the options, looks a built-in dataset's shape up in the registry or loads a
:class:`~fl_lightning.core.sources.DataSource` (once), and returns a :class:`DataSettings`: the name results record,
the partitioner, the number of clients and classes, and the shape of one input. Nothing is partitioned yet.

>>> settings = resolve_data_settings("digits", "iid", num_clients=4)
>>> settings.dataset, settings.num_clients, settings.num_classes, settings.input_shape
('digits', 4, 10, (1, 8, 8))
>>> resolve_data_settings("digits", "iid", num_clients=0)
Traceback (most recent call last):
    ...
ValueError: num_clients must be an integer of at least 1 (or None), got 0
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fl_lightning.core.datasets import DATASETS
from fl_lightning.core.messages import option, options, require_bool, require_integer
from fl_lightning.core.partitions import Given, Partitioner, client_id_array, make_partitioner, unused_partitioners
from fl_lightning.core.sources import DataSource, Info, LoadedSource, load_source

__all__ = [
    "DATASET_SHAPES",
    "DataSettings",
    "check_augment",
    "check_options",
    "resolve_client_ids",
    "resolve_data_settings",
]


class _DatasetShapes(Mapping[str, tuple[int, int, int]]):
    """``DATASETS``' shapes, read from it on each access (a dataset registered later is in it too)."""

    def __getitem__(self, name: str) -> tuple[int, int, int]:
        return DATASETS[name].shape

    def __iter__(self) -> Iterator[str]:
        return iter(DATASETS)

    def __len__(self) -> int:
        return len(DATASETS)


#: (channels, image size, classes) of each registered dataset, known before any file is read (from ``DATASETS``).
DATASET_SHAPES: Mapping[str, tuple[int, int, int]] = _DatasetShapes()


@dataclass(frozen=True)
class DataSettings:
    """What a datamodule's options settle before any data is split.

    Attributes:
        dataset: the name results record (a built-in dataset's name, or the source's ``name`` or class name).
        partitioner: how the training samples are split across clients.
        num_clients: the number of clients N.
        num_classes: the number of classes C.
        input_shape: the shape of one input (``[C, H, W]`` for images).
        input_dtype: the inputs' dtype as stored.
        source: the user's data source (None for a built-in dataset).
        loaded: the source's splits, loaded and checked (None for a built-in dataset).
        client_ids: for a ``given`` partition, the client of every training sample.
        client_names: for a ``given`` partition, the distinct client ids, sorted (client i is ``client_names[i]``).
    """

    dataset: str
    partitioner: Partitioner
    num_clients: int
    num_classes: int
    input_shape: tuple[int, ...]
    input_dtype: torch.dtype
    source: DataSource | None = None
    loaded: LoadedSource | None = None
    client_ids: np.ndarray | None = None
    client_names: list[Any] = field(default_factory=list)

    def recorded_hparams(self, partition: str | Partitioner) -> dict[str, Any]:
        """The hyper-parameters recorded as resolved rather than as given.

        The dataset's name, its class count (loggers merge it with the model's, which must agree), the number of
        clients, and a partition object as ``config.yaml`` holds it (class path and ``init_args``).
        """
        part = self.partitioner
        return {
            "dataset": self.dataset,
            "num_classes": self.num_classes,
            "num_clients": self.num_clients,
            "partition": partition
            if isinstance(partition, str)
            else {"class_path": f"{type(part).__module__}.{type(part).__qualname__}", "init_args": part.init_args()},
        }


def check_options(
    partitioner: Partitioner,
    client_ids: Any,
    num_clients: int | None,
    holdout_per_class: int,
    batch_size: int,
    eval_batch_size: int,
    num_workers: int,
) -> Given | None:
    """Check the options that need no data; return the partitioner when it is a ``given`` partition.

    Raises:
        ValueError: ``client_ids`` without a ``given`` partition (or given twice, or missing), a count out of range.
    """
    given = partitioner if isinstance(partitioner, Given) else None
    if client_ids is not None and given is None:
        raise ValueError(
            f"client_ids are only used by partition 'given', not {partitioner.label!r}; set partition: given"
        )
    if given is not None and (client_ids is None) == (given.client_ids is None):
        raise ValueError(
            "partition 'given' needs client_ids (the client of every training sample)"
            if client_ids is None
            else "client_ids are given twice, to the datamodule and to its Given partition; give them once"
        )
    require_integer("num_clients", num_clients, least=1, optional=True)
    require_integer("holdout_per_class", holdout_per_class, least=0)
    require_integer("batch_size", batch_size)
    require_integer("eval_batch_size", eval_batch_size)
    if batch_size < 1 or eval_batch_size < 1:
        raise ValueError(
            f"batch sizes must be positive, got batch_size={batch_size} and eval_batch_size={eval_batch_size}; "
            f"give at least 1 ({options('data.batch_size', 'data.eval_batch_size', inside=True)})"
        )
    require_integer("num_workers", num_workers, least=0)
    return given


def check_augment(augment: tuple[int, bool, int], input_shape: tuple[int, ...], name: str) -> None:
    """Refuse a crop padding or Cutout size below 0, or as large as the images (a crop or a cut can then blank one).

    >>> check_augment((4, True, 8), (3, 32, 32), "cifar10")
    >>> check_augment((0, False, 9), (1, 8, 8), "digits")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    ValueError: cutout must be 0 (off) or a square side below digits's image side 8, got 9; set it between 0 and 7 ...
    """
    side = min(input_shape[1:]) if len(input_shape) == 3 else None
    require_bool("hflip", augment[1])
    for setting, value in (("crop_padding", augment[0]), ("cutout", augment[2])):
        require_integer(setting, value)
        if value < 0 or (side is not None and value >= side):
            what = "a padding" if setting == "crop_padding" else "a square side"
            limit = f" below {name}'s image side {side}" if side is not None else ""
            fix = f"between 0 and {side - 1}" if side is not None else "to 0 or more"
            raise ValueError(
                f"{setting} must be 0 (off) or {what}{limit}, got {value}; set it {fix} "
                f"({option('data.' + setting, inside=True)})"
            )


def resolve_client_ids(client_ids: Any, source: DataSource | None, loaded: LoadedSource | None) -> np.ndarray:
    """The client of every training sample, as an array.

    Args:
        client_ids: the ids, or the name of an attribute of the training dataset or of ``source`` holding them.
        source: the user's data source (None for a built-in dataset, whose ids are checked against its samples
            when it is loaded).
        loaded: the source's splits.
    """
    if isinstance(client_ids, str):
        holders = [] if loaded is None else [loaded.raw_train, source]
        found = next((getattr(h, client_ids) for h in holders if hasattr(h, client_ids)), None)
        if found is None:
            raise ValueError(
                f"client_ids={client_ids!r}: neither the training dataset nor the data source has that attribute; "
                "give the attribute holding each sample's client, or the ids themselves"
            )
        client_ids = found
    ids = client_id_array(client_ids)
    n = len(loaded.train.y) if loaded is not None else None
    if n is not None and len(ids) != n:
        raise ValueError(f"client_ids has {len(ids)} entries for {n} training samples; give one id per sample")
    return ids


def resolve_data_settings(
    dataset: str | DataSource,
    partition: str | Partitioner,
    num_clients: int | None = None,
    *,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    classes_per_client: int = 2,
    min_client_size: int = 10,
    holdout_per_class: int = 0,
    batch_size: int = 64,
    eval_batch_size: int = 1024,
    augment: tuple[int, bool, int] = (0, False, 0),
    client_ids: str | list[int] | list[str] | None = None,
    num_classes: int | None = None,
    in_memory: bool | None = None,
    num_workers: int = 0,
    pin_memory: bool = False,
    info: Info | None = None,
) -> DataSettings:
    """Check a datamodule's options and settle the dataset, partitioner, clients and classes (loading a source).

    The arguments are the :class:`~fl_lightning.FederatedDataModule` options of the same names; ``augment`` is its
    ``(crop_padding, hflip, cutout)`` and ``info`` is told when a dataset's labels are read item by item.

    Raises:
        ValueError: an option out of range, or options that disagree with each other or with the data.
        TypeError: ``dataset`` is neither a dataset name nor a :class:`~fl_lightning.core.sources.DataSource`.
    """
    short_options = {
        "alpha": alpha,
        "shards_per_client": shards_per_client,
        "classes_per_client": classes_per_client,
        "min_client_size": min_client_size,
    }
    partitioner = make_partitioner(partition, **short_options)
    given = check_options(
        partitioner, client_ids, num_clients, holdout_per_class, batch_size, eval_batch_size, num_workers
    )
    require_integer("num_classes", num_classes, least=1, optional=True)
    require_bool("in_memory", in_memory, optional=True)
    require_bool("pin_memory", pin_memory)
    source, loaded = None, None
    if isinstance(dataset, str):
        if dataset not in DATASETS:
            raise ValueError(
                f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}, "
                "or use FederatedDataModule.from_tensors / from_datasets / a DataSource for your own data"
            )
        name = dataset
        channels, size, classes = DATASETS[dataset].shape
        if num_classes is not None and num_classes != classes:
            raise ValueError(f"{dataset} has {classes} classes, not num_classes={num_classes}")
        input_shape: tuple[int, ...] = (channels, size, size)
        input_dtype = torch.uint8
    elif isinstance(dataset, DataSource):
        source, name = dataset, dataset.name or type(dataset).__name__
        loaded = load_source(dataset, name, num_classes, in_memory, num_workers, pin_memory, info)
        input_shape, input_dtype, classes = loaded.input_shape, loaded.input_dtype, loaded.num_classes
    else:
        raise TypeError(
            f"dataset must be a dataset name or a DataSource, got {type(dataset).__name__}; for tensors or "
            "datasets use FederatedDataModule.from_tensors(...) or FederatedDataModule.from_datasets(...)"
        )
    if any(augment) and len(input_shape) != 3:
        raise ValueError(
            f"augmentation (crop_padding, hflip, cutout) needs image inputs [C, H, W]; {name}'s inputs "
            f"have shape {input_shape}; turn it off"
        )
    check_augment(augment, input_shape, name)
    unused = unused_partitioners(partition, **short_options) if isinstance(partition, str) else []
    for checked in (partitioner, *unused):
        checked.check_num_classes(classes)
    ids, names = None, []
    if given is not None:
        ids = resolve_client_ids(client_ids if client_ids is not None else given.client_ids, source, loaded)
        names = np.unique(ids).tolist()
        if num_clients is not None and num_clients != len(names):
            raise ValueError(
                f"client_ids name {len(names)} distinct clients but num_clients is {num_clients}; "
                "leave num_clients unset or make them agree"
            )
        num_clients = len(names)
    return DataSettings(
        name,
        partitioner,
        int(num_clients) if num_clients is not None else 10,
        classes,
        input_shape,
        input_dtype,
        source,
        loaded,
        ids,
        names,
    )

"""The federated data: a datamodule holding a dataset (as tensors, or read per item) and its split across clients."""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Union

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from fl_lightning.core.augment import BatchTransform, InputNormalization, input_stats
from fl_lightning.core.context import ClientContext, ServerContext
from fl_lightning.core.datasets import DATASETS, ImageData, load_dataset
from fl_lightning.core.evaluation import Evaluation, evaluate
from fl_lightning.core.partitions import Given, Partitioner, class_counts, client_id_array, make_partitioner
from fl_lightning.core.rounds import RoundPlan, RoundPlanner, client_steps, round_seed
from fl_lightning.lightning_internals import record_initial_hparam

#: (channels, image size, classes) of each built-in dataset, known before any file is read (from ``DATASETS``).
DATASET_SHAPES: dict[str, tuple[int, int, int]] = {name: info.shape for name, info in DATASETS.items()}


#: Items per chunk when input statistics are accumulated (the same chunks in memory and streamed, so both agree).
_STATS_CHUNK = 1024

#: One split of a user's data: a pair of tensors (inputs, labels), or a map-style dataset whose items are (x, y).
Split = Union[tuple[Tensor, Tensor], Dataset]  # noqa: UP007 (a runtime alias, Python 3.10)


def _round_planner(trainer: L.Trainer | None) -> RoundPlanner | None:
    """The trainer's callback that plans rounds (the Federation), if any."""
    callbacks = trainer.callbacks if trainer is not None else ()
    return next((cb for cb in callbacks if isinstance(cb, RoundPlanner)), None)


class DataSource:
    """Your own data for a :class:`FederatedDataModule`; subclass it to name your data in a YAML config.

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
    """Data given in Python (what :meth:`FederatedDataModule.from_tensors` and ``from_datasets`` wrap)."""

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

    def batches(self, index_batches: Sequence[Sequence[int]]) -> Iterator[tuple[Tensor, Tensor]]:
        """The batches of items at ``index_batches``, in that order, as stacked ``(x, y)`` CPU tensors."""
        if len(index_batches) == 0:
            return
        loader = DataLoader(
            self.dataset,
            batch_sampler=index_batches,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
        )
        for x, y in loader:
            yield x, torch.as_tensor(y).long()

    def read(self, indices: Sequence[int], chunk: int = _STATS_CHUNK) -> tuple[Tensor, Tensor]:
        """The items at ``indices`` as two tensors."""
        idx = [int(i) for i in indices]
        parts = list(self.batches([idx[s : s + chunk] for s in range(0, len(idx), chunk)]))
        if not parts:
            x0, _ = self.dataset[0]
            return torch.empty((0, *torch.as_tensor(x0).shape), dtype=torch.as_tensor(x0).dtype), torch.empty(0).long()
        return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


class ClientBatches:
    """One client's local batches of a round, in training order; iterating yields ``(x, y)`` after ``transform``.

    It is one item of :class:`RoundBatches`: the client's data (``x``, ``y``, stored once) and the positions of
    each local batch in it (``batches``). Lightning moves it to the device as a whole and one ``training_step``
    trains on all of it, so the per-batch cost of Lightning's loop is paid once per client instead of once per local
    step. Batches are gathered and transformed (augmentation, normalisation) lazily, just before each step, in the
    same order as a per-batch loop would.
    """

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        batches: list[Tensor],
        transform: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        self.x, self.y, self.batches, self.transform = x, y, batches, transform

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        for pos in self.batches:
            x = self.x[pos]
            yield (self.transform(x) if self.transform is not None else x), self.y[pos]

    def to(self, device: torch.device | str, **kwargs: Any) -> ClientBatches:
        """The same batches on ``device`` (Lightning's batch transfer calls this)."""
        return ClientBatches(
            self.x.to(device, **kwargs),
            self.y.to(device, **kwargs),
            [b.to(device, **kwargs) for b in self.batches],
            self.transform,
        )

    def with_transform(self, transform: Callable[[Tensor], Tensor]) -> ClientBatches:
        """The same batches, each passed through ``transform`` when iterated."""
        return ClientBatches(self.x, self.y, self.batches, transform)


class _RoundStream:
    """One round's local batches of all its clients, read once, in order, through one loader."""

    def __init__(self, reader: DatasetReader, index_batches: list[list[int]]) -> None:
        self.reader, self.index_batches = reader, index_batches
        self._it: Iterator[tuple[Tensor, Tensor]] | None = None
        self._pos = 0

    def take(self, start: int, count: int) -> Iterator[tuple[Tensor, Tensor]]:
        """Batches ``start .. start + count - 1`` of the round (a client's); clients must be read in order."""
        if self._it is None:
            self._it = self.reader.batches(self.index_batches)
        if self._pos > start:
            raise RuntimeError("a streamed round's clients are read once each, in order; this one was already read")
        while self._pos < start:  # the previous client stopped early: skip the rest of its batches
            next(self._it)
            self._pos += 1
        for _ in range(count):
            batch = next(self._it)
            self._pos += 1
            yield batch


class StreamedClientBatches:
    """A :class:`ClientBatches` whose batches are read from the dataset as they are trained on.

    Items are read through the round's ``DataLoader`` (workers, pinned memory), moved to ``device`` batch by batch,
    then transformed; the positions are those of the in-memory path.
    """

    def __init__(
        self,
        stream: _RoundStream,
        start: int,
        count: int,
        transform: Callable[[Tensor], Tensor] | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        self.stream, self.start, self.count = stream, start, count
        self.transform, self.device = transform, device

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        non_blocking = self.stream.reader.pin_memory
        for x, y in self.stream.take(self.start, self.count):
            if self.device is not None:
                x, y = x.to(self.device, non_blocking=non_blocking), y.to(self.device, non_blocking=non_blocking)
            yield (self.transform(x) if self.transform is not None else x), y

    def to(self, device: torch.device | str, **kwargs: Any) -> StreamedClientBatches:
        """The same batches, each moved to ``device`` when read (Lightning's batch transfer calls this)."""
        return StreamedClientBatches(self.stream, self.start, self.count, self.transform, device)

    def with_transform(self, transform: Callable[[Tensor], Tensor]) -> StreamedClientBatches:
        """The same batches, each passed through ``transform`` when iterated."""
        return StreamedClientBatches(self.stream, self.start, self.count, transform, self.device)


class ClientGroup:
    """Several clients' local batches of a round, trained together by the batched engine as one training batch.

    ``run`` is attached by the engine when the batch starts (:class:`~fl_lightning.batched.BatchedClients`); the
    method's ``training_step`` calls it.
    """

    def __init__(self, clients: list[ClientBatches]) -> None:
        self.clients = clients
        self.run: Callable[..., Tensor | None] | None = None

    def __len__(self) -> int:
        return len(self.clients)

    def to(self, device: torch.device | str, **kwargs: Any) -> ClientGroup:
        """The same clients' batches on ``device`` (Lightning's batch transfer calls this)."""
        return ClientGroup([c.to(device, **kwargs) for c in self.clients])

    def with_transform(self, transform: Callable[[Tensor], Tensor]) -> ClientGroup:
        """The same batches, each passed through ``transform`` when iterated."""
        return ClientGroup([c.with_transform(transform) for c in self.clients])


class RoundBatches:
    """Iterable over one round's clients: each planned client in turn, as a :class:`ClientBatches`.

    A client's batches are its ``local_epochs`` shuffled passes over its data. With ``flat=True`` it yields every
    local ``(x, y)`` batch of every client in order instead (for modules that train one Lightning batch per step);
    with ``group=n``, a :class:`ClientGroup` of up to ``n`` consecutive clients per item (the batched engine).

    Shuffling uses a generator seeded by (seed, round, client), so a round's batches do not depend on what ran
    before it; that is what makes an interrupted run resume bit-for-bit. When ``x`` is a :class:`DatasetReader`
    (data too large for memory) the same positions are read through its ``DataLoader``, only for the round's clients.

    Args:
        x: the training inputs, as a tensor or a reader of the training items (positions as in ``y``).
        y: the training labels.
        client_indices: each client's positions in ``x``.
        plan: the round.
        batch_size: local batch size.
        drop_last: drop each client's last incomplete batch of an epoch.
        seed: seed of the shuffling.
        flat: iterate over single local batches rather than over clients.
        group: iterate over groups of this many clients (``None``: one client per item).
    """

    def __init__(
        self,
        x: Tensor | DatasetReader,
        y: Tensor,
        client_indices: list[Tensor],
        plan: RoundPlan,
        batch_size: int,
        drop_last: bool,
        seed: int,
        flat: bool = False,
        group: int | None = None,
    ) -> None:
        if group is not None and (flat or isinstance(x, DatasetReader) or group < 1):
            raise ValueError("client groups need in-memory data, whole clients per item and a group size >= 1")
        self.group = group
        self.x, self.y = x, y
        self.client_indices = client_indices
        self.plan = plan
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.seed = seed
        self.flat = flat

    def __len__(self) -> int:
        if self.group is not None:
            return -(-len(self.plan.clients) // self.group)
        if not self.flat:
            return len(self.plan.clients)
        return sum(
            client_steps(self.client_indices[c].numel(), self.batch_size, self.plan.local_epochs, self.drop_last)
            for c in self.plan.clients
        )

    def __iter__(self) -> Iterator[ClientGroup | ClientBatches | StreamedClientBatches | tuple[Tensor, Tensor]]:
        if self.group is not None:  # one group's clients in memory at a time
            clients = self._clients()
            while group := list(itertools.islice(clients, self.group)):
                yield ClientGroup(group)
        elif self.flat:
            yield from self.batches()
        elif isinstance(self.x, DatasetReader):
            # client -1: an empty update that keeps processes in step (Federation.local_plan)
            per_client = [self._index_batches(c) if c >= 0 else [] for c in self.plan.clients]
            stream = _RoundStream(self.x, [b for client in per_client for b in client])
            start = 0
            for batches in per_client:
                yield StreamedClientBatches(stream, start, len(batches))
                start += len(batches)
        else:
            yield from self._clients()

    def _clients(self) -> Iterator[ClientBatches]:
        assert isinstance(self.x, Tensor)
        for client in self.plan.clients:
            if client < 0:  # padding that keeps processes in step (Federation.local_plan)
                yield ClientBatches(self.x[:0], self.y[:0], [])
                continue
            idx = self.client_indices[client]
            yield ClientBatches(self.x[idx], self.y[idx], list(self._positions(client)))

    def _positions(self, client: int) -> Iterator[Tensor]:
        """Positions, within the client's data, of each of its local batches this round, in training order."""
        bs = self.batch_size
        n = self.client_indices[client].numel()
        gen = torch.Generator().manual_seed(round_seed(self.seed, self.plan.round, client))
        stop = n - n % bs if self.drop_last else n
        for _ in range(self.plan.local_epochs):
            perm = torch.randperm(n, generator=gen)
            for start in range(0, stop, bs):
                yield perm[start : start + bs]

    def _index_batches(self, client: int) -> list[list[int]]:
        """The client's local batches as lists of positions in ``x``."""
        idx = self.client_indices[client]
        return [idx[pos].tolist() for pos in self._positions(client)]

    def batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        """Every local batch of the round, client after client, gathered from the full data (for hand-written loops)."""
        if isinstance(self.x, DatasetReader):
            yield from self.x.batches([b for c in self.plan.clients for b in self._index_batches(c)])
            return
        for client in self.plan.clients:
            idx = self.client_indices[client]
            for pos in self._positions(client):
                batch = idx[pos]
                yield self.x[batch], self.y[batch]


# ----------------------------------------------------------------------------------------------------------------------
# a user's data: labels, shapes and statistics


def dataset_labels(dataset: Dataset) -> Tensor:
    """Every item's label, read from the dataset's ``targets``/``labels`` when it has them, else item by item."""
    if isinstance(dataset, TensorDataset):
        return _as_labels(dataset.tensors[1], type(dataset).__name__)
    if isinstance(dataset, Subset):
        return dataset_labels(dataset.dataset)[torch.as_tensor(list(dataset.indices), dtype=torch.long)]
    for attr in ("targets", "labels"):
        values = getattr(dataset, attr, None)
        if values is not None and not callable(values) and len(values) == len(dataset):  # type: ignore[arg-type]
            return _as_labels(values, f"{type(dataset).__name__}.{attr}")
    rank_zero_info(
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
class _Split:
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


def _split(data: Split, what: str, in_memory: bool | None, num_workers: int, pin_memory: bool) -> _Split:
    """A user's split as tensors or as a streamed dataset (``in_memory`` None: tensors in memory, datasets streamed)."""
    if isinstance(data, tuple | list):
        if len(data) != 2:
            raise ValueError(f"{what} must be a pair (inputs, labels) or a dataset, got {len(data)} items")
        x, y = (torch.as_tensor(np.asarray(v)) if not isinstance(v, Tensor) else v for v in data)
        y = _as_labels(y, f"{what} labels")
        if x.ndim < 2 or len(x) != len(y):
            raise ValueError(f"{what}: inputs {tuple(x.shape)} need one row per label ({len(y)})")
        if in_memory is False:
            return _Split(y, reader=DatasetReader(TensorDataset(x, y), num_workers, pin_memory))
        return _Split(y, x=x)
    if not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
        raise TypeError(
            f"{what} must be a pair of tensors or a map-style dataset (with __getitem__ and __len__) of (x, y) items, "
            f"got {type(data).__name__}"
        )
    if len(data) == 0:  # type: ignore[arg-type]
        raise ValueError(f"{what} is an empty dataset")
    _item_input(data[0])
    y = dataset_labels(data)
    if in_memory is None and isinstance(data, TensorDataset):
        in_memory = True
    reader = DatasetReader(data, num_workers, pin_memory)
    if in_memory:
        x, y_read = reader.read(range(len(y)))
        return _Split(y_read, x=x)
    return _Split(y, reader=reader)


class _Inputs(Dataset):
    """The inputs of a dataset of ``(x, y)`` items."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Tensor:
        return _item_input(self.dataset[index])


def _first_input(split: _Split) -> Tensor:
    if split.x is not None:
        return split.x[0]
    assert split.reader is not None
    return _item_input(split.reader.dataset[0])


def _item_input(item: Any) -> Tensor:
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


# ----------------------------------------------------------------------------------------------------------------------
# the datamodule


class FederatedDataModule(L.LightningDataModule):
    """A dataset split across ``num_clients`` clients, plus the global test set and a server-side holdout.

    Inputs are kept as given (uint8 images stay uint8); batches are converted to float, augmented and normalised on
    the training device after transfer. Data that is not a pair of tensors (e.g. a torchvision ``ImageFolder``) is not
    loaded: each round reads only its clients' items, through a ``DataLoader`` (``num_workers``, ``pin_memory``).
    The training loader of a round is planned by the trainer's :class:`~fl_lightning.Federation` callback (a
    :class:`~fl_lightning.core.rounds.RoundPlanner`), which it asks for the round's plan.

    Your own data: :meth:`from_tensors`, :meth:`from_datasets`, or (also from YAML) a :class:`DataSource` as
    ``dataset``.

    Args:
        dataset: one of ``digits`` (scikit-learn, embedded), ``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100``,
            ``cinic10``, ``tinyimagenet``; or a :class:`DataSource` (your own data).
        root: folder holding the dataset files (default ``./data``; Fashion-MNIST is also found where Debian's
            ``dataset-fashion-mnist`` package puts it).
        download: fetch the data with torchvision when it is missing (MNIST, Fashion-MNIST, CIFAR; needs internet).
        partition: a name, configured by the short options below: ``iid``, ``dirichlet`` (LDA), ``shard``,
            ``classes_per_client`` (NIID-Bench's #C=k), or ``given`` (each sample's client named by ``client_ids``);
            or a :class:`~fl_lightning.core.partitions.Partitioner` holding its own parameters (in YAML ``class_path:
            fl_lightning.core.partitions.Dirichlet`` with ``init_args``), the short options then left at their defaults.
        num_clients: number of clients N (default 10; with ``given``, the number of distinct ids).
        alpha: Dirichlet concentration α (> 0) for ``dirichlet``; smaller is more skewed. The short options of a
            partition other than the named one are ignored.
        shards_per_client: shards s per client for ``shard``.
        classes_per_client: labels k per client for ``classes_per_client``.
        min_client_size: ``dirichlet`` re-draws until every client holds at least this many samples.
        holdout_per_class: training samples per class kept out of every client, for the server's auxiliary data
            (FedSSD's credibility set, FedKA's shared set). Use the same value for all methods you compare.
        batch_size: local training batch size.
        eval_batch_size: batch size of the global evaluation.
        drop_last: drop each client's last incomplete batch of an epoch.
        crop_padding: random-crop padding in pixels for training batches (0 disables; images only).
        hflip: random horizontal flips of training batches (images only).
        cutout: Cutout square size in pixels for training batches (0 disables; images only).
        normalize: standardise inputs with the training data's mean and standard deviation, per channel for images
            and per feature for feature vectors (uint8 inputs on the [0, 1] scale, others on their own scale).
        client_ids: for ``given`` (a name or a ``Given()`` without ids): the client of every training sample
            (integers or strings, any values), or the name of an attribute of the training dataset (or of the
            :class:`DataSource`) holding them.
        num_classes: for your own data, the number of classes when it is not the largest label + 1.
        in_memory: hold the training and test data as tensors (True), read them item by item per round (False);
            None: tensors stay in memory and datasets are streamed.
        num_workers: DataLoader workers reading streamed items.
        pin_memory: pin streamed batches in memory (faster copies to a GPU).
        seed: seed of the partition and the holdout (and of a built-in network's initialisation at fit start).
    """

    def __init__(
        self,
        dataset: str | DataSource = "digits",
        root: str | None = None,
        download: bool = False,
        partition: str | Partitioner = "dirichlet",
        num_clients: int | None = None,
        alpha: float = 0.5,
        shards_per_client: int = 2,
        classes_per_client: int = 2,
        min_client_size: int = 10,
        holdout_per_class: int = 0,
        batch_size: int = 64,
        eval_batch_size: int = 1024,
        drop_last: bool = False,
        crop_padding: int = 0,
        hflip: bool = False,
        cutout: int = 0,
        normalize: bool = True,
        client_ids: str | list[int] | list[str] | None = None,
        num_classes: int | None = None,
        in_memory: bool | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        #: How the training samples are split across clients (what the partition short options configure).
        self.partitioner: Partitioner = make_partitioner(
            partition,
            alpha=alpha,
            shards_per_client=shards_per_client,
            classes_per_client=classes_per_client,
            min_client_size=min_client_size,
        )
        given = self.partitioner if isinstance(self.partitioner, Given) else None
        if client_ids is not None and given is None:
            raise ValueError(
                f"client_ids are only used by partition 'given', not {self.partitioner.label!r}; set partition: given"
            )
        if given is not None and (client_ids is None) == (given.client_ids is None):
            raise ValueError(
                "partition 'given' needs client_ids (the client of every training sample)"
                if client_ids is None
                else "client_ids are given twice, to the datamodule and to its Given partition; give them once"
            )
        if num_clients is not None and num_clients < 1:
            raise ValueError(f"num_clients must be at least 1, got {num_clients}")
        if holdout_per_class < 0:
            raise ValueError(f"holdout_per_class must be >= 0, got {holdout_per_class}")
        if batch_size < 1 or eval_batch_size < 1:
            raise ValueError(f"batch sizes must be positive, got {batch_size} and {eval_batch_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.root = root
        self.download = download
        self.holdout_per_class = holdout_per_class
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.drop_last = drop_last
        self.normalize = normalize
        self.in_memory = in_memory
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.seed = seed
        self._augment_args = (crop_padding, hflip, cutout)
        self._source: DataSource | None = None
        self._train_all: _Split | None = None
        self._test: _Split | None = None
        self._val: _Split | None = None  # the user's validation data, if any (else the holdout validates)
        self._client_ids: np.ndarray | None = None
        self.client_names: list[Any] = []

        if isinstance(dataset, str):
            if dataset not in DATASETS:
                raise ValueError(
                    f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}, "
                    "or use FederatedDataModule.from_tensors / from_datasets / a DataSource for your own data"
                )
            self.dataset = dataset
            channels, size, classes = DATASETS[dataset].shape
            if num_classes is not None and num_classes != classes:
                raise ValueError(f"{dataset} has {classes} classes, not num_classes={num_classes}")
            self.input_shape: tuple[int, ...] = (channels, size, size)
            self.input_dtype = torch.uint8
            self.num_classes = classes
        elif isinstance(dataset, DataSource):
            self._source = dataset
            self.dataset = dataset.name or type(dataset).__name__
            self._load_source(dataset, num_classes)
        else:
            raise TypeError(
                f"dataset must be a dataset name or a DataSource, got {type(dataset).__name__}; for tensors or "
                "datasets use FederatedDataModule.from_tensors(...) or FederatedDataModule.from_datasets(...)"
            )
        if any(self._augment_args) and not self.is_image:
            raise ValueError(
                f"augmentation (crop_padding, hflip, cutout) needs image inputs [C, H, W]; {self.dataset}'s inputs "
                f"have shape {self.input_shape}; turn it off"
            )
        self.partitioner.check_num_classes(self.num_classes)
        if given is not None:
            self._client_ids = self._resolve_client_ids(client_ids if client_ids is not None else given.client_ids)
            self.client_names = np.unique(self._client_ids).tolist()
            if num_clients is not None and num_clients != len(self.client_names):
                raise ValueError(
                    f"client_ids name {len(self.client_names)} distinct clients but num_clients is {num_clients}; "
                    "leave num_clients unset or make them agree"
                )
            num_clients = len(self.client_names)
        num_clients = num_clients if num_clients is not None else 10
        self.num_clients = num_clients
        self.save_hyperparameters(ignore=["dataset", "client_ids"])
        # Recorded as resolved (loggers merge num_classes with the model's, which must agree; the CLI saves the
        # values it was given): the dataset's name, its class count, the number of clients, and a partition object
        # as config.yaml holds it (class path and init_args).
        part = self.partitioner
        recorded = {
            "dataset": self.dataset,
            "num_classes": self.num_classes,
            "num_clients": num_clients,
            "partition": partition
            if isinstance(partition, str)
            else {"class_path": f"{type(part).__module__}.{type(part).__qualname__}", "init_args": part.init_args()},
        }
        for name, value in recorded.items():
            record_initial_hparam(self, name, value)

        self.data: ImageData | None = None
        self.train_x: Tensor | None = None
        self.train_y: Tensor
        self.aux_x: Tensor
        self.aux_y: Tensor
        self._train_reader: DatasetReader | None = None
        self.client_indices: list[Tensor] = []
        self.client_class_counts: np.ndarray = np.zeros((0, self.num_classes), dtype=np.int64)
        self.transform: BatchTransform | None = None

    @property
    def trainer(self) -> L.Trainer | None:
        """The Trainer this datamodule is attached to."""
        return self.__dict__.get("_attached_trainer")

    @trainer.setter
    def trainer(self, trainer: L.Trainer | None) -> None:
        # Lightning attaches the datamodule before it reads max_epochs or resolves ckpt_path="last", and before any
        # callback hook runs: the one moment a Federation callback can set the rounds and where checkpoints live.
        self.__dict__["_attached_trainer"] = trainer
        planner = _round_planner(trainer)
        if planner is not None:
            planner.prepare_trainer(trainer)

    # ---- construction from your own data ----------------------------------------------------------------------

    @classmethod
    def from_tensors(
        cls,
        train_x: Tensor | np.ndarray,
        train_y: Tensor | np.ndarray,
        test_x: Tensor | np.ndarray,
        test_y: Tensor | np.ndarray,
        name: str = "tensors",
        val: tuple[Tensor | np.ndarray, Tensor | np.ndarray] | None = None,
        **kwargs: Any,
    ) -> FederatedDataModule:
        """Federate data held in memory: inputs of any shape and dtype, one row per sample, integer labels.

        Images are ``[N, C, H, W]`` (uint8 or float, any H and W), feature vectors ``[N, D]``.

        Args:
            train_x: training inputs.
            train_y: training labels, class indices ``[N]``.
            test_x: test inputs.
            test_y: test labels.
            name: what results call the dataset.
            val: validation ``(inputs, labels)`` for a module's ``validation_step`` (default: the server holdout).
            **kwargs: the partition, client, batch and other options of :class:`FederatedDataModule`.
        """
        return cls(dataset=GivenData((train_x, train_y), (test_x, test_y), name, val), **kwargs)  # type: ignore[arg-type]

    @classmethod
    def from_datasets(
        cls, train: Dataset, test: Dataset, name: str | None = None, val: Dataset | None = None, **kwargs: Any
    ) -> FederatedDataModule:
        """Federate map-style datasets whose items are ``(x, y)`` (e.g. a torchvision ``ImageFolder``).

        A ``TensorDataset`` is held in memory; any other dataset is streamed: each round reads only its clients'
        items through a ``DataLoader`` (``num_workers``, ``pin_memory``), so it need not fit in memory. Items must
        be tensors (give an ``ImageFolder`` ``transform=torchvision.transforms.PILToTensor()``; images may differ
        in size only if your transform makes them equal). Labels come from the dataset's ``targets`` when it has
        them, otherwise from one pass over its items.

        Args:
            train: training dataset.
            test: test dataset.
            name: what results call the dataset (default: the training dataset's class name).
            val: validation dataset for a module's ``validation_step`` (default: the server holdout).
            **kwargs: the options of :class:`FederatedDataModule` (``partition``, ``client_ids``, ``in_memory``, ...).
        """
        source = GivenData(train, test, name or type(train).__name__, val)
        return cls(dataset=source, **kwargs)  # type: ignore[arg-type]

    def _load_source(self, source: DataSource, num_classes: int | None) -> None:
        loaded = source.load()
        if not isinstance(loaded, tuple | list) or len(loaded) not in (2, 3):
            raise TypeError(
                f"{type(source).__name__}.load() must return (train, test) or (train, test, val), "
                f"got {type(loaded).__name__}"
            )
        train, test, val = (*loaded, None)[:3]
        opts = (self.in_memory, self.num_workers, self.pin_memory)
        self._train_all = _split(train, "the training data", *opts)
        self._test = _split(test, "the test data", *opts)
        self._val = _split(val, "the validation data", *opts) if val is not None else None
        self._raw_train = train
        first, first_test = _first_input(self._train_all), _first_input(self._test)
        if first.shape != first_test.shape:
            raise ValueError(f"training inputs have shape {tuple(first.shape)}, test inputs {tuple(first_test.shape)}")
        self.input_shape = tuple(int(d) for d in first.shape)
        self.input_dtype = first.dtype
        largest = max(int(self._train_all.y.max()), int(self._test.y.max()) if len(self._test.y) else 0)
        if num_classes is not None and num_classes <= largest:
            raise ValueError(f"num_classes={num_classes} but the data has label {largest}; raise num_classes")
        self.num_classes = num_classes if num_classes is not None else largest + 1
        if self.num_classes < 2:
            raise ValueError(f"{self.dataset}: need at least 2 classes, the labels hold only {self.num_classes}")

    def _resolve_client_ids(self, client_ids: Any) -> np.ndarray:
        if isinstance(client_ids, str):
            holders = [self._raw_train, self._source] if self._source is not None else []
            found = next((getattr(h, client_ids) for h in holders if hasattr(h, client_ids)), None)
            if found is None:
                raise ValueError(
                    f"client_ids={client_ids!r}: neither the training dataset nor the data source has that attribute; "
                    "give the attribute holding each sample's client, or the ids themselves"
                )
            client_ids = found
        ids = client_id_array(client_ids)
        n = len(self._train_all.y) if self._train_all is not None else None
        if n is not None and len(ids) != n:
            raise ValueError(f"client_ids has {len(ids)} entries for {n} training samples; give one id per sample")
        return ids

    # ---- what the inputs are ----------------------------------------------------------------------------------

    @property
    def is_image(self) -> bool:
        """Whether each input is an image ``[C, H, W]``."""
        return len(self.input_shape) == 3

    @property
    def in_channels(self) -> int | None:
        """Image channels C (None for inputs that are not images)."""
        return self.input_shape[0] if self.is_image else None

    @property
    def image_size(self) -> int | tuple[int, int] | None:
        """Image side for square images, (height, width) otherwise; None for inputs that are not images."""
        if not self.is_image:
            return None
        h, w = self.input_shape[1], self.input_shape[2]
        return h if h == w else (h, w)

    @property
    def streaming(self) -> bool:
        """Whether training items are read per round from a dataset rather than held as tensors."""
        return self._train_reader is not None

    @property
    def partition_label(self) -> str:
        """Short human-readable name of the partition, e.g. ``dirichlet(0.5)`` (the partitioner's label)."""
        return self.partitioner.label

    # ---- setup ------------------------------------------------------------------------------------------------

    def setup(self, stage: str | None = None) -> None:
        """Load the dataset, set the holdout aside and partition the rest (once)."""
        if self.client_indices:
            return
        if self._source is None:
            data = load_dataset(self.dataset, self.root, self.download)
            if data.num_classes != self.num_classes:
                raise RuntimeError(
                    f"{self.dataset} loaded with {data.num_classes} classes, expected {self.num_classes}"
                )
            self.data = data
            self._train_all, self._test = _Split(data.train_y, x=data.train_x), _Split(data.test_y, x=data.test_x)
            stats: tuple[Sequence[float], Sequence[float]] | None = (data.mean, data.std)
        else:
            stats = self._own_stats() if self.normalize else None
        if not self.normalize:
            stats = None
        assert self._train_all is not None and self._test is not None
        train_all = self._train_all
        train_idx, aux_idx = self._holdout(train_all.y.numpy())
        self.aux_x, self.aux_y = train_all.gather(aux_idx)
        self.train_y = train_all.y[train_idx].contiguous()
        if train_all.x is not None:
            self.train_x = train_all.x[train_idx].contiguous()
        else:
            assert train_all.reader is not None
            full = train_all.reader.dataset
            keep = full if len(aux_idx) == 0 else Subset(full, train_idx.tolist())
            self._train_reader = DatasetReader(keep, self.num_workers, self.pin_memory)
        if self._source is not None and self._train_reader is None and self._test.x is not None:
            mean, std = stats if stats is not None else ((), ())
            self.data = ImageData(
                self.dataset, train_all.x, train_all.y, self._test.x, self._test.y, self.num_classes, mean, std
            )  # type: ignore[arg-type]

        if self.num_clients > len(self.train_y):
            raise ValueError(
                f"more clients ({self.num_clients}) than training samples ({len(self.train_y)}); "
                "lower --data.num_clients"
            )
        partitioner = self.partitioner
        if self._client_ids is not None:
            if len(self._client_ids) != len(train_all.y):
                raise ValueError(
                    f"client_ids has {len(self._client_ids)} entries for {len(train_all.y)} training samples; "
                    "give one id per sample"
                )
            partitioner = Given(self._client_ids[train_idx.numpy()])  # the ids of the samples left after the holdout
        parts = partitioner(self.train_y.numpy(), self.num_clients, seed=self.seed)
        empty = [i for i, p in enumerate(parts) if len(p) == 0]
        if empty:
            raise ValueError(
                f"the {self.partition_label} partition left clients {empty[:10]} without samples; "
                "use fewer clients or a less skewed partition"
            )
        self.client_indices = [torch.as_tensor(p, dtype=torch.long) for p in parts]
        self.client_class_counts = class_counts(self.train_y.numpy(), parts, self.num_classes)
        crop, flip, cut = self._augment_args
        mean, std = stats if stats is not None else (None, None)
        self.transform = BatchTransform(mean, std, crop, flip, cut, image=self.is_image)
        rank_zero_info(
            f"{self.dataset}: {len(self.train_y)} training samples over {self.num_clients} clients "
            f"({self.partition_label}; sizes {min(map(len, parts))}-{max(map(len, parts))}), "
            f"{len(self.aux_y)} held out for the server, {len(self._test.y)} test samples"
            + (" (streamed)" if self.streaming else "")
        )

    def _own_stats(self) -> tuple[list[float], list[float]]:
        """Normalisation statistics of all the training inputs (one pass over a streamed dataset)."""
        assert self._train_all is not None
        return input_stats((x for x, _ in self._train_all.chunks(_STATS_CHUNK)), self.is_image)

    def _holdout(self, labels: np.ndarray) -> tuple[Tensor, Tensor]:
        """Positions of the kept training samples and of the server's holdout (``holdout_per_class`` per class)."""
        rng = np.random.default_rng(self.seed)
        keep = np.ones(len(labels), dtype=bool)
        aux: list[np.ndarray] = []
        if self.holdout_per_class:
            for c in range(self.num_classes):
                members = np.flatnonzero(labels == c)
                if len(members) <= self.holdout_per_class:
                    raise ValueError(
                        f"holdout_per_class={self.holdout_per_class} would take every training sample of class {c} "
                        f"({len(members)} samples); lower --data.holdout_per_class"
                    )
                aux.append(np.sort(rng.choice(members, self.holdout_per_class, replace=False)))
            aux_idx = np.concatenate(aux)
            keep[aux_idx] = False
        else:
            aux_idx = np.zeros(0, dtype=np.int64)
        return torch.from_numpy(np.flatnonzero(keep)), torch.from_numpy(aux_idx)

    # ---- what the federation reads ----------------------------------------------------------------------------

    @property
    def client_sizes(self) -> list[int]:
        """Number of training samples of each client."""
        return [int(idx.numel()) for idx in self.client_indices]

    def server_context(self, plan: RoundPlan, weights: Sequence[float], **fields: Any) -> ServerContext:
        """The server's view of round ``plan.round``: the data's part here, the callback's in ``fields``."""
        assert self.transform is not None, "server_context needs setup() first"
        return ServerContext(
            round=plan.round,
            clients=plan.clients,
            weights=tuple(weights),
            num_clients=self.num_clients,
            aux_x=self.aux_x,
            aux_y=self.aux_y,
            num_classes=self.num_classes,
            client_class_counts=torch.as_tensor(self.client_class_counts),
            transform=self.transform,
            **fields,
        )

    def client_context(self, round_idx: int, client: int, **fields: Any) -> ClientContext:
        """What ``client`` knows of its data in round ``round_idx`` (read lazily); the callback's part in ``fields``."""
        assert self.transform is not None, "client_context needs setup() first"
        return ClientContext(
            round=round_idx,
            client=client,
            num_samples=int(self.client_indices[client].numel()),
            class_counts=torch.as_tensor(self.client_class_counts[client]),
            read_data=functools.partial(self.client_data, client),
            transform=self.transform,
            **fields,
        )

    def input_sample(self, device: torch.device | str = "cpu") -> Tensor:
        """One training input as a network receives it (normalised, not augmented), on ``device``."""
        assert self.transform is not None, "input_sample needs setup() first"
        x = self.train_x[:1] if self.train_x is not None else self._train_reader.read([0])[0]
        return self.transform(x.to(device), False)[0]

    def client_data(self, client: int) -> tuple[Tensor, Tensor]:
        """A client's raw inputs (as stored, e.g. uint8) and labels; a streamed dataset reads only its items."""
        idx = self.client_indices[client]
        if self.train_x is not None:
            return self.train_x[idx], self.train_y[idx]
        assert self._train_reader is not None
        return self._train_reader.read(idx.tolist())

    def test_evaluation(
        self,
        model: torch.nn.Module,
        context: contextlib.AbstractContextManager | None = None,
        shard: tuple[int, int] = (0, 1),
    ) -> Evaluation:
        """``model`` evaluated on the test set (:func:`~fl_lightning.core.evaluation.evaluate`), inputs normalised.

        Args:
            model: returns class logits for normalised inputs.
            context: wraps the forward passes (e.g. the Trainer's autocast).
            shard: ``(rank, world)``: this process evaluates every ``world``-th batch; counts are summed over processes.
        """
        transform = self.transform
        assert transform is not None, "test_evaluation needs setup() first"
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        return evaluate(
            model, self.test_batches(), self.num_classes, lambda x: transform(x, False), device, context, shard
        )

    def test_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        """The test set as raw ``(x, y)`` CPU batches of ``eval_batch_size`` (read item by item when streamed)."""
        assert self._test is not None, "test_batches needs setup() first"
        return self._test.chunks(self.eval_batch_size)

    @property
    def num_test_classes(self) -> int:
        """Number of distinct labels in the test set."""
        assert self._test is not None, "num_test_classes needs setup() first"
        return len(torch.unique(self._test.y))

    def train_dataloader(self) -> RoundBatches:
        """The current round's local batches of all its clients, one after another."""
        planner = _round_planner(self.trainer)
        if planner is None:
            raise RuntimeError(
                "FederatedDataModule's training data is planned round by round by the Federation callback; "
                "add fl_lightning.Federation to the Trainer's callbacks"
            )
        assert self.trainer is not None
        plan = planner.local_plan(self.trainer.current_epoch)
        return self.round_batches(plan, flat=not planner.client_batches, group=getattr(planner, "client_group", None))

    def round_batches(self, plan: RoundPlan, flat: bool = False, group: int | None = None) -> RoundBatches:
        """The local batches of ``plan``'s clients: one client per item, one local batch (``flat``), or ``group``s."""
        source = self.train_x if self.train_x is not None else self._train_reader
        assert source is not None
        return RoundBatches(
            source,
            self.train_y,
            self.client_indices,
            plan,
            self.batch_size,
            self.drop_last,
            self.seed,
            flat=flat,
            group=group,
        )

    def val_dataloader(self) -> DataLoader | list:
        """Validation data for a module's ``validation_step``: the user's (``val``), else the server's holdout.

        Lightning validates after the last client of a round, once the round's global model is in place (the
        :class:`~fl_lightning.Federation` callback ends the round at its last training batch). Empty without either.
        """
        if self._val is not None:
            return self._loader(self._val)
        if getattr(self, "aux_y", None) is None or len(self.aux_y) == 0:
            return []
        return DataLoader(TensorDataset(self.aux_x, self.aux_y), batch_size=self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        """The global test set (for ``trainer.test``)."""
        assert self._test is not None
        return self._loader(self._test)

    def _loader(self, split: _Split) -> DataLoader:
        """An evaluation loader over a split: its tensors, or its dataset read through a ``DataLoader``."""
        if split.x is not None:
            return DataLoader(TensorDataset(split.x, split.y), batch_size=self.eval_batch_size)
        assert split.reader is not None
        return DataLoader(
            split.reader.dataset,
            batch_size=self.eval_batch_size,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
        )

    def predict_dataloader(self) -> DataLoader:
        """The global test set's inputs, raw (as stored), as tensor batches (for ``trainer.predict``).

        A batch is the inputs alone, which a module's default ``predict_step`` (``self(batch)``) takes. A method
        normalises them itself (``FedAvg.predict_step``); for any other module the datamodule does.
        """
        assert self._test is not None
        if self._test.x is not None:
            return DataLoader(self._test.x, batch_size=self.eval_batch_size)  # type: ignore[arg-type]
        assert self._test.reader is not None
        return DataLoader(
            _Inputs(self._test.reader.dataset),
            batch_size=self.eval_batch_size,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
        )

    def on_after_batch_transfer(
        self, batch: ClientGroup | ClientBatches | StreamedClientBatches | tuple[Tensor, Tensor], dataloader_idx: int
    ) -> ClientGroup | ClientBatches | StreamedClientBatches | tuple[Tensor, Tensor]:
        """Convert to float, augment (training only) and normalise, on the batch's device.

        Prediction batches stay raw for a module that normalises its own inputs (a method's ``input_normalization``).
        """
        assert self.transform is not None
        transform = self.transform
        if isinstance(batch, ClientBatches | StreamedClientBatches | ClientGroup):
            return batch.with_transform(lambda x: transform(x, train=True))
        if self.trainer is not None and self.trainer.predicting:
            if isinstance(getattr(self.trainer.lightning_module, "input_normalization", None), InputNormalization):
                return batch
            if isinstance(batch, Tensor):
                return transform(batch, train=False)
            return [transform(batch[0], train=False), *batch[1:]]  # type: ignore[return-value]
        if isinstance(batch, Tensor):  # an export's input sample (to_onnx, to_torchscript): the model's own input
            return batch
        x, y = batch
        training = self.trainer is not None and self.trainer.training
        return transform(x, train=training), y

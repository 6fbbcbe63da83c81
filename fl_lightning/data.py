"""The federated data: a datamodule holding the datasets as tensors and their non-IID split across clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from fl_lightning.augment import BatchTransform
from fl_lightning.datasets import DATASETS, ImageData, load_dataset
from fl_lightning.partitions import PARTITIONS, class_counts, partition

#: (channels, image size, classes) of each dataset, known before any file is read.
DATASET_SHAPES: dict[str, tuple[int, int, int]] = {
    "digits": (1, 8, 10),
    "mnist": (1, 28, 10),
    "fashion_mnist": (1, 28, 10),
    "cifar10": (3, 32, 10),
    "cifar100": (3, 32, 100),
    "cinic10": (3, 32, 10),
    "tinyimagenet": (3, 64, 200),
}


@dataclass(frozen=True)
class RoundPlan:
    """What the clients of one round train on: who, how many local batches each, and at which learning rate."""

    round: int
    clients: tuple[int, ...]
    steps: tuple[int, ...]
    local_epochs: int
    lr_scale: float

    @property
    def total_steps(self) -> int:
        """Training batches in the round, all clients together."""
        return sum(self.steps)


def client_steps(num_samples: int, batch_size: int, local_epochs: int, drop_last: bool = False) -> int:
    """Local optimizer steps of a client holding ``num_samples`` for ``local_epochs`` epochs."""
    per_epoch = num_samples // batch_size if drop_last else -(-num_samples // batch_size)
    return local_epochs * per_epoch


def _round_seed(*parts: int) -> int:
    """A 63-bit seed derived from integers (seed, round, client, ...), stable across runs and platforms."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint64)[0] >> 1)


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


class RoundBatches:
    """Iterable over one round's clients: each planned client in turn, as a :class:`ClientBatches`.

    A client's batches are its ``local_epochs`` shuffled passes over its data.

    Shuffling uses a generator seeded by (seed, round, client), so a round's batches do not depend on what ran
    before it; that is what makes an interrupted run resume bit-for-bit.
    """

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        client_indices: list[Tensor],
        plan: RoundPlan,
        batch_size: int,
        drop_last: bool,
        seed: int,
        flat: bool = False,
    ) -> None:
        self.x, self.y = x, y
        self.client_indices = client_indices
        self.plan = plan
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.seed = seed
        self.flat = flat

    def __len__(self) -> int:
        return self.plan.total_steps if self.flat else len(self.plan.clients)

    def __iter__(self) -> Iterator[ClientBatches] | Iterator[tuple[Tensor, Tensor]]:
        if self.flat:
            yield from self.batches()
            return
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
        gen = torch.Generator().manual_seed(_round_seed(self.seed, self.plan.round, client))
        stop = n - n % bs if self.drop_last else n
        for _ in range(self.plan.local_epochs):
            perm = torch.randperm(n, generator=gen)
            for start in range(0, stop, bs):
                yield perm[start : start + bs]

    def batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        """Every local batch of the round, client after client, gathered from the full data (for hand-written loops)."""
        for client in self.plan.clients:
            idx = self.client_indices[client]
            for pos in self._positions(client):
                batch = idx[pos]
                yield self.x[batch], self.y[batch]


class FederatedDataModule(L.LightningDataModule):
    """A dataset split across ``num_clients`` clients, plus the global test set and a server-side holdout.

    Images are kept as uint8 tensors; batches are converted, augmented and normalised on the training device
    after transfer. The training loader of a round is driven by the :class:`~fl_lightning.Federation` callback,
    which sets :attr:`plan_fn`.

    Args:
        dataset: one of ``digits`` (scikit-learn, embedded), ``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100``,
            ``cinic10``, ``tinyimagenet``.
        root: folder holding the dataset files (default ``./data``; Fashion-MNIST is also found where Debian's
            ``dataset-fashion-mnist`` package puts it).
        download: fetch the data with torchvision when it is missing (MNIST, Fashion-MNIST, CIFAR; needs internet).
        partition: ``iid``, ``dirichlet`` (LDA), ``shard`` or ``classes_per_client`` (NIID-Bench's #C=k).
        num_clients: number of clients N.
        alpha: Dirichlet concentration α (> 0) for ``dirichlet``; smaller is more skewed.
        shards_per_client: shards s per client for ``shard``.
        classes_per_client: labels k per client for ``classes_per_client``.
        min_client_size: ``dirichlet`` re-draws until every client holds at least this many samples.
        holdout_per_class: training samples per class kept out of every client, for the server's auxiliary data
            (FedSSD's credibility set, FedKA's shared set). Use the same value for all methods you compare.
        batch_size: local training batch size.
        eval_batch_size: batch size of the global evaluation.
        drop_last: drop each client's last incomplete batch of an epoch.
        crop_padding: random-crop padding in pixels for training batches (0 disables).
        hflip: random horizontal flips of training batches.
        cutout: Cutout square size in pixels for training batches (0 disables).
        seed: seed of the partition and the holdout.
    """

    def __init__(
        self,
        dataset: str = "digits",
        root: str | None = None,
        download: bool = False,
        partition: str = "dirichlet",
        num_clients: int = 10,
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
        seed: int = 0,
    ) -> None:
        super().__init__()
        if dataset not in DATASET_SHAPES:
            raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
        if partition not in PARTITIONS:
            raise ValueError(f"unknown partition {partition!r}; choose one of {', '.join(PARTITIONS)}")
        if num_clients < 1:
            raise ValueError(f"num_clients must be at least 1, got {num_clients}")
        if partition == "dirichlet" and not (alpha > 0 and np.isfinite(alpha)):
            raise ValueError(f"the Dirichlet concentration must be a positive number, got alpha={alpha}")
        if partition == "shard" and shards_per_client < 1:
            raise ValueError(f"shards_per_client must be at least 1, got {shards_per_client}")
        _, _, num_classes = DATASET_SHAPES[dataset]
        if partition == "classes_per_client" and not 1 <= classes_per_client <= num_classes:
            raise ValueError(
                f"classes_per_client must be between 1 and {num_classes} for {dataset}, got {classes_per_client}"
            )
        if holdout_per_class < 0:
            raise ValueError(f"holdout_per_class must be >= 0, got {holdout_per_class}")
        if batch_size < 1 or eval_batch_size < 1:
            raise ValueError(f"batch sizes must be positive, got {batch_size} and {eval_batch_size}")
        self.save_hyperparameters()
        self.dataset = dataset
        self.root = root
        self.download = download
        self.partition = partition
        self.num_clients = num_clients
        self.alpha = alpha
        self.shards_per_client = shards_per_client
        self.classes_per_client = classes_per_client
        self.min_client_size = min_client_size
        self.holdout_per_class = holdout_per_class
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.drop_last = drop_last
        self.seed = seed
        self.in_channels, self.image_size, self.num_classes = DATASET_SHAPES[dataset]
        self._augment_args = (crop_padding, hflip, cutout)

        self.data: ImageData | None = None
        self.train_x: Tensor
        self.train_y: Tensor
        self.aux_x: Tensor
        self.aux_y: Tensor
        self.client_indices: list[Tensor] = []
        self.client_class_counts: np.ndarray = np.zeros((0, self.num_classes), dtype=np.int64)
        self.transform: BatchTransform | None = None
        #: Called with the round index, returns that round's plan; set by the Federation callback.
        self.plan_fn: Callable[[int], RoundPlan] | None = None
        #: One training batch per client update (fl_lightning methods) or per local step (any other module).
        self.per_client_batches = True

    @property
    def partition_label(self) -> str:
        """Short human-readable name of the partition, e.g. ``dirichlet(0.5)``."""
        param = {
            "iid": "",
            "dirichlet": f"({self.alpha:g})",
            "shard": f"({self.shards_per_client})",
            "classes_per_client": f"({self.classes_per_client})",
        }[self.partition]
        return f"{self.partition}{param}"

    def setup(self, stage: str | None = None) -> None:
        """Load the dataset, set the holdout aside and partition the rest (once)."""
        if self.data is not None:
            return
        data = load_dataset(self.dataset, self.root, self.download)
        if data.num_classes != self.num_classes:
            raise RuntimeError(f"{self.dataset} loaded with {data.num_classes} classes, expected {self.num_classes}")
        self.data = data
        rng = np.random.default_rng(self.seed)
        labels = data.train_y.numpy()
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
        train_idx = torch.from_numpy(np.flatnonzero(keep))
        self.aux_x = data.train_x[torch.from_numpy(aux_idx)]
        self.aux_y = data.train_y[torch.from_numpy(aux_idx)]
        self.train_x = data.train_x[train_idx].contiguous()
        self.train_y = data.train_y[train_idx].contiguous()

        if self.num_clients > len(self.train_y):
            raise ValueError(
                f"more clients ({self.num_clients}) than training samples ({len(self.train_y)}); "
                "lower --data.num_clients"
            )
        parts = partition(
            self.train_y.numpy(),
            self.partition,
            self.num_clients,
            seed=self.seed,
            alpha=self.alpha,
            shards_per_client=self.shards_per_client,
            classes_per_client=self.classes_per_client,
            min_size=self.min_client_size,
        )
        empty = [i for i, p in enumerate(parts) if len(p) == 0]
        if empty:
            raise ValueError(
                f"the {self.partition_label} partition left clients {empty[:10]} without samples; "
                "use fewer clients or a less skewed partition"
            )
        self.client_indices = [torch.as_tensor(p, dtype=torch.long) for p in parts]
        self.client_class_counts = class_counts(self.train_y.numpy(), parts, self.num_classes)
        crop, flip, cut = self._augment_args
        self.transform = BatchTransform(data.mean, data.std, crop, flip, cut)
        rank_zero_info(
            f"{self.dataset}: {len(self.train_y)} training samples over {self.num_clients} clients "
            f"({self.partition_label}; sizes {min(map(len, parts))}-{max(map(len, parts))}), "
            f"{len(self.aux_y)} held out for the server, {len(data.test_y)} test samples"
        )

    @property
    def client_sizes(self) -> list[int]:
        """Number of training samples of each client."""
        return [int(idx.numel()) for idx in self.client_indices]

    def client_data(self, client: int) -> tuple[Tensor, Tensor]:
        """A client's raw (uint8) images and labels."""
        idx = self.client_indices[client]
        return self.train_x[idx], self.train_y[idx]

    def train_dataloader(self) -> RoundBatches:
        """The current round's local batches of all its clients, one after another."""
        if self.plan_fn is None:
            raise RuntimeError(
                "FederatedDataModule's training data is planned round by round by the Federation callback; "
                "add fl_lightning.Federation to the Trainer's callbacks"
            )
        plan = self.plan_fn(self.trainer.current_epoch if self.trainer is not None else 0)
        return RoundBatches(
            self.train_x,
            self.train_y,
            self.client_indices,
            plan,
            self.batch_size,
            self.drop_last,
            self.seed,
            flat=not self.per_client_batches,
        )

    def test_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        """The global test set as raw (untransformed) CPU batches of ``eval_batch_size``."""
        assert self.data is not None
        bs = self.eval_batch_size
        for start in range(0, len(self.data.test_y), bs):
            yield self.data.test_x[start : start + bs], self.data.test_y[start : start + bs]

    def test_dataloader(self) -> DataLoader:
        """The global test set (for ``trainer.test``)."""
        assert self.data is not None
        return DataLoader(TensorDataset(self.data.test_x, self.data.test_y), batch_size=self.eval_batch_size)

    def on_after_batch_transfer(
        self, batch: ClientBatches | tuple[Tensor, Tensor], dataloader_idx: int
    ) -> ClientBatches | tuple[Tensor, Tensor]:
        """Convert to float, augment (training only) and normalise, on the batch's device."""
        assert self.transform is not None
        transform = self.transform
        if isinstance(batch, ClientBatches):
            return batch.with_transform(lambda x: transform(x, train=True))
        x, y = batch
        training = self.trainer is not None and self.trainer.training
        return transform(x, train=training), y

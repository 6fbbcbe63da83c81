"""The federated datamodule: a dataset held as tensors or read per item, split across clients, as Lightning loads it.

:class:`FederatedDataModule` is the Lightning layer over the Lightning-free data units of :mod:`fl_lightning.core`:
its options are checked by :mod:`~fl_lightning.core.data_settings`, a user's data is read by
:mod:`~fl_lightning.core.sources`, the training set is divided by :mod:`~fl_lightning.core.train_split`, and a round's
training batches are :mod:`~fl_lightning.core.batches` containers. The names users import from here (``DataSource``
for YAML class paths, ``RoundBatches``, ...) are re-exported.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Sequence
from typing import Any, cast

import lightning as L
import numpy as np
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from fl_lightning.core.augment import BatchTransform, InputNormalization, input_stats
from fl_lightning.core.batches import ClientBatches, ClientGroup, RoundBatches, StreamedClientBatches
from fl_lightning.core.context import ClientContext, ServerContext
from fl_lightning.core.data_settings import DATASET_SHAPES, resolve_data_settings
from fl_lightning.core.datasets import DEFAULT_ROOT, ImageData, load_dataset
from fl_lightning.core.evaluation import Evaluation, evaluate
from fl_lightning.core.messages import option, require, require_bool, require_integer, short
from fl_lightning.core.partitions import ClassesPerClient, Partitioner
from fl_lightning.core.rounds import RoundPlan, RoundPlanner
from fl_lightning.core.sources import (
    STATS_CHUNK,
    DatasetReader,
    DataSource,
    GivenData,
    InputsOf,
    Split,
    SplitData,
    dataset_labels,
)
from fl_lightning.core.train_split import given_after_holdout, holdout_split, split_clients
from fl_lightning.lightning_internals import python_scalar_hparams, record_initial_hparam

__all__ = [
    "DATASET_SHAPES",
    "ClientBatches",
    "ClientGroup",
    "DataSource",
    "DatasetReader",
    "FederatedDataModule",
    "GivenData",
    "RoundBatches",
    "Split",
    "StreamedClientBatches",
    "dataset_labels",
]


#: Normalisation statistics (per-channel mean, standard deviation) as ImageData holds them.
Stats = tuple[tuple[float, ...], tuple[float, ...]]


def _round_planner(trainer: L.Trainer | None) -> RoundPlanner | None:
    """The trainer's callback that plans rounds (the Federation), if any."""
    callbacks = trainer.callbacks if trainer is not None else ()  # type: ignore[attr-defined]  # set by Lightning
    return next((cb for cb in callbacks if isinstance(cb, RoundPlanner)), None)


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
        require_integer("seed", seed, least=0)  # the partition's and the holdout's: numpy takes no other
        for flag, value in (("download", download), ("drop_last", drop_last), ("normalize", normalize)):
            require_bool(flag, value)
        require(isinstance(root, str | os.PathLike | None), f"root must be a folder's path or None, got {short(root)}")
        settings = resolve_data_settings(
            dataset,
            partition,
            num_clients,
            alpha=alpha,
            shards_per_client=shards_per_client,
            classes_per_client=classes_per_client,
            min_client_size=min_client_size,
            holdout_per_class=holdout_per_class,
            batch_size=batch_size,
            eval_batch_size=eval_batch_size,
            augment=(crop_padding, hflip, cutout),
            client_ids=client_ids,
            num_classes=num_classes,
            in_memory=in_memory,
            num_workers=num_workers,
            pin_memory=pin_memory,
            info=rank_zero_info,
        )
        #: How the training samples are split across clients (what the partition short options configure).
        self.partitioner: Partitioner = settings.partitioner
        self.dataset, self.num_classes, self.num_clients = settings.dataset, settings.num_classes, settings.num_clients
        self.input_shape, self.input_dtype = settings.input_shape, settings.input_dtype
        self.client_names: list[Any] = settings.client_names
        self.root, self.download, self.seed = root, bool(download), int(seed)
        self.holdout_per_class, self.batch_size = int(holdout_per_class), int(batch_size)
        self.eval_batch_size, self.drop_last, self.normalize = int(eval_batch_size), bool(drop_last), bool(normalize)
        self.in_memory = None if in_memory is None else bool(in_memory)
        self.num_workers, self.pin_memory = int(num_workers), bool(pin_memory)
        self._augment_args = (crop_padding, hflip, cutout)
        self._source = settings.source
        self._client_ids = settings.client_ids
        loaded = settings.loaded
        self._train_all: SplitData | None = loaded.train if loaded is not None else None
        self._test: SplitData | None = loaded.test if loaded is not None else None
        self._val = loaded.val if loaded is not None else None  # the user's validation data (else the holdout)
        self.save_hyperparameters(ignore=["dataset", "client_ids"])
        python_scalar_hparams(self)
        for name, value in settings.recorded_hparams(partition).items():  # as resolved, not as given
            record_initial_hparam(self, name, value)

        self.data: ImageData | None = None
        self.train_x: Tensor | None = None
        self.train_y: Tensor
        self.aux_x: Tensor
        self.aux_y: Tensor
        self._train_reader: DatasetReader | None = None
        self._train_round: RoundBatches | None = None  # the round's training batches (train_dataloader)
        self.client_indices: list[Tensor] = []
        self.client_class_counts: np.ndarray = np.zeros((0, self.num_classes), dtype=np.int64)
        self.transform: BatchTransform | None = None

    @property
    def trainer(self) -> L.Trainer | None:
        """The Trainer this datamodule is attached to (attaching one lets its round planner prepare it)."""
        return self.__dict__.get("_attached_trainer")

    @trainer.setter
    def trainer(self, trainer: L.Trainer | None) -> None:
        """Attach ``trainer`` and let its :class:`~fl_lightning.core.rounds.RoundPlanner` set the rounds on it."""
        # Lightning attaches the datamodule before it reads max_epochs or resolves ckpt_path="last", and before any
        # callback hook runs: the one moment the Federation callback can set the rounds and where checkpoints live.
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
        require(isinstance(name, str) and name != "", f"name must be a non-empty string, got {short(name)}")
        return cls(dataset=GivenData((train_x, train_y), (test_x, test_y), name, val), **kwargs)  # type: ignore[arg-type]

    @classmethod
    def from_datasets(  # type: ignore[override]  # federated: a train and a test set, not Lightning's four loaders
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
        require(isinstance(name, str | None), f"name must be a string or None, got {short(name)}")
        source = GivenData(train, test, name or type(train).__name__, val)
        return cls(dataset=source, **kwargs)

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
    def has_validation_data(self) -> bool:
        """Whether ``val_dataloader`` has data: the user's ``val``, or a server holdout (``holdout_per_class``)."""
        return self._val is not None or self.holdout_per_class > 0

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
        stats: tuple[Sequence[float], Sequence[float]] | None
        if self._source is None:
            data = load_dataset(self.dataset, self.root, self.download)
            if data.num_classes != self.num_classes:
                where = self.root if self.root is not None else DEFAULT_ROOT
                raise ValueError(
                    f"{self.dataset}: the files found under {where} hold {data.num_classes} classes, but "
                    f"{self.dataset} has {self.num_classes}; point root at the complete dataset "
                    f"({option('data.root', inside=True)})"
                )
            self.data = data
            self._train_all, self._test = SplitData(data.train_y, x=data.train_x), SplitData(data.test_y, x=data.test_x)
            stats = (data.mean, data.std)
        else:
            stats = self._own_stats() if self.normalize else None
        if not self.normalize:
            stats = None
        assert self._train_all is not None and self._test is not None
        train_all = self._train_all
        train_idx, aux_idx = holdout_split(train_all.y.numpy(), self.num_classes, self.holdout_per_class, self.seed)
        self.aux_x, self.aux_y = train_all.gather(aux_idx)
        self.train_y = train_all.y[train_idx].contiguous()
        if train_all.x is not None:
            self.train_x = train_all.x[train_idx].contiguous()
        else:
            assert train_all.reader is not None
            full = train_all.reader.dataset
            keep = full if len(aux_idx) == 0 else Subset(full, train_idx.tolist())
            self._train_reader = DatasetReader(keep, self.num_workers, self.pin_memory)
        if self._source is not None and train_all.x is not None and self._test.x is not None:
            # a source's statistics are lists (ImageData's fields are typed as a built-in dataset's tuples)
            data_mean, data_std = cast(Stats, stats if stats is not None else ((), ()))
            self.data = ImageData(
                self.dataset,
                train_all.x,
                train_all.y,
                self._test.x,
                self._test.y,
                self.num_classes,
                data_mean,
                data_std,
            )

        if self.num_clients > len(self.train_y):
            raise ValueError(
                f"more clients ({self.num_clients}) than training samples ({len(self.train_y)}); "
                f"lower {option('data.num_clients')}"
            )
        partitioner = self.partitioner
        if self._client_ids is not None:
            partitioner = given_after_holdout(self._client_ids, train_idx, len(train_all.y))
        self.client_indices, self.client_class_counts = split_clients(
            self.train_y, self.num_clients, partitioner, self.num_classes, self.seed, self.partition_label
        )
        crop, flip, cut = self._augment_args
        mean, std = stats if stats is not None else (None, None)
        self.transform = BatchTransform(mean, std, crop, flip, cut, image=self.is_image)
        sizes = [int(idx.numel()) for idx in self.client_indices]
        held = f", {sum(sizes)} of them" if sum(sizes) < len(self.train_y) else ""  # a partition may leave some out
        rank_zero_info(
            f"{self.dataset}: {len(self.train_y)} training samples{held} over {self.num_clients} clients "
            f"({self.partition_label}; sizes {min(sizes)}-{max(sizes)}), "
            f"{len(self.aux_y)} held out for the server, {len(self._test.y)} test samples"
            + (" (streamed)" if self.streaming else "")
        )
        present = np.bincount(self.train_y.numpy(), minlength=self.num_classes) > 0
        unheld = np.flatnonzero(present & (self.client_class_counts.sum(axis=0) == 0)).tolist()
        if unheld:  # NIID-Bench's #C=k with fewer clients than classes: those classes are tested, never trained
            rank_zero_warn(
                f"no client holds class{'es' if len(unheld) > 1 else ''} {', '.join(map(str, unheld))} "
                f"({self.partition_label} over {self.num_clients} clients): the test set's samples of "
                f"{'them' if len(unheld) > 1 else 'it'} are never trained on"
                + (
                    f"; raise {option('data.num_clients', self.num_classes)} or more to train every class"
                    if isinstance(self.partitioner, ClassesPerClient)
                    else ""
                )
            )

    def _own_stats(self) -> tuple[list[float], list[float]]:
        """Normalisation statistics of all the training inputs (one pass over a streamed dataset)."""
        assert self._train_all is not None
        return input_stats((x for x, _ in self._train_all.chunks(STATS_CHUNK)), self.is_image)

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
        if self.train_x is not None:
            x = self.train_x[:1]
        else:
            assert self._train_reader is not None
            x = self._train_reader.read([0])[0]
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

    @property
    def test_class_counts(self) -> np.ndarray:
        """Test samples per class, ``[num_classes]``."""
        assert self._test is not None, "test_class_counts needs setup() first"
        return np.bincount(self._test.y.numpy(), minlength=self.num_classes)

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
        self._train_round = self.round_batches(
            plan, flat=not planner.client_batches, group=planner.client_group, seed=planner.seed
        )
        return self._train_round

    def round_batches(
        self, plan: RoundPlan, flat: bool = False, group: int | None = None, *, seed: int
    ) -> RoundBatches:
        """The local batches of ``plan``'s clients: one client per item, one local batch (``flat``), or ``group``s.

        ``seed``: the federation's seed, of the local shuffling (and of the augmentation of ``flat`` batches).
        """
        source = self.train_x if self.train_x is not None else self._train_reader
        assert source is not None
        return RoundBatches(
            source,
            self.train_y,
            self.client_indices,
            plan,
            self.batch_size,
            self.drop_last,
            seed,
            flat=flat,
            group=group,
        )

    def val_dataloader(self) -> DataLoader | list:
        """Validation data for a module's ``validation_step``: the user's (``val``), else the server's holdout.

        Lightning validates after the last client of a round, once the round's global model is in place (the
        :class:`~fl_lightning.Federation` callback ends the round at its last training batch). Empty without either
        (``trainer.validate`` then warns).
        """
        if self._val is not None:
            return self._loader(self._val)
        if getattr(self, "aux_y", None) is None or len(self.aux_y) == 0:
            if self.trainer is not None and self.trainer.state.fn == TrainerFn.VALIDATING:  # a fit may go without
                rank_zero_warn(
                    f"trainer.validate: {self.dataset} has no validation data, nothing is validated; give val=(x, y) "
                    "to from_tensors/from_datasets or holdout_per_class=N (trainer.test evaluates the test set)"
                )
            return []
        return DataLoader(TensorDataset(self.aux_x, self.aux_y), batch_size=self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        """The global test set (for ``trainer.test``)."""
        assert self._test is not None
        return self._loader(self._test)

    def _loader(self, split: SplitData) -> DataLoader:
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
            InputsOf(self._test.reader.dataset),
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
        if self.trainer is None or not self.trainer.training:
            return transform(x, train=False), y
        # A local step's batch: augmented from its own seed (RoundBatches.augment_seeds), not the global generator
        # (which a train_dataloader of your own, queueing no seeds, draws from, as Lightning's loop does).
        seeds = self._train_round.augment_seeds if self._train_round is not None else None
        seed = seeds.popleft() if seeds else None  # taken whether or not it is used: the queue stays in step
        generator = torch.Generator().manual_seed(seed) if seed is not None and transform.augments else None
        return transform(x, train=True, generator=generator), y

"""Non-IID partitions of a labelled dataset across clients.

A partitioner is a small class holding its parameters (:class:`Dirichlet`, :class:`Shard`, ...); calling it with the
labels, the number of clients and a seed returns, per client, a sorted int64 array of sample indices; no index is
used twice. The arithmetic lives in pure functions (:func:`dirichlet`, :func:`shard`, ...), each owning a
``np.random.default_rng(seed)``. Parameters are validated at once with a ``ValueError`` that says what to change.

>>> parts = Shard(2)([0, 1, 2] * 10, num_clients=3, seed=0)
>>> [len(p) for p in parts]
[10, 10, 10]
>>> make_partitioner("dirichlet", alpha=0.1).label
'dirichlet(0.1)'
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from typing import Any, ClassVar, cast

import numpy as np

from fl_lightning.core.messages import finite_number, option, options
from fl_lightning.core.registry import Registry, named_subclass

Labels = Sequence[int] | np.ndarray


def _labels(labels: Labels) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"labels must be a 1-D array of class indices, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("labels are empty: there is nothing to partition")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"labels must be integer class indices, got dtype {arr.dtype}; cast them with .astype(int)")
    if arr.min() < 0:
        raise ValueError(f"labels must be non-negative class indices, found {arr.min()}")
    return arr.astype(np.int64, copy=False)


def _int(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")
    return int(value)


def _check_clients(num_clients: int, n: int) -> int:
    num_clients = _int("num_clients", num_clients, 1)
    if num_clients > n:
        raise ValueError(f"more clients ({num_clients}) than samples ({n}); use at most {n} clients")
    return num_clients


def _alpha(alpha: float) -> float:
    value = finite_number(alpha)
    if value is None or value <= 0:
        raise ValueError(
            f"the Dirichlet concentration must be a positive number, got alpha={alpha!r}; "
            f"give a finite alpha > 0 ({option('data.alpha', inside=True)}; e.g. 0.5, smaller is more skewed)"
        )
    return value


def _finish(parts: Sequence[np.ndarray | list[int]]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def iid(labels: Labels, num_clients: int, seed: int = 0) -> list[np.ndarray]:
    """Uniformly random split into ``num_clients`` parts whose sizes differ by at most one.

    Args:
        labels: class index per sample (only its length matters here).
        num_clients: number of clients N, ``1 <= N <= len(labels)``.
        seed: random seed.

    Returns:
        One sorted int64 index array per client; together they cover every sample once.

    >>> [len(p) for p in iid([0, 1] * 5, 3)]
    [4, 3, 3]
    """
    y = _labels(labels)
    num_clients = _check_clients(num_clients, len(y))
    rng = np.random.default_rng(seed)
    return _finish(np.array_split(rng.permutation(len(y)), num_clients))


def dirichlet(
    labels: Labels, num_clients: int, alpha: float, seed: int = 0, min_size: int = 10, max_draws: int = 100
) -> list[np.ndarray]:
    """Latent Dirichlet allocation (LDA): client i gets the share p_{c,i} of class c, with p_c ~ Dir_N(α).

    Each class's samples are shuffled and cut at the cumulative proportions of p_c (NIID-Bench). The whole partition
    is re-drawn, with the same generator, while any client holds fewer than ``min_size`` samples, at most
    ``max_draws`` times; after that a ``ValueError`` reports the client sizes of the last draw. Every sample is
    assigned; client sizes differ.

    Args:
        labels: class index per sample.
        num_clients: number of clients N.
        alpha: concentration α > 0; small α gives few classes per client, large α approaches IID.
        seed: random seed.
        min_size: smallest acceptable client, ``>= 0``.
        max_draws: bound on the number of draws, ``>= 1``.

    Returns:
        One sorted int64 index array per client; together they cover every sample once.
    """
    y = _labels(labels)
    num_clients = _check_clients(num_clients, len(y))
    alpha = _alpha(alpha)
    min_size = _int("min_size", min_size, 0)
    max_draws = _int("max_draws", max_draws, 1)
    if min_size * num_clients > len(y):
        raise ValueError(
            f"{num_clients} clients of at least {min_size} samples need {min_size * num_clients} samples, "
            f"only {len(y)} exist; lower min_size or num_clients "
            f"({options('data.min_client_size', 'data.num_clients', inside=True)})"
        )
    rng = np.random.default_rng(seed)
    members_by_class = [np.flatnonzero(y == c) for c in np.unique(y)]
    sizes = np.zeros(num_clients, dtype=np.int64)
    for _ in range(max_draws):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for members in members_by_class:
            members = rng.permutation(members)
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(shares) * len(members)).astype(np.int64)[:-1]
            for i, chunk in enumerate(np.split(members, cuts)):
                parts[i].append(chunk)
        sizes = np.array([sum(len(c) for c in p) for p in parts], dtype=np.int64)
        if sizes.min() >= min_size:
            return _finish([np.concatenate(p) for p in parts])
    small = np.flatnonzero(sizes < min_size)
    shown = ", ".join(f"client {i}: {sizes[i]}" for i in small[:10]) + (" ..." if len(small) > 10 else "")
    spread = f"all sizes {sizes.tolist()}" if num_clients <= 50 else f"sizes {sizes.min()}..{sizes.max()}"
    raise ValueError(
        f"after {max_draws} draws of Dir({alpha}) over {num_clients} clients, {len(small)} client(s) still held "
        f"fewer than min_size={min_size} samples (last draw: {shown}; {spread}); "
        "raise alpha, lower min_size or num_clients "
        f"({options('data.alpha', 'data.min_client_size', 'data.num_clients', inside=True)})"
    )


def shard(labels: Labels, num_clients: int, shards_per_client: int, seed: int = 0) -> list[np.ndarray]:
    """Label sharding (FedAvg, FedNTD): sort by label, cut into N·s equal shards, deal s random shards per client.

    Indices are shuffled with the seed before a stable sort by label, so ties within a label are broken at random.
    Shards hold ``n // (N·s)`` samples each; the last ``n mod (N·s)`` samples of the sorted order (the tail of the
    largest labels) are dropped so that all shards are equal. A shard may straddle two labels when class sizes are
    not multiples of the shard size.

    Args:
        labels: class index per sample.
        num_clients: number of clients N.
        shards_per_client: shards s dealt to each client, ``N·s <= len(labels)``.
        seed: random seed.

    Returns:
        One sorted int64 index array of ``s · (n // (N·s))`` samples per client.
    """
    y = _labels(labels)
    num_clients = _check_clients(num_clients, len(y))
    shards_per_client = _int("shards_per_client", shards_per_client, 1)
    num_shards = num_clients * shards_per_client
    if num_shards > len(y):
        raise ValueError(
            f"{num_clients} clients x {shards_per_client} shards = {num_shards} shards exceed the {len(y)} samples; "
            "lower shards_per_client or num_clients "
            f"({options('data.shards_per_client', 'data.num_clients', inside=True)})"
        )
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(len(y))
    order = shuffled[np.argsort(y[shuffled], kind="stable")]
    shard_size = len(y) // num_shards
    shards = order[: shard_size * num_shards].reshape(num_shards, shard_size)
    deal = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return _finish([shards[row].ravel() for row in deal])


def classes_per_client(labels: Labels, num_clients: int, k: int, seed: int = 0) -> list[np.ndarray]:
    """Quantity-based label imbalance, NIID-Bench's ``#C = k``.

    With C = ``labels.max() + 1`` classes, client i holds label ``i mod C`` plus k − 1 other distinct labels drawn
    at random. Each label's samples are shuffled and split evenly (``np.array_split``) among the clients that hold
    it. Samples of labels that no client holds are dropped; a held label with no samples contributes nothing.

    Args:
        labels: class index per sample.
        num_clients: number of clients N.
        k: labels per client, ``1 <= k <= C``.
        seed: random seed.

    Returns:
        One sorted int64 index array per client.
    """
    y = _labels(labels)
    num_clients = _check_clients(num_clients, len(y))
    num_classes = int(y.max()) + 1
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= num_classes:
        raise ValueError(f"classes_per_client k must be an integer between 1 and {num_classes} (the classes), got {k}")
    rng = np.random.default_rng(seed)
    holders: list[list[int]] = [[] for _ in range(num_classes)]
    for i in range(num_clients):
        own = i % num_classes
        others = np.delete(np.arange(num_classes), own)
        for c in (own, *rng.choice(others, int(k) - 1, replace=False).tolist()):
            holders[c].append(i)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, who in enumerate(holders):
        if not who:
            continue
        members = rng.permutation(np.flatnonzero(y == c))
        for i, chunk in zip(who, np.array_split(members, len(who)), strict=True):
            parts[i].append(chunk)
    return _finish([np.concatenate(p) if p else np.empty(0, dtype=np.int64) for p in parts])


def given(labels: Labels, client_ids: Sequence[int | str] | np.ndarray) -> list[np.ndarray]:
    """Natural clients (writers, hospitals, devices): sample i belongs to the client named ``client_ids[i]``.

    Ids may be any integers or strings; the distinct ids, sorted, become clients 0..K-1 (so ids need not be
    contiguous). No randomness is involved.

    Args:
        labels: class index per sample (checked, and for its length).
        client_ids: one id per sample.

    Returns:
        One sorted int64 index array per distinct id, in sorted id order.

    >>> [p.tolist() for p in given([0, 1, 0, 1], ["b", "a", "b", "c"])]
    [[1], [0, 2], [3]]
    """
    y = _labels(labels)
    ids = client_id_array(client_ids)
    if len(ids) != len(y):
        raise ValueError(
            f"client_ids has {len(ids)} entries but there are {len(y)} samples to partition; give one id per sample"
        )
    _, inverse = np.unique(ids, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    cuts = np.flatnonzero(np.diff(inverse[order])) + 1
    return _finish(np.split(order, cuts))


def client_id_array(client_ids: Sequence[int | str] | np.ndarray) -> np.ndarray:
    """The ids as a 1-D numpy array of integers or strings, with a clear error for anything else."""
    if hasattr(client_ids, "numpy") and callable(client_ids.numpy):  # a torch tensor
        client_ids = cast(Any, client_ids).detach().cpu().numpy()
    ids = np.asarray(client_ids)
    if ids.ndim != 1:
        raise ValueError(f"client_ids must be one id per sample (1-D), got shape {ids.shape}")
    if ids.size == 0:
        raise ValueError("client_ids is empty")
    if not (np.issubdtype(ids.dtype, np.integer) or ids.dtype.kind in "US"):
        raise ValueError(f"client ids must be integers or strings, got dtype {ids.dtype}")
    return ids


# ----------------------------------------------------------------------------------------------------------------------
# partitioners: a scheme and its parameters, as an object


class Partitioner:
    """A partition scheme and its parameters; calling it splits a dataset's labels across clients.

    A subclass validates its parameters in ``__init__`` (a one-line ``ValueError`` that says what to change), keeps
    each under its argument's name (what :meth:`init_args` and ``repr`` read) and implements ``__call__``. Give one to
    :class:`~fl_lightning.FederatedDataModule` as ``partition`` (in YAML: ``class_path`` and ``init_args``).
    """

    #: Short name, as in ``--data.partition NAME`` (a key of :data:`PARTITIONERS`).
    name: ClassVar[str] = ""
    #: The datamodule's short options that configure it (``--data.alpha``), each mapped to an ``__init__`` argument.
    short_options: ClassVar[dict[str, str]] = {}

    def __call__(self, labels: Labels, num_clients: int, seed: int = 0) -> list[np.ndarray]:
        """One sorted int64 array of sample indices per client (``num_clients`` of them); no index is used twice."""
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(labels, num_clients, seed)")

    @property
    def label(self) -> str:
        """Short human-readable name recorded in results (``summary.json``), e.g. ``dirichlet(0.5)``."""
        return self.name or type(self).__name__

    def check_num_classes(self, num_classes: int) -> None:
        """Raise a ``ValueError`` when data of ``num_classes`` classes cannot be split so (known before the labels)."""

    def init_args(self) -> dict[str, Any]:
        """The ``__init__`` arguments as this object holds them (what a config's ``init_args`` would say)."""
        params = inspect.signature(type(self).__init__).parameters.values()
        named = [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        return {name: getattr(self, name) for name in named if hasattr(self, name)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.init_args().items())})"


class IID(Partitioner):
    """Uniformly random split; client sizes differ by at most one (:func:`iid`).

    >>> IID().label
    'iid'
    """

    name = "iid"

    def __call__(self, labels: Labels, num_clients: int, seed: int = 0) -> list[np.ndarray]:
        """One sorted int64 index array per client; together they cover every sample once."""
        return iid(labels, num_clients, seed)


class Dirichlet(Partitioner):
    """Latent Dirichlet allocation over the labels (:func:`dirichlet`; Hsu et al., arXiv:1909.06335).

    Args:
        alpha: concentration α > 0; small α gives few classes per client, large α approaches IID.
        min_size: the partition is re-drawn until every client holds at least this many samples (``>= 0``).
        max_draws: bound on the number of draws (``>= 1``); past it a ``ValueError`` reports the client sizes.

    >>> Dirichlet(0.1)
    Dirichlet(alpha=0.1, min_size=10, max_draws=100)
    >>> Dirichlet(0.1).label
    'dirichlet(0.1)'
    """

    name = "dirichlet"
    short_options = {"alpha": "alpha", "min_client_size": "min_size"}

    def __init__(self, alpha: float = 0.5, min_size: int = 10, max_draws: int = 100) -> None:
        self.alpha = _alpha(alpha)
        self.min_size = _int("min_size", min_size, 0)
        self.max_draws = _int("max_draws", max_draws, 1)

    @property
    def label(self) -> str:
        """``dirichlet(α)``."""
        return f"{self.name}({self.alpha:g})"

    def __call__(self, labels: Labels, num_clients: int, seed: int = 0) -> list[np.ndarray]:
        """One sorted int64 index array per client; together they cover every sample once."""
        return dirichlet(labels, num_clients, self.alpha, seed, self.min_size, self.max_draws)


class Shard(Partitioner):
    """Label sharding: N·s label-sorted shards, s dealt to each client (:func:`shard`; FedAvg, arXiv:1602.05629).

    Args:
        shards_per_client: shards s per client (``>= 1``).

    >>> Shard(2).label
    'shard(2)'
    """

    name = "shard"
    short_options = {"shards_per_client": "shards_per_client"}

    def __init__(self, shards_per_client: int = 2) -> None:
        self.shards_per_client = _int("shards_per_client", shards_per_client, 1)

    @property
    def label(self) -> str:
        """``shard(s)``."""
        return f"{self.name}({self.shards_per_client})"

    def __call__(self, labels: Labels, num_clients: int, seed: int = 0) -> list[np.ndarray]:
        """One sorted int64 index array of equal size per client (the remainder of the sorted labels is dropped)."""
        return shard(labels, num_clients, self.shards_per_client, seed)


class ClassesPerClient(Partitioner):
    """k labels per client, NIID-Bench's ``#C = k`` (:func:`classes_per_client`; Li et al., arXiv:2102.02079).

    ``k`` is checked against the number of classes when the labels are known (and by
    :meth:`check_num_classes`, before).

    Args:
        classes_per_client: labels k per client (``>= 1``, at most the number of classes).

    >>> ClassesPerClient(2).label
    'classes_per_client(2)'
    """

    name = "classes_per_client"
    short_options = {"classes_per_client": "classes_per_client"}

    def __init__(self, classes_per_client: int = 2) -> None:
        self.classes_per_client = _int("classes_per_client", classes_per_client, 1)

    @property
    def label(self) -> str:
        """``classes_per_client(k)``."""
        return f"{self.name}({self.classes_per_client})"

    def check_num_classes(self, num_classes: int) -> None:
        """Refuse more labels per client than the data has classes."""
        if self.classes_per_client > num_classes:
            raise ValueError(
                f"classes_per_client must be between 1 and {num_classes} (the classes), got {self.classes_per_client}"
            )

    def __call__(self, labels: Labels, num_clients: int, seed: int = 0) -> list[np.ndarray]:
        """One sorted int64 index array per client; samples of labels no client holds are dropped."""
        return classes_per_client(labels, num_clients, self.classes_per_client, seed)


class Given(Partitioner):
    """Natural clients (writers, hospitals, devices): sample i belongs to client ``client_ids[i]`` (:func:`given`).

    No randomness is involved; ``num_clients`` must equal the number of distinct ids.

    Args:
        client_ids: one id per sample (integers or strings, any values; a list, array or tensor). The datamodule
            may instead take them from its ``client_ids`` option and hand them over resolved.

    >>> [p.tolist() for p in Given(["b", "a", "b"])([0, 1, 0], num_clients=2)]
    [[1], [0, 2]]
    """

    name = "given"

    def __init__(self, client_ids: list[int] | list[str] | None = None) -> None:
        self.client_ids = None if client_ids is None else client_id_array(client_ids)

    def init_args(self) -> dict[str, Any]:
        """``client_ids`` as a list (None when not given)."""
        return {"client_ids": None if self.client_ids is None else self.client_ids.tolist()}

    def __repr__(self) -> str:
        return "Given()" if self.client_ids is None else f"Given(<{len(self.client_ids)} client ids>)"

    def __call__(self, labels: Labels, num_clients: int, seed: int = 0) -> list[np.ndarray]:
        """One sorted int64 index array per distinct id, in sorted id order."""
        if self.client_ids is None:
            raise ValueError("partition 'given' needs client_ids: the client of every training sample")
        parts = given(labels, self.client_ids)
        if len(parts) != num_clients:
            raise ValueError(
                f"client_ids name {len(parts)} distinct clients but num_clients is {num_clients}; "
                "leave num_clients unset or make them agree"
            )
        return parts


#: Every partitioner by short name (``--data.partition NAME``): a :class:`Partitioner` subclass, built from its
#: defaults and the datamodule's short options (``short_options``), under its class constant ``name``.
PARTITIONERS: Registry[type[Partitioner]] = Registry(
    "PARTITIONERS",
    named_subclass(Partitioner, "name"),
    {p.name: p for p in (IID, Dirichlet, Shard, ClassesPerClient, Given)},
)


def _short_defaults() -> dict[str, Any]:
    """Each short option's default: that of the argument it sets."""
    out: dict[str, Any] = {}
    for cls in PARTITIONERS.values():
        params = inspect.signature(cls.__init__).parameters
        out.update({option: params[arg].default for option, arg in cls.short_options.items()})
    return out


def make_partitioner(partition: str | Partitioner, **options: Any) -> Partitioner:
    """The partitioner a datamodule was given: a short name built from the short options, or an object as it is.

    A name (a key of :data:`PARTITIONERS`) builds that class from the options its ``short_options`` lists
    (``alpha`` and ``min_client_size`` for ``dirichlet``, ...); options of other partitioners are ignored, so that
    configs compose (``--config dir01.yaml --data.partition shard``), but must still be in range (``alpha > 0``). An
    object holds its own parameters: every option must then keep its default.

    Args:
        partition: a short name, or a :class:`Partitioner`.
        **options: the datamodule's short options (``alpha``, ``min_client_size``, ``shards_per_client``,
            ``classes_per_client``).

    Returns:
        The partitioner.

    >>> make_partitioner("shard", alpha=0.1, shards_per_client=3)
    Shard(shards_per_client=3)
    """
    defaults = _short_defaults()
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise TypeError(f"unknown partition options {unknown}; the short options are {', '.join(defaults)}")
    if isinstance(partition, Partitioner):
        changed = [f"{k}={v!r}" for k, v in options.items() if v != defaults[k]]
        if changed:
            raise ValueError(
                f"partition {partition!r} is an object with its own parameters, so {', '.join(changed)} would be "
                "unused; set them in the object (YAML: partition.init_args) and drop the short option"
            )
        return partition
    cls = PARTITIONERS.get(partition) if isinstance(partition, str) else None
    if cls is None:
        raise ValueError(
            f"unknown partition {partition!r}; choose one of {', '.join(PARTITIONERS)}, or give a Partitioner"
        )
    unused_partitioners(partition, **options)  # out-of-range unused options are still refused
    return _from_short_options(cls, options)


def unused_partitioners(partition: str, **options: Any) -> list[Partitioner]:
    """The other partitioners built from the short options they take that differ from their defaults.

    Those options are unused with ``partition``, but an out-of-range one is still a mistake: building the class it
    belongs to refuses it here, and :meth:`Partitioner.check_num_classes` of each returned one once the classes are
    known (``--data.partition iid --data.classes_per_client 11`` on 10 classes).
    """
    defaults = _short_defaults()
    built = []
    for name, other in PARTITIONERS.items():
        if name == partition:
            continue
        given = {o: options[o] for o in other.short_options if o in options and options[o] != defaults[o]}
        if given:
            try:
                built.append(_from_short_options(other, given))
            except TypeError:  # a registered partitioner that needs more than its short options: nothing to check
                pass
    return built


def _from_short_options(cls: type[Partitioner], options: dict[str, Any]) -> Partitioner:
    """``cls`` built from the datamodule's short options; a refusal names the option, not the class's argument."""
    try:
        return cls(**{arg: options[option] for option, arg in cls.short_options.items() if option in options})
    except ValueError as err:
        message = str(err)
        for option, arg in cls.short_options.items():
            if option != arg:
                message = re.sub(rf"\b{arg}\b", option, message)
        raise ValueError(message) from None


def class_counts(labels: Labels, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """Client x class sample counts.

    Args:
        labels: class index per sample.
        parts: index array per client, as returned by the partitioners.
        num_classes: number of columns; must exceed every label.

    Returns:
        int64 array ``[len(parts), num_classes]``.

    >>> class_counts([0, 1, 1, 2], [np.array([0, 1]), np.array([2, 3])], 3).tolist()
    [[1, 1, 0], [0, 1, 1]]
    """
    y = _labels(labels)
    num_classes = _int("num_classes", num_classes, 1)
    if y.max() >= num_classes:
        raise ValueError(f"label {y.max()} does not fit num_classes={num_classes}; raise num_classes to {y.max() + 1}")
    counts = np.zeros((len(parts), num_classes), dtype=np.int64)
    for i, p in enumerate(parts):
        counts[i] = np.bincount(y[np.asarray(p, dtype=np.int64)], minlength=num_classes)
    return counts

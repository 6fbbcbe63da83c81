"""Non-IID partitions of a labelled dataset across clients.

Each partitioner is a pure function of the labels and a seed that returns, per client, a sorted int64 array of
sample indices; no index is used twice. Arguments are validated at once with a message that says what to change.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PARTITIONS: tuple[str, ...] = ("iid", "dirichlet", "shard", "classes_per_client")

Labels = Sequence[int] | np.ndarray


def _labels(labels: Labels) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("labels are empty: there is nothing to partition")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {arr.dtype}")
    if arr.min() < 0:
        raise ValueError("labels must be non-negative class indices")
    return arr.astype(np.int64)


def _check_clients(num_clients: int, n: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be at least 1, got {num_clients}")
    if num_clients > n:
        raise ValueError(f"more clients ({num_clients}) than samples ({n}); use at most {n} clients")


def _finish(parts: list[np.ndarray] | list[list[int]]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def iid(labels: Labels, num_clients: int, seed: int = 0) -> list[np.ndarray]:
    """Uniformly random split into ``num_clients`` parts whose sizes differ by at most one.

    >>> [len(p) for p in iid([0, 1] * 5, 3)]
    [4, 3, 3]
    """
    y = _labels(labels)
    _check_clients(num_clients, len(y))
    rng = np.random.default_rng(seed)
    return _finish(np.array_split(rng.permutation(len(y)), num_clients))


def dirichlet(
    labels: Labels, num_clients: int, alpha: float, seed: int = 0, min_size: int = 10, max_draws: int = 100
) -> list[np.ndarray]:
    """Latent Dirichlet allocation (LDA): client i gets the share p_{c,i} of class c, p_c ~ Dir_N(α).

    As in NIID-Bench, the whole partition is re-drawn while any client holds fewer than ``min_size`` samples, at
    most ``max_draws`` times; then a ``ValueError`` says what to change. Client sizes differ.

    Args:
        labels: class index per sample.
        num_clients: number of clients N.
        alpha: concentration α > 0; small α gives few classes per client.
        seed: random seed.
        min_size: smallest acceptable client.
        max_draws: bound on the re-draws.
    """
    y = _labels(labels)
    _check_clients(num_clients, len(y))
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"the Dirichlet concentration alpha must be a positive number, got {alpha}")
    if min_size < 0:
        raise ValueError(f"min_size must be >= 0, got {min_size}")
    if min_size * num_clients > len(y):
        raise ValueError(
            f"{num_clients} clients of at least {min_size} samples need {min_size * num_clients} samples, "
            f"only {len(y)} exist; lower min_size or num_clients"
        )
    if max_draws < 1:
        raise ValueError(f"max_draws must be at least 1, got {max_draws}")
    rng = np.random.default_rng(seed)
    classes = np.unique(y)
    sizes: list[int] = []
    for _ in range(max_draws):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(y == c))
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(shares) * len(members)).astype(np.int64)[:-1]
            for i, chunk in enumerate(np.split(members, cuts)):
                parts[i].extend(chunk.tolist())
        sizes = [len(p) for p in parts]
        if min(sizes) >= min_size:
            return _finish(parts)
    raise ValueError(
        f"after {max_draws} draws of Dir({alpha}) some of the {num_clients} clients still held fewer than {min_size} "
        f"samples (last draw's smallest: {sorted(sizes)[:5]}); raise alpha, lower min_size or use fewer clients"
    )


def shard(labels: Labels, num_clients: int, shards_per_client: int, seed: int = 0) -> list[np.ndarray]:
    """Label sharding (FedAvg, FedNTD B.5): sort by label, cut into N·s equal shards, deal s random shards per client.

    Ties within a label are broken by a seeded shuffle. The last ``n mod (N·s)`` samples of the sorted order are
    dropped so that all shards are equal.
    """
    y = _labels(labels)
    _check_clients(num_clients, len(y))
    if shards_per_client < 1:
        raise ValueError(f"shards_per_client must be at least 1, got {shards_per_client}")
    num_shards = num_clients * shards_per_client
    if num_shards > len(y):
        raise ValueError(
            f"{num_clients} clients x {shards_per_client} shards = {num_shards} shards exceed the {len(y)} samples; "
            "lower shards_per_client or num_clients"
        )
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(len(y))
    order = shuffled[np.argsort(y[shuffled], kind="stable")]
    shard_size = len(y) // num_shards
    shards = order[: shard_size * num_shards].reshape(num_shards, shard_size)
    deal = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return _finish([shards[row].ravel() for row in deal])


def classes_per_client(labels: Labels, num_clients: int, k: int, seed: int = 0) -> list[np.ndarray]:
    """Quantity-based label imbalance, NIID-Bench's #C = k.

    Client i holds label ``i mod C`` plus k − 1 other distinct labels drawn at random; each label's samples are split
    evenly among the clients that hold it. Samples of labels no client holds are left out.
    """
    y = _labels(labels)
    _check_clients(num_clients, len(y))
    num_classes = int(y.max()) + 1
    if not 1 <= k <= num_classes:
        raise ValueError(f"classes_per_client k must be between 1 and {num_classes}, got {k}")
    rng = np.random.default_rng(seed)
    held: list[list[int]] = []
    for i in range(num_clients):
        own = i % num_classes
        others = rng.choice([c for c in range(num_classes) if c != own], k - 1, replace=False).tolist()
        held.append([own, *others])
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        holders = [i for i, cs in enumerate(held) if c in cs]
        if not holders:
            continue
        members = rng.permutation(np.flatnonzero(y == c))
        for i, chunk in zip(holders, np.array_split(members, len(holders)), strict=True):
            parts[i].extend(chunk.tolist())
    return _finish(parts)


_classes_per_client = classes_per_client  # the dispatcher's keyword argument shadows the function's name


def partition(
    labels: Labels,
    scheme: str,
    num_clients: int,
    seed: int = 0,
    *,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    classes_per_client: int = 2,
    min_size: int = 10,
) -> list[np.ndarray]:
    """Partition by scheme name: ``iid``, ``dirichlet``, ``shard`` or ``classes_per_client``."""
    if scheme == "iid":
        return iid(labels, num_clients, seed)
    if scheme == "dirichlet":
        return dirichlet(labels, num_clients, alpha, seed, min_size)
    if scheme == "shard":
        return shard(labels, num_clients, shards_per_client, seed)
    if scheme == "classes_per_client":
        return _classes_per_client(labels, num_clients, classes_per_client, seed)
    raise ValueError(f"unknown partition {scheme!r}; choose one of {', '.join(PARTITIONS)}")


def class_counts(labels: Labels, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """Client x class sample counts, int64 ``[num_clients, num_classes]``."""
    y = _labels(labels)
    return np.stack([np.bincount(y[np.asarray(p, dtype=np.int64)], minlength=num_classes) for p in parts]).astype(
        np.int64
    )

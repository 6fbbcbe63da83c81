"""Non-IID partitions of a labelled dataset across clients.

Each partitioner is a pure function of the labels and a seed: it owns a ``np.random.default_rng(seed)`` and returns,
per client, a sorted int64 array of sample indices; no index is used twice. Arguments are validated at once with a
``ValueError`` that says what to change.

>>> parts = partition([0, 1, 2] * 10, "shard", num_clients=3, shards_per_client=2)
>>> [len(p) for p in parts]
[10, 10, 10]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: The synthetic partitions, drawn from the labels and a seed.
PARTITIONS: tuple[str, ...] = ("iid", "dirichlet", "shard", "classes_per_client")
#: Every scheme :func:`partition` knows: the synthetic ones and ``given`` (each sample's client named by the user).
SCHEMES: tuple[str, ...] = (*PARTITIONS, "given")

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
    try:
        alpha = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"the Dirichlet concentration alpha must be a positive number, got {alpha!r}") from None
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"the Dirichlet concentration alpha must be a positive finite number, got {alpha}")
    min_size = _int("min_size", min_size, 0)
    max_draws = _int("max_draws", max_draws, 1)
    if min_size * num_clients > len(y):
        raise ValueError(
            f"{num_clients} clients of at least {min_size} samples need {min_size * num_clients} samples, "
            f"only {len(y)} exist; lower min_size or num_clients"
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
        "raise alpha, lower min_size or num_clients"
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
        client_ids = client_ids.detach().cpu().numpy()
    ids = np.asarray(client_ids)
    if ids.ndim != 1:
        raise ValueError(f"client_ids must be one id per sample (1-D), got shape {ids.shape}")
    if ids.size == 0:
        raise ValueError("client_ids is empty")
    if not (np.issubdtype(ids.dtype, np.integer) or ids.dtype.kind in "US"):
        raise ValueError(f"client ids must be integers or strings, got dtype {ids.dtype}")
    return ids


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
    client_ids: Sequence[int | str] | np.ndarray | None = None,
) -> list[np.ndarray]:
    """Partition by scheme name, one of ``SCHEMES``; only the keyword arguments of that scheme are used.

    Args:
        labels: class index per sample.
        scheme: ``"iid"``, ``"dirichlet"``, ``"shard"``, ``"classes_per_client"`` or ``"given"``.
        num_clients: number of clients N.
        seed: random seed.
        alpha: Dirichlet concentration (``dirichlet``).
        shards_per_client: shards per client (``shard``).
        classes_per_client: labels per client k (``classes_per_client``).
        min_size: smallest acceptable client (``dirichlet``).
        client_ids: the client of every sample (``given``; ``num_clients`` must match the distinct ids).

    Returns:
        One sorted int64 index array per client.
    """
    if scheme == "given":
        if client_ids is None:
            raise ValueError("partition 'given' needs client_ids: the client of every training sample")
        parts = given(labels, client_ids)
        if len(parts) != num_clients:
            raise ValueError(
                f"client_ids name {len(parts)} distinct clients but num_clients is {num_clients}; "
                "leave num_clients unset or make them agree"
            )
        return parts
    if scheme == "iid":
        return iid(labels, num_clients, seed)
    if scheme == "dirichlet":
        return dirichlet(labels, num_clients, alpha, seed, min_size)
    if scheme == "shard":
        return shard(labels, num_clients, shards_per_client, seed)
    if scheme == "classes_per_client":
        return _classes_per_client(labels, num_clients, classes_per_client, seed)
    raise ValueError(f"unknown partition {scheme!r}; choose one of {', '.join(SCHEMES)}")


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

"""Partition invariants on tiny synthetic labels, one test per invariant."""

from __future__ import annotations

import numpy as np
import pytest

from fl_lightning.partitions import PARTITIONS, class_counts, classes_per_client, dirichlet, iid, partition, shard

LABELS = np.repeat(np.arange(10), 50)  # 10 classes x 50 samples
KWARGS = {"alpha": 0.5, "shards_per_client": 2, "classes_per_client": 2, "min_size": 5}


@pytest.mark.parametrize("scheme", PARTITIONS)
def test_every_index_used_at_most_once(scheme):
    parts = partition(LABELS, scheme, 10, seed=3, **KWARGS)
    assert len(parts) == 10
    flat = np.concatenate(parts)
    assert len(flat) == len(set(flat.tolist()))
    assert flat.min() >= 0 and flat.max() < len(LABELS)


@pytest.mark.parametrize("scheme", PARTITIONS)
def test_parts_are_sorted_int64(scheme):
    parts = partition(LABELS, scheme, 10, seed=3, **KWARGS)
    assert all(p.dtype == np.int64 and p.ndim == 1 for p in parts)
    assert all(np.all(np.diff(p) > 0) for p in parts)


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_all_samples_used(scheme):
    parts = partition(LABELS, scheme, 7, seed=1, **KWARGS)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(LABELS)))


@pytest.mark.parametrize("scheme", PARTITIONS)
def test_deterministic_for_a_seed(scheme):
    a = partition(LABELS, scheme, 10, seed=7, **KWARGS)
    b = partition(LABELS, scheme, 10, seed=7, **KWARGS)
    c = partition(LABELS, scheme, 10, seed=8, **KWARGS)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("scheme", PARTITIONS)
def test_class_makeup_is_a_function_of_the_labels(scheme):
    """Reordering the dataset permutes the indices but not what each client holds."""
    perm = np.random.default_rng(0).permutation(len(LABELS))
    original = class_counts(LABELS, partition(LABELS, scheme, 10, seed=2, **KWARGS), 10)
    shuffled = class_counts(LABELS[perm], partition(LABELS[perm], scheme, 10, seed=2, **KWARGS), 10)
    assert sorted(original.sum(1).tolist()) == sorted(shuffled.sum(1).tolist())
    if scheme != "iid":  # label-driven schemes: identical client x class table
        assert np.array_equal(original, shuffled)


@pytest.mark.parametrize("scheme", PARTITIONS)
def test_dispatcher_matches_direct_call(scheme):
    direct = {
        "iid": lambda: iid(LABELS, 10, 4),
        "dirichlet": lambda: dirichlet(LABELS, 10, 0.5, 4, min_size=5),
        "shard": lambda: shard(LABELS, 10, 2, 4),
        "classes_per_client": lambda: classes_per_client(LABELS, 10, 2, 4),
    }[scheme]()
    via = partition(LABELS, scheme, 10, seed=4, **KWARGS)
    assert all(np.array_equal(x, y) for x, y in zip(direct, via, strict=True))


def test_iid_sizes_differ_by_at_most_one():
    sizes = [len(p) for p in iid(LABELS, 7)]
    assert max(sizes) - min(sizes) <= 1


def test_iid_accepts_a_list():
    assert [len(p) for p in iid([i % 3 for i in range(100)], 3)] == [34, 33, 33]


def test_dirichlet_respects_min_size_and_skews():
    parts = dirichlet(LABELS, 10, alpha=0.1, seed=0, min_size=10)
    counts = class_counts(LABELS, parts, 10)
    assert counts.sum(1).min() >= 10
    assert np.median((counts > 0).sum(1)) < 10  # small alpha: most clients miss some classes


def test_dirichlet_raises_after_bounded_redraws():
    with pytest.raises(ValueError, match=r"after 3 draws.*min_size=12.*raise alpha, lower min_size or num_clients"):
        dirichlet(LABELS, 40, alpha=0.01, seed=0, min_size=12, max_draws=3)


def test_dirichlet_min_size_zero_allows_empty_clients():
    parts = dirichlet(LABELS, 40, alpha=0.01, seed=0, min_size=0)
    assert sum(len(p) for p in parts) == len(LABELS)


def test_shard_two_shards_at_most_two_classes():
    parts = shard(LABELS, 25, 2, seed=0)  # 50 shards of 10, each inside one class
    counts = class_counts(LABELS, parts, 10)
    assert all(len(p) == 20 for p in parts)
    assert ((counts > 0).sum(1) <= 2).all()


def test_shard_drops_only_the_remainder():
    labels = np.arange(103) % 10
    parts = shard(labels, 10, 2, seed=0)  # 20 shards of 5; 103 % 20 = 3 dropped
    assert [len(p) for p in parts] == [10] * 10


def test_classes_per_client_structure():
    parts = classes_per_client(LABELS, 10, 3, seed=0)
    counts = class_counts(LABELS, parts, 10)
    assert ((counts > 0).sum(1) == 3).all()
    for i in range(10):
        assert counts[i, i % 10] > 0
    for c in range(10):
        holders = counts[:, c][counts[:, c] > 0]
        if len(holders):
            assert holders.max() - holders.min() <= 1
            assert holders.sum() == 50


def test_classes_per_client_drops_unheld_labels():
    parts = classes_per_client(LABELS, 3, 1, seed=0)  # clients hold labels 0, 1, 2 only
    counts = class_counts(LABELS, parts, 10)
    assert counts.tolist() == [[50 if c == i else 0 for c in range(10)] for i in range(3)]


def test_class_counts_shape_and_sum():
    parts = iid(LABELS, 4)
    counts = class_counts(LABELS, parts, 12)
    assert counts.dtype == np.int64 and counts.shape == (4, 12) and counts.sum() == len(LABELS)
    assert counts[:, 10:].sum() == 0
    assert counts.sum(0)[:10].tolist() == [50] * 10


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: iid(LABELS, 0), "num_clients must be at least 1"),
        (lambda: iid(LABELS, 2.5), "num_clients must be an integer"),
        (lambda: iid(LABELS, 501), "more clients"),
        (lambda: dirichlet(LABELS, 10, alpha=0.0), "positive"),
        (lambda: dirichlet(LABELS, 10, alpha=-1.0), "positive"),
        (lambda: dirichlet(LABELS, 10, alpha=float("nan")), "positive"),
        (lambda: dirichlet(LABELS, 10, alpha=float("inf")), "positive"),
        (lambda: dirichlet(LABELS, 10, alpha=1.0, min_size=-1), "min_size must be at least 0"),
        (lambda: dirichlet(LABELS, 10, alpha=1.0, min_size=100), "lower min_size or num_clients"),
        (lambda: dirichlet(LABELS, 10, alpha=1.0, max_draws=0), "max_draws"),
        (lambda: shard(LABELS, 10, 0), "shards_per_client must be at least 1"),
        (lambda: shard(LABELS, 300, 2), "lower shards_per_client or num_clients"),
        (lambda: classes_per_client(LABELS, 10, 0), "between 1 and 10"),
        (lambda: classes_per_client(LABELS, 10, 11), "between 1 and 10"),
        (lambda: partition(LABELS, "zipf", 10), "unknown partition.*iid, dirichlet, shard, classes_per_client"),
        (lambda: iid([], 1), "empty"),
        (lambda: iid(np.zeros((2, 2), dtype=int), 1), "1-D"),
        (lambda: iid([-1, 0], 1), "non-negative"),
        (lambda: iid([0.5, 1.0], 1), "integer class indices"),
        (lambda: class_counts(LABELS, iid(LABELS, 2), 5), "raise num_classes to 10"),
    ],
)
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()

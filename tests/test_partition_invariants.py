"""Partitions against what docs/source/methods.md describes: alpha's skew, the seed, shards, classes per client."""

from __future__ import annotations

import numpy as np
import pytest

# ---- partitions: invariants ---------------------------------------------------------------------------------------


def _np_labels(n_per_class=60, classes=5):
    return np.repeat(np.arange(classes), n_per_class)


def test_dirichlet_alpha_controls_the_skew_and_the_seed_the_draw():
    """Small α gives clients few classes, large α nearly uniform shares; the seed changes the draw."""
    from fl_lightning.core.partitions import class_counts, dirichlet

    y = _np_labels(200, 5)

    def mean_max_share(alpha, seed=0):  # the largest client share of each class p_{c,i}, averaged over classes
        counts = class_counts(y, dirichlet(y, 5, alpha, seed=seed, min_size=1), 5).astype(float)
        return float((counts.max(0) / counts.sum(0)).mean())

    assert mean_max_share(0.05) > 0.75
    assert mean_max_share(1000.0) < 0.3
    a, b = dirichlet(y, 5, 0.5, seed=0), dirichlet(y, 5, 0.5, seed=1)
    assert any(not np.array_equal(p, q) for p, q in zip(a, b, strict=True))


def test_dirichlet_accepts_clients_of_exactly_min_size():
    from fl_lightning.core.partitions import dirichlet

    y = np.zeros(20, dtype=np.int64)  # one class, two clients, min_size 10: only the 10/10 split is accepted
    for seed in range(3):
        try:
            parts = dirichlet(y, 2, 1e6, seed=seed, min_size=10, max_draws=50)
        except ValueError:
            continue
        assert [len(p) for p in parts] == [10, 10]
        return
    pytest.fail("a 10/10 split of 20 samples with alpha 1e6 was never accepted")


def test_iid_is_shuffled_by_the_seed():
    from fl_lightning.core.partitions import iid

    y = np.arange(100) % 3
    first = iid(y, 4, seed=0)[0]
    assert not np.array_equal(first, np.arange(25))
    assert not np.array_equal(first, iid(y, 4, seed=1)[0])


def test_shard_clients_hold_random_label_sorted_shards():
    from fl_lightning.core.partitions import class_counts, shard

    y = _np_labels(40, 5)  # 200 samples, 10 clients x 2 shards of 10
    held = set()
    for seed in range(3):
        parts = shard(y, 10, 2, seed=seed)
        counts = class_counts(y, parts, 5)
        assert all(len(p) == 20 for p in parts)
        assert (np.count_nonzero(counts, axis=1) <= 2).all()  # each shard is one label
        assert (counts % 10 == 0).all()
        held.add(tuple(map(tuple, counts)))
    assert len(held) > 1  # the deal depends on the seed
    # the shards are dealt at random: not always a client's two shards from the same label
    assert any((np.count_nonzero(class_counts(y, shard(y, 10, 2, seed=s), 5), axis=1) == 2).any() for s in range(3))


def test_classes_per_client_holds_its_own_label_and_k_distinct_ones_split_evenly():
    from fl_lightning.core.partitions import class_counts, classes_per_client

    classes, clients, k = 5, 7, 3
    y = _np_labels(42, classes)
    parts = classes_per_client(y, clients, k, seed=3)
    counts = class_counts(y, parts, classes)
    for i in range(clients):
        assert counts[i, i % classes] > 0
        assert np.count_nonzero(counts[i]) == k
    for c in range(classes):
        holders = counts[:, c][counts[:, c] > 0]
        assert holders.sum() == 42 and holders.max() - holders.min() <= 1
    # each label's samples are shuffled before the split: a client's share is not a contiguous run
    contiguous = all(np.all(np.diff(p[y[p] == c]) == 1) for p in parts for c in np.unique(y[p]))
    assert not contiguous

"""Partition invariants on tiny synthetic labels, one test per invariant; partitioners as objects and by name."""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import quickstart_fit_args, read_summary

from fl_lightning.core.partitions import (
    IID,
    PARTITIONERS,
    ClassesPerClient,
    Dirichlet,
    Given,
    Partitioner,
    Shard,
    class_counts,
    classes_per_client,
    dirichlet,
    iid,
    make_partitioner,
    shard,
)

ROOT = Path(__file__).resolve().parent.parent
LABELS = np.repeat(np.arange(10), 50)  # 10 classes x 50 samples
#: One of each seeded partitioner (``given`` has no randomness and is tested on its own).
SEEDED = {
    "iid": IID(),
    "dirichlet": Dirichlet(0.5, min_size=5),
    "shard": Shard(2),
    "classes_per_client": ClassesPerClient(2),
}
#: Every partitioner, ``given`` with ids that make 10 clients of 50 samples.
EVERY = {**SEEDED, "given": Given(np.arange(len(LABELS)) % 10)}


def _digest(parts: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(np.asarray(p, dtype=np.int64).tobytes() + b"|")
    return h.hexdigest()[:16]


# ---- invariants of every partitioner ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", EVERY)
def test_one_part_per_client_each_index_used_at_most_once(name):
    parts = EVERY[name](LABELS, 10, seed=3)
    assert len(parts) == 10
    flat = np.concatenate(parts)
    assert len(flat) == len(set(flat.tolist()))
    assert flat.min() >= 0 and flat.max() < len(LABELS)


@pytest.mark.parametrize("name", EVERY)
def test_parts_are_sorted_int64(name):
    parts = EVERY[name](LABELS, 10, seed=3)
    assert all(p.dtype == np.int64 and p.ndim == 1 for p in parts)
    assert all(np.all(np.diff(p) > 0) for p in parts)


@pytest.mark.parametrize("name", EVERY)
def test_every_sample_used(name):
    """500 samples in 20 equal shards, client i holding label i: here every scheme covers every sample."""
    parts = EVERY[name](LABELS, 10, seed=1)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(LABELS)))


@pytest.mark.parametrize("name", ["iid", "dirichlet"])
def test_all_samples_used_for_any_client_count(name):
    parts = SEEDED[name](LABELS, 7, seed=1)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(LABELS)))


@pytest.mark.parametrize("name", SEEDED)
def test_deterministic_for_a_seed_and_different_for_another(name):
    a, b, c = (SEEDED[name](LABELS, 10, seed=s) for s in (7, 7, 8))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("name", SEEDED)
def test_class_makeup_is_a_function_of_the_labels(name):
    """Reordering the dataset permutes the indices but not what each client holds."""
    perm = np.random.default_rng(0).permutation(len(LABELS))
    original = class_counts(LABELS, SEEDED[name](LABELS, 10, seed=2), 10)
    shuffled = class_counts(LABELS[perm], SEEDED[name](LABELS[perm], 10, seed=2), 10)
    assert sorted(original.sum(1).tolist()) == sorted(shuffled.sum(1).tolist())
    if name != "iid":  # label-driven schemes: identical client x class table
        assert np.array_equal(original, shuffled)


@pytest.mark.parametrize("name", SEEDED)
def test_objects_call_the_pure_functions(name):
    direct = {
        "iid": lambda: iid(LABELS, 10, 4),
        "dirichlet": lambda: dirichlet(LABELS, 10, 0.5, 4, min_size=5),
        "shard": lambda: shard(LABELS, 10, 2, 4),
        "classes_per_client": lambda: classes_per_client(LABELS, 10, 2, 4),
    }[name]()
    via = SEEDED[name](LABELS, 10, seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(direct, via, strict=True))


# ---- the same partitions as before the partitioners were objects ---------------------------------------------------
# Digests of `partition(labels, scheme, ...)` (the dispatcher these classes replaced), recorded before the change.


@pytest.mark.parametrize(
    ("seed", "digest", "first"),
    [
        (0, "904c4fef9ec1941b", [3, 34, 104]),
        (1, "5692a36ac28c3c80", [101, 379, 391]),
        (2, "b10b674eb3510a55", [192, 272, 292]),
    ],
)
def test_dirichlet_01_100_clients_as_before(seed, digest, first):
    """FedNTD's LDA setting: Dir(0.1) over 100 clients of a 60 000-sample, 10-class set, min_size 10."""
    parts = Dirichlet(0.1)(np.arange(60000) % 10, 100, seed)
    assert _digest(parts) == digest and parts[0][:3].tolist() == first
    assert (
        _digest(make_partitioner("dirichlet", alpha=0.1, min_client_size=10)(np.arange(60000) % 10, 100, seed))
        == digest
    )


@pytest.mark.parametrize(
    ("partitioner", "clients", "seed", "digest"),
    [
        (Dirichlet(0.1, min_size=1), 100, 0, "faff7cca008c2fcb"),
        (Dirichlet(0.1, min_size=1), 100, 7, "36aa93a5875dcc86"),
        (Dirichlet(0.5), 10, 3, "c944857cce47b5c6"),
        (Shard(2), 10, 0, "83fa34886c0f04cc"),
        (Shard(2), 10, 3, "a34ec37a03e47c0f"),
        (ClassesPerClient(2), 10, 0, "5845b8f8bdfff042"),
        (ClassesPerClient(2), 10, 3, "7307dba33b0a43b3"),
        (IID(), 10, 0, "5a651a68c26d08ad"),
        (IID(), 10, 3, "4de6ad3666e6a651"),
    ],
    ids=repr,
)
def test_same_partitions_as_before(partitioner, clients, seed, digest):
    """2000 samples of 10 classes."""
    assert _digest(partitioner(np.arange(2000) % 10, clients, seed)) == digest


# ---- the pure functions ---------------------------------------------------------------------------------------------


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
    with pytest.raises(
        ValueError, match=r"after 3 draws.*min_size=12.*raise alpha, lower min_size or num_clients \(--data.alpha, "
    ):
        dirichlet(LABELS, 40, alpha=0.01, seed=0, min_size=12, max_draws=3)
    with pytest.raises(ValueError, match=r"after 3 draws"):
        Dirichlet(0.01, min_size=12, max_draws=3)(LABELS, 40, seed=0)


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


def test_given_maps_sorted_ids_to_clients():
    parts = Given(["b", "a", "b", "c"])([0, 1, 0, 1], num_clients=3)
    assert [p.tolist() for p in parts] == [[1], [0, 2], [3]]


# ---- the objects: labels, registry, short options ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("partitioner", "label"),
    [
        (IID(), "iid"),
        (Dirichlet(), "dirichlet(0.5)"),
        (Dirichlet(0.05), "dirichlet(0.05)"),
        (Dirichlet(1), "dirichlet(1)"),
        (Shard(), "shard(2)"),
        (ClassesPerClient(3), "classes_per_client(3)"),
        (Given(), "given"),
    ],
    ids=repr,
)
def test_labels_are_the_recorded_partition_names(partitioner, label):
    """summary.json's `partition`, as FederatedDataModule.partition_label wrote it before."""
    assert partitioner.label == label


def test_registry_by_short_name():
    assert list(PARTITIONERS) == ["iid", "dirichlet", "shard", "classes_per_client", "given"]
    assert all(cls.name == name and issubclass(cls, Partitioner) for name, cls in PARTITIONERS.items())


def test_repr_and_init_args():
    assert repr(Dirichlet(0.1)) == "Dirichlet(alpha=0.1, min_size=10, max_draws=100)"
    assert repr(IID()) == "IID()" and repr(Shard(3)) == "Shard(shards_per_client=3)"
    assert repr(Given([1, 2, 2])) == "Given(<3 client ids>)"
    assert Given([1, 2, 2]).init_args() == {"client_ids": [1, 2, 2]}
    assert ClassesPerClient(4).init_args() == {"classes_per_client": 4}


def test_make_partitioner_from_short_options():
    part = make_partitioner("dirichlet", alpha=0.1, min_client_size=3, shards_per_client=5)
    assert isinstance(part, Dirichlet) and (part.alpha, part.min_size, part.max_draws) == (0.1, 3, 100)
    assert (
        repr(make_partitioner("classes_per_client", classes_per_client=3)) == "ClassesPerClient(classes_per_client=3)"
    )
    assert isinstance(make_partitioner("iid", alpha=0.1), IID)  # another scheme's option is ignored
    assert isinstance(make_partitioner("given"), Given)


def test_make_partitioner_keeps_an_object():
    obj = Shard(3)
    assert make_partitioner(obj) is obj
    assert make_partitioner(obj, alpha=0.5, shards_per_client=2, classes_per_client=2, min_client_size=10) is obj


def test_short_option_with_an_object_is_refused():
    with pytest.raises(
        ValueError, match=r"Shard\(shards_per_client=3\) is an object .* alpha=0.1 would be unused"
    ) as err:
        make_partitioner(Shard(3), alpha=0.1)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="min_client_size=2"):
        make_partitioner(Dirichlet(0.1), min_client_size=2)


def test_datamodule_short_option_defaults_are_the_partitioners():
    """An object with untouched short options is accepted: the datamodule's defaults are the classes' own."""
    from fl_lightning.data import FederatedDataModule

    params = inspect.signature(FederatedDataModule.__init__).parameters
    for cls in PARTITIONERS.values():
        own = inspect.signature(cls.__init__).parameters
        for option, arg in cls.short_options.items():
            assert params[option].default == own[arg].default, option


# ---- errors: one line, saying what to change ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: iid(LABELS, 0), "num_clients must be at least 1"),
        (lambda: iid(LABELS, 2.5), "num_clients must be an integer"),
        (lambda: iid(LABELS, 501), "more clients"),
        (lambda: IID()(LABELS, 501), r"more clients \(501\) than samples \(500\); use at most 500 clients"),
        (lambda: Shard(1)(LABELS, 501), "more clients"),
        (lambda: dirichlet(LABELS, 10, alpha=0.0), "positive"),
        (lambda: dirichlet(LABELS, 10, alpha=-1.0), "positive"),
        (lambda: dirichlet(LABELS, 10, alpha=float("nan")), "positive"),
        (lambda: dirichlet(LABELS, 10, alpha=float("inf")), "positive"),
        (lambda: Dirichlet(0), "the Dirichlet concentration must be a positive number, got alpha=0; give a finite"),
        (lambda: Dirichlet(-1.0), "positive"),
        (lambda: Dirichlet(float("nan")), "positive"),
        (lambda: Dirichlet("a"), "positive"),
        (lambda: Dirichlet(0.5, min_size=-1), "min_size must be at least 0"),
        (lambda: Dirichlet(0.5, max_draws=0), "max_draws must be at least 1"),
        (
            lambda: Dirichlet(1.0, min_size=100)(LABELS, 10),
            r"lower min_size or num_clients \(--data.min_client_size, --data.num_clients, in Python ",
        ),
        (lambda: dirichlet(LABELS, 10, alpha=1.0, min_size=-1), "min_size must be at least 0"),
        (
            lambda: dirichlet(LABELS, 10, alpha=1.0, min_size=100),
            r"lower min_size or num_clients \(--data.min_client_size, --data.num_clients, in Python ",
        ),
        (lambda: dirichlet(LABELS, 10, alpha=1.0, max_draws=0), "max_draws"),
        (lambda: shard(LABELS, 10, 0), "shards_per_client must be at least 1"),
        (lambda: Shard(0), "shards_per_client must be at least 1, got 0"),
        (lambda: Shard(2.5), "shards_per_client must be an integer"),
        (lambda: shard(LABELS, 300, 2), "lower shards_per_client or num_clients"),
        (lambda: Shard(2)(LABELS, 300), "lower shards_per_client or num_clients"),
        (lambda: classes_per_client(LABELS, 10, 0), "between 1 and 10"),
        (lambda: classes_per_client(LABELS, 10, 11), "between 1 and 10"),
        (lambda: ClassesPerClient(0), "classes_per_client must be at least 1"),
        (lambda: ClassesPerClient(11)(LABELS, 10), "between 1 and 10"),
        (lambda: ClassesPerClient(11).check_num_classes(10), "between 1 and 10"),
        (lambda: Given()(LABELS, 10), "needs client_ids"),
        (lambda: Given([0, 1])(LABELS, 2), "give one id per sample"),
        (lambda: Given(np.arange(500) % 4)(LABELS, 10), "name 4 distinct clients but num_clients is 10"),
        (lambda: Given([[0, 1]]), "1-D"),
        (lambda: make_partitioner("zipf"), "unknown partition 'zipf'; choose one of iid, dirichlet, shard, classes_"),
        (lambda: make_partitioner(None), "unknown partition None"),
        (lambda: iid([], 1), "empty"),
        (lambda: iid(np.zeros((2, 2), dtype=int), 1), "1-D"),
        (lambda: iid([-1, 0], 1), "non-negative"),
        (lambda: iid([0.5, 1.0], 1), "integer class indices"),
        (lambda: class_counts(LABELS, iid(LABELS, 2), 5), "raise num_classes to 10"),
    ],
)
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match) as err:
        call()
    assert "\n" not in str(err.value)


def test_unknown_short_option_is_a_type_error():
    with pytest.raises(TypeError, match="unknown partition options"):
        make_partitioner("iid", beta=1)


# ---- the datamodule takes a name or an object ------------------------------------------------------------------------


def _digits(**kwargs):
    from fl_lightning.data import FederatedDataModule

    return FederatedDataModule("digits", **{"num_clients": 5, "batch_size": 32, **kwargs})


def test_datamodule_object_equals_the_short_name():
    by_name, by_object = _digits(partition="dirichlet", alpha=0.3), _digits(partition=Dirichlet(0.3))
    by_name.setup("fit")
    by_object.setup("fit")
    assert by_name.partition_label == by_object.partition_label == "dirichlet(0.3)"
    assert all(a.equal(b) for a, b in zip(by_name.client_indices, by_object.client_indices, strict=True))
    assert by_name.hparams["partition"] == "dirichlet" and by_name.hparams["alpha"] == 0.3
    assert by_object.hparams["partition"] == {
        "class_path": "fl_lightning.core.partitions.Dirichlet",
        "init_args": {"alpha": 0.3, "min_size": 10, "max_draws": 100},
    }


def test_datamodule_keeps_only_the_partitioner():
    dm = _digits(partition="shard", shards_per_client=3, alpha=0.1)  # alpha: another scheme's, ignored
    assert repr(dm.partitioner) == "Shard(shards_per_client=3)" and dm.partition_label == "shard(3)"
    assert not any(hasattr(dm, a) for a in ("alpha", "shards_per_client", "classes_per_client", "min_client_size"))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"partition": Shard(2), "alpha": 0.1}, "alpha=0.1 would be unused"),
        ({"partition": Dirichlet(0.1), "min_client_size": 2}, "min_client_size=2 would be unused"),
        ({"partition": Shard(2), "client_ids": [0] * 1437}, "only used by partition 'given', not 'shard\\(2\\)'"),
        ({"partition": "classes_per_client", "classes_per_client": 11}, "between 1 and 10"),
        ({"partition": ClassesPerClient(11)}, "between 1 and 10"),
        ({"partition": Given()}, "needs client_ids"),
        ({"partition": Given([0] * 1437), "client_ids": [0] * 1437}, "given twice"),
        ({"partition": Given([0, 1])}, "name 2 distinct clients but num_clients is 5"),
        ({"partition": 3}, "unknown partition 3"),
    ],
    ids=str,
)
def test_datamodule_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match) as err:
        _digits(**kwargs)
    assert "\n" not in str(err.value)


def test_datamodule_given_object_or_option():
    from fl_lightning.data import FederatedDataModule

    x = np.random.default_rng(0).random((60, 4)).astype(np.float32)
    y = np.arange(60) % 3
    ids = [f"w{i % 4}" for i in range(60)]
    by_option = FederatedDataModule.from_tensors(x, y, x, y, partition="given", client_ids=ids, holdout_per_class=2)
    by_object = FederatedDataModule.from_tensors(x, y, x, y, partition=Given(ids), holdout_per_class=2)
    by_both = FederatedDataModule.from_tensors(x, y, x, y, partition=Given(), client_ids=ids, holdout_per_class=2)
    for dm in (by_option, by_object, by_both):
        dm.setup("fit")
        assert dm.num_clients == 4 and dm.client_names == ["w0", "w1", "w2", "w3"] and dm.partition_label == "given"
    assert all(a.equal(b) for a, b in zip(by_option.client_indices, by_object.client_indices, strict=True))
    assert all(a.equal(b) for a, b in zip(by_option.client_indices, by_both.client_indices, strict=True))
    assert sum(by_option.client_sizes) == 60 - 6  # the holdout's samples are no client's


# ---- the object form from the command line and YAML --------------------------------------------------------------


def test_cli_partition_object_resolves():
    from fl_lightning.cli import resolve_config

    base = ["fit", "--config", str(ROOT / "configs/quickstart.yaml")]
    config = resolve_config(
        [*base, "--data.partition", "fl_lightning.core.partitions.Dirichlet", "--data.partition.alpha", "0.1"]
    )
    assert config["data"]["partition"] == {
        "class_path": "fl_lightning.core.partitions.Dirichlet",
        "init_args": {"alpha": 0.1, "min_size": 10, "max_draws": 100},
    }
    assert resolve_config([*base, "--data.partition", "iid"])["data"]["partition"] == "iid"


def test_cli_partition_object_from_yaml(tmp_path):
    from fl_lightning.cli import cli_main

    piece = tmp_path / "shard3.yaml"
    piece.write_text(
        yaml.safe_dump(
            {
                "data": {
                    "partition": {
                        "class_path": "fl_lightning.core.partitions.Shard",
                        "init_args": {"shards_per_client": 3},
                    }
                }
            }
        )
    )
    cli = cli_main(["--config", str(ROOT / "configs/quickstart.yaml"), "--config", str(piece)], run=False)
    assert repr(cli.datamodule.partitioner) == "Shard(shards_per_client=3)"
    with pytest.raises(ValueError, match="alpha=0.1 would be unused"):
        cli_main(
            ["--config", str(ROOT / "configs/quickstart.yaml"), "--config", str(piece), "--data.alpha", "0.1"],
            run=False,
        )


def test_cli_partition_object_tiny_run_and_resume(tmp_path):
    """A run with a partition object records its label, and resumes only with the same object."""
    from fl_lightning.cli import cli_main
    from fl_lightning.core.rundir import RunDirError

    run_dir = tmp_path / "run"

    def fit(rounds, *extra):
        return quickstart_fit_args(
            run_dir, "--data.partition.class_path", "fl_lightning.core.partitions.Shard", *extra, rounds=rounds
        )

    cli_main(fit(1))
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["partition"] == "shard(2)"
    with pytest.raises(RunDirError, match=r"data\.partition\.init_args\.shards_per_client: 2 -> 3"):
        cli_main(fit(2, "--data.partition.init_args.shards_per_client", "3", "--ckpt_path", "last"))
    cli_main(fit(2, "--ckpt_path", "last"))
    assert read_summary(run_dir)["rounds"] == 2


# ---- a user's partitioner: its result and its registration are checked ----------------------------------------------


class _Returns(Partitioner):
    """Returns what it is given, whatever the labels."""

    def __init__(self, parts=None) -> None:
        self.parts = parts

    def __call__(self, labels, num_clients, seed=0):
        return self.parts


_N = 1437  # digits' training samples


@pytest.mark.parametrize(
    ("parts", "match"),
    [
        ([np.arange(0, 700), np.arange(600, _N)] + [np.arange(i, i + 1) for i in range(3)], "more than one client"),
        ([np.arange(_N)], "returned 1 index arrays for 5 clients"),
        (None, "returned NoneType for 5 clients"),
        (
            [np.arange(5) + 10**6] + [np.arange(i, i + 1) for i in range(4)],
            "index 1000004, outside the 1437 training samples",
        ),
        ([np.arange(-1, 3)] + [np.arange(i, i + 1) + 10 for i in range(4)], "index -1"),
        ([np.linspace(0, 9, 5)] + [np.arange(i, i + 1) + 10 for i in range(4)], "client 0 a float64 array"),
    ],
    ids=["overlap", "count", "none", "above", "below", "floats"],
)
def test_a_partitioners_result_is_checked_at_setup(parts, match):
    dm = _digits(partition=_Returns(parts))
    with pytest.raises(ValueError, match=match) as err:
        dm.setup("fit")
    assert "\n" not in str(err.value)


def test_a_partition_may_leave_samples_out_and_says_how_many_it_holds(caplog):
    parts = [np.arange(i * 100, i * 100 + 50) for i in range(5)]
    dm = _digits(partition=_Returns(parts))
    with caplog.at_level("INFO"):
        dm.setup("fit")
    assert dm.client_sizes == [50] * 5
    assert "1437 training samples, 250 of them over 5 clients" in caplog.text


@pytest.mark.parametrize(
    ("name", "entry", "error", "match"),
    [
        ("iid", Shard, ValueError, "already has 'iid'.*del PARTITIONERS\\['iid'\\]"),
        ("mine", lambda labels, num_clients, seed=0: [], TypeError, "must be a subclass of Partitioner"),
        ("mine", Shard(2), TypeError, "the class itself, not an instance"),
        ("mine", Shard, TypeError, "registered under its name 'shard'"),
    ],
    ids=["taken", "function", "instance", "other-name"],
)
def test_partitioners_registry_refuses_wrong_entries(name, entry, error, match):
    with pytest.raises(error, match=match):
        PARTITIONERS[name] = entry
    assert list(PARTITIONERS) == ["iid", "dirichlet", "shard", "classes_per_client", "given"]


def test_a_registered_partitioner_is_used_by_name(monkeypatch):
    class Halves(_Returns):
        name = "halves"

        def __call__(self, labels, num_clients, seed=0):
            return np.array_split(np.arange(len(labels)), num_clients)

    monkeypatch.setitem(PARTITIONERS, "halves", Halves)
    dm = _digits(partition="halves", num_clients=2)
    dm.setup("fit")
    assert dm.client_sizes == [719, 718]

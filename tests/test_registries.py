"""The tables that name extension points refuse a name already taken and an entry of the wrong kind, in one line."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from fl_lightning.core.datasets import DATASETS
from fl_lightning.core.models import MODELS, lenet
from fl_lightning.core.partitions import PARTITIONERS
from fl_lightning.core.registry import Registry
from fl_lightning.core.server_optim import SERVER_OPTIMIZERS, ServerSGD
from fl_lightning.methods import METHODS, FedAvg, FedNTD

TABLES = {
    "METHODS": METHODS,
    "DATASETS": DATASETS,
    "MODELS": MODELS,
    "PARTITIONERS": PARTITIONERS,
    "SERVER_OPTIMIZERS": SERVER_OPTIMIZERS,
}


class _Mine(FedAvg):
    """A user's method: its results are recorded as ``_mine``."""


@pytest.mark.parametrize(
    ("table", "name", "entry", "match"),
    [
        ("METHODS", "fedntd", _Mine, "already has 'fedntd'"),
        ("METHODS", "mine", FedNTD(), "subclass of FedAvg \\(the class itself, not an instance\\)"),
        ("METHODS", "mine", _Mine, "under its method_name '_mine' \\(or set method_name = 'mine'\\)"),
        ("DATASETS", "digits", replace(DATASETS["mnist"], name="digits"), "already has 'digits'"),
        ("DATASETS", "mine", "digits", "must be a DatasetInfo"),
        ("DATASETS", "mine", DATASETS["digits"], "under its name 'digits'"),
        ("MODELS", "lenet", lambda c, s, k: lenet(c, s, k), "already has 'lenet'"),
        ("MODELS", "mine", "lenet", "must be a builder"),
        ("SERVER_OPTIMIZERS", "sgd", type("Other", (ServerSGD,), {}), "already has 'sgd'"),
        ("SERVER_OPTIMIZERS", "mine", ServerSGD(), "subclass of ServerOptimizer"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_wrong_entry_is_refused_and_the_table_unchanged(table, name, entry, match):
    registry = TABLES[table]
    before = dict(registry)
    with pytest.raises((TypeError, ValueError), match=match) as err:
        registry[name] = entry
    assert "\n" not in str(err.value) and str(err.value).startswith(table)
    assert dict(registry) == before


def test_an_entry_registers_replaces_after_del_and_pickles(monkeypatch):
    monkeypatch.setitem(METHODS, "_mine", _Mine)
    assert METHODS["_mine"] is _Mine
    METHODS["_mine"] = _Mine  # the same entry again: a no-op
    table = Registry("T", lambda name, entry: None, {"a": 1})
    del table["a"]
    table["a"] = 2
    table.update(b=3)
    assert table.setdefault("b", 4) == 3 and dict(table) == {"a": 2, "b": 3}
    for registry in (METHODS, MODELS, PARTITIONERS, SERVER_OPTIMIZERS):  # DATASETS' loaders are closures
        assert dict(pickle.loads(pickle.dumps(registry))) == dict(registry)


def test_in_place_union_checks_each_entry_too():
    table = Registry("T", lambda name, entry: None if isinstance(entry, int) else "must be an int", {"a": 1})
    with pytest.raises(TypeError, match=r"T\['b'\] must be an int"):
        table |= {"b": "x"}
    with pytest.raises(ValueError, match="already has 'a'"):
        table |= {"a": 2}
    table |= {"c": 3}
    assert dict(table) == {"a": 1, "c": 3}

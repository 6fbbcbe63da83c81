"""Each method in a tiny federation: it runs, learns, and receives its server state through the per-round channel."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_run

from fl_lightning.methods import METHODS, FedAvg, FedKA, FedLMD, FedLMDTf, FedSSD

DATA = {"holdout_per_class": 5, "partition": "dirichlet", "alpha": 0.5}


def _model_kwargs(name):
    return {"aux_per_class": 5} if name == "fedssd" else None


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_learns(tmp_path, name):
    _, fed, model = tiny_run(
        tmp_path,
        method=METHODS[name],
        rounds=4,
        data_kwargs=DATA,
        fed_kwargs={"local_epochs": 3},
        model_kwargs=_model_kwargs(name),
    )
    accs = [row["global_acc"] for row in fed.recorder.history]
    assert fed.recorder.status == "completed"
    assert accs[-1] > 0.6, accs
    assert accs[-1] > accs[0]
    assert model.method_name == name


def test_teacher_free_runs_no_teacher(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(FedAvg, "teacher_logits", lambda self, x: calls.append(1) or torch.zeros(len(x), 10))
    tiny_run(tmp_path / "tf", method=FedLMDTf, rounds=1)
    assert calls == []
    tiny_run(tmp_path / "lmd", method=FedLMD, rounds=1)
    assert calls


def test_fedavg_runs_no_teacher(tmp_path, monkeypatch):
    monkeypatch.setattr(FedAvg, "teacher_logits", lambda self, x: pytest.fail("FedAvg ran a teacher"))
    tiny_run(tmp_path, rounds=1)


def test_lmd_switch_round(tmp_path):
    seen = []

    class Spy(FedLMDTf):
        def on_client_start(self, client):
            super().on_client_start(client)
            seen.append((client.round, self._use_teacher))

    tiny_run(tmp_path, method=Spy, rounds=3, model_kwargs={"switch_round": 2})
    assert {r: t for r, t in seen} == {0: False, 1: False, 2: True}


def test_ssd_gets_credibility_each_round(tmp_path):
    matrices = []

    class Spy(FedSSD):
        def on_client_start(self, client):
            super().on_client_start(client)
            matrices.append((client.round, client.server["credibility"].clone()))

    tiny_run(tmp_path, method=Spy, rounds=2, data_kwargs=DATA, model_kwargs={"aux_per_class": 5})
    assert {r for r, _ in matrices} == {0, 1}
    for _, a in matrices:
        assert a.shape == (10, 10)
        torch.testing.assert_close(a.sum(1), torch.ones(10))
    assert not torch.equal(matrices[0][1], matrices[-1][1])  # recomputed with the new global model


@pytest.mark.parametrize(("num_classes", "m_max"), [(10, 0.01), (100, 0.001), (200, 0.001)])
def test_ssd_m_max_default_follows_the_class_count(num_classes, m_max):
    """FedSSD's M_max: the paper's 0.01 for 10 classes, 0.001 for 100 and 200; an explicit value wins."""
    assert FedSSD(num_classes=num_classes).m_max == m_max
    assert FedSSD(num_classes=num_classes, m_max=0.3).m_max == 0.3


def test_ssd_needs_holdout(tmp_path):
    with pytest.raises(ValueError, match="holdout_per_class 64"):
        tiny_run(tmp_path, method=FedSSD, rounds=1)


def test_ka_anchor_set(tmp_path):
    anchors = []

    class Spy(FedKA):
        def on_client_start(self, client):
            super().on_client_start(client)
            missing, non_dom, dom = (m.tolist() for m in torch_groups(client.class_counts, self.gamma))
            size = 0 if self.anchor_x is None else len(self.anchor_x)
            anchors.append((size, sum(missing) + sum(non_dom)))

    from fl_lightning.core.losses import ka_class_groups as torch_groups

    tiny_run(
        tmp_path,
        method=Spy,
        rounds=2,
        data_kwargs={"holdout_per_class": 1, "partition": "dirichlet", "alpha": 0.1, "min_client_size": 5},
        model_kwargs={"mu": 3},
    )
    assert anchors
    for size, wanted in anchors:
        assert size == min(3, wanted)


def test_kd_beta_zero_is_fedavg(tmp_path):
    _, fed_a, _ = tiny_run(tmp_path / "a", rounds=2)
    _, fed_k, _ = tiny_run(tmp_path / "k", method=METHODS["kd"], rounds=2, model_kwargs={"beta": 0.0})
    assert fed_a.recorder.history[-1]["global_acc"] == pytest.approx(fed_k.recorder.history[-1]["global_acc"], abs=1e-6)


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("fedntd", {"tau": 0.0}, "tau"),
        ("kd", {"beta": 2.0}, "beta"),
        ("fedcad", {"beta": 0.6, "gamma": 0.5}, "beta <= gamma"),
        ("fedlmd", {"switch_round": 3}, "teacher_free"),
        ("fedka", {"mu": 0}, "mu"),
        ("fedssd", {"m_max": -1.0}, "m_max"),
    ],
)
def test_bad_hyperparameters(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        METHODS[name](**kwargs)

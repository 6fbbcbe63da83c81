"""The server side of a round: uploads, the server step, and state that outlives a round (in memory or on disk)."""

from __future__ import annotations

import collections
import io
import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import Pair, read_metrics, read_summary, tiny_run

from fl_lightning import FedAvg
from fl_lightning.core.context import ClientContext, ServerContext
from fl_lightning.core.state import (
    STATE_TYPE_KEY,
    ClientStateStore,
    plain_state,
    restore_state,
    unpicklable,
    unstorable_state,
    weights_only_refuses,
)


class Probe(FedAvg):
    """Uploads its client id and a count; keeps a visit counter per client and a round counter on the server."""

    method_name = "probe"
    upload_reduce = {"count": "sum"}
    seen: list[dict[str, Any]] = []

    def on_round_start(self, server: ServerContext) -> dict[str, Any]:
        server.state["rounds"] = server.state.get("rounds", torch.tensor(0)) + 1
        self.net.classifier.bias.data.fill_(0.5)  # set by the server before the round: every client must see it
        return {"rounds": int(server.state["rounds"])}

    def on_client_start(self, client: ClientContext) -> None:
        assert torch.all(self.net.classifier.bias == 0.5)
        assert torch.all(client.global_weights["net.classifier.bias"] == 0.5)
        client.state["visits"] = client.state.get("visits", torch.tensor(0)) + 1

    def on_client_end(self, client: ClientContext) -> dict[str, torch.Tensor]:
        assert client.state["visits"].device == self.device
        return {"count": torch.tensor(1.0), "id": torch.tensor(float(client.client))}

    def server_update(self, server: ServerContext, average: dict, uploads: dict) -> dict:
        type(self).seen.append(
            {"clients": server.clients, "weights": server.weights, **{k: float(v) for k, v in uploads.items()}}
        )
        return average


@pytest.mark.parametrize("client_state_mb", [None, 0.0])
def test_uploads_server_state_and_client_state(tmp_path, client_state_mb) -> None:
    Probe.seen = []
    rounds = 4
    _, fed, _ = tiny_run(
        tmp_path, method=Probe, rounds=rounds, fed_kwargs={"sample_ratio": 0.6, "client_state_mb": client_state_mb}
    )
    assert len(Probe.seen) == rounds
    for entry in Probe.seen:
        assert entry["count"] == len(entry["clients"])  # "sum" keys add up
        expected = sum(w * c for w, c in zip(entry["weights"], entry["clients"], strict=True))
        assert entry["id"] == pytest.approx(expected)  # other keys are p_k-weighted
    assert int(fed.server_state["rounds"]) == rounds
    visits = {c: sum(c in fed.plan(r).clients for r in range(rounds)) for c in range(5)}
    stored = {c: int(state["visits"]) for c, state in fed.client_states.items()}
    assert stored == {c: n for c, n in visits.items() if n}
    usage = read_summary(tmp_path)["client_state"]  # one int64 counter (8 bytes) per client that trained
    in_memory = 0 if client_state_mb == 0.0 else len(stored)
    assert usage == {
        "clients": len(stored),
        "memory_mb": round(8 * in_memory / 2**20, 3),
        "on_disk": len(stored) - in_memory,
    }
    if client_state_mb == 0.0:
        assert fed.client_states.memory_bytes == 0
        assert sorted(p.name for p in (tmp_path / "client_state").iterdir()) == sorted(f"client_{c}.pt" for c in stored)


def test_client_state_store_spills_past_its_budget(tmp_path) -> None:
    store = ClientStateStore(max_memory_mb=1.5 / 1024, spill_dir=tmp_path)  # 1.5 KiB
    one_kib = {"c": torch.zeros(256)}
    store.put(0, one_kib)
    store.put(1, {"c": torch.ones(256)})  # over the budget: to disk
    assert store.memory_bytes == 1024 and (tmp_path / "client_1.pt").exists()
    assert torch.equal(store.get(1)["c"], torch.ones(256))
    assert set(store.state_dict()) == {0, 1}
    restored = ClientStateStore()
    restored.load_state_dict(store.state_dict())
    assert torch.equal(restored.get(1)["c"], torch.ones(256)) and len(restored) == 2
    with pytest.raises(ValueError, match="spill"):
        ClientStateStore(max_memory_mb=1)


class _Returns(FedAvg):
    """A method whose hooks return what the test sets (``None`` where a hook keeps its default)."""

    payload: Any = None
    upload: Any = None
    update: Any = None

    def on_round_start(self, server: ServerContext) -> Any:
        return {} if self.payload is None else self.payload

    def on_client_end(self, client: ClientContext) -> Any:
        return self.upload

    def server_update(self, server: ServerContext, average: Any, uploads: Any) -> Any:
        return average if self.update is None else self.update(average)


@pytest.mark.parametrize("engine", ["sequential", "batched"])
@pytest.mark.parametrize(
    ("hook", "value", "match"),
    [
        ("payload", [1], "Wrong.on_round_start must return a dict .* got \\[1\\]"),
        ("upload", torch.tensor(1.0), "Wrong.on_client_end must return a dict of tensors .* got tensor\\(1.\\)"),
        ("upload", {"seen": 1.0}, "on_client_end must return a dict of tensors .*; 'seen' is float 1.0"),
        ("update", lambda average: None, "Wrong.server_update must return the new global state dict .* got None"),
        ("update", lambda average: dict(list(average.items())[1:]), "server_update .*; missing \\['net\\."),
    ],
    ids=["payload-list", "upload-tensor", "upload-float", "update-none", "update-missing-key"],
)
def test_a_hook_returning_the_wrong_type_is_named_in_one_line(tmp_path, hook, value, match, engine) -> None:
    class Wrong(_Returns):
        pass

    setattr(Wrong, hook, value if hook != "update" else staticmethod(value))
    with pytest.raises(TypeError, match=match) as err:
        tiny_run(tmp_path, method=Wrong, rounds=1, fed_kwargs={"engine": engine})
    assert "\n" not in str(err.value)


def test_a_process_other_than_rank_0_spills_client_states_outside_the_run_directory(tmp_path, monkeypatch) -> None:
    """Spilled states are a process's own cache: only rank 0's live in the run directory; another's go with its fit."""
    from lightning.pytorch.strategies import SingleDeviceStrategy

    from fl_lightning.methods import SCAFFOLD

    spilled: list[str] = []
    real = ClientStateStore._path

    def path(self: ClientStateStore, client: int) -> Path:
        spilled.append(str(self.spill_dir))
        return real(self, client)

    monkeypatch.setattr(ClientStateStore, "_path", path)
    monkeypatch.setattr(SingleDeviceStrategy, "is_global_zero", property(lambda self: False))
    _, fed, _ = tiny_run(tmp_path, method=SCAFFOLD, rounds=2, fed_kwargs={"client_state_mb": 0})
    assert spilled and not any(folder.startswith(str(tmp_path)) for folder in spilled)
    assert not (tmp_path / "client_state").exists()
    assert not Path(spilled[0]).exists()  # removed at the end of the fit


class _Unstorable(FedAvg):
    """Keeps what the test sets in its client state (beside a tensor, so that a spilling store writes it to disk)."""

    client_value: Any = None
    server_value: Any = None

    def on_round_start(self, server: ServerContext) -> dict[str, Any]:
        if self.server_value is not None:
            server.state["schedule"] = self.server_value()
        return {}

    def on_client_end(self, client: ClientContext) -> None:
        client.state["seen"] = torch.ones(4)
        if self.client_value is not None:
            client.state["scale"] = {"fn": self.client_value()}


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (lambda: lambda x: 2 * x, r"function \(.*<lambda>\)"),
        (lambda: (i for i in range(3)), r"generator \(.*<genexpr>\)"),
    ],
    ids=["lambda", "generator"],
)
@pytest.mark.parametrize("client_state_mb", [None, 0.0], ids=["in-memory", "spilled"])
def test_a_client_state_no_checkpoint_can_store_is_named_in_one_line(tmp_path, value, kind, client_state_mb) -> None:
    # Before: the round's checkpoint (or the spilled state's file) failed with pickle's own line, naming neither the
    # client nor the key: "Can't pickle local object '..<lambda>'", "cannot pickle 'generator' object".
    class Keeps(_Unstorable):
        client_value = staticmethod(value)

    with pytest.raises(TypeError) as err:
        tiny_run(tmp_path, method=Keeps, rounds=2, fed_kwargs={"client_state_mb": client_state_mb})
    line = str(err.value)
    assert re.fullmatch(
        rf"client \d's state\['scale'\]\['fn'\] holds a {kind}, which a checkpoint cannot store: keep only tensors, "
        r"numbers, strings and plain dicts, lists or tuples of them in client.state \(rebuild a function, generator "
        r"or open file in on_client_start\)",
        line,
    ), line
    assert not list(tmp_path.rglob(".*.tmp*"))


def test_a_server_state_no_checkpoint_can_store_is_named_in_one_line(tmp_path) -> None:
    log = open(tmp_path / "log.txt", "w")  # noqa: SIM115  # the unstorable value, closed at the end

    class Keeps(_Unstorable):
        server_value = staticmethod(lambda: log)

    with pytest.raises(TypeError, match=r"^server.state\['schedule'\] holds a _io.TextIOWrapper, .* on_round_start\)$"):
        tiny_run(tmp_path, method=Keeps, rounds=1)
    log.close()


def test_unpicklable_finds_the_value_pickle_refuses() -> None:
    class Local:
        pass

    state = {"ok": [1, 2.0, "x", torch.zeros(2), (None, b"")], "deep": {"a": [0, {"b": Local()}]}}
    where, value = unpicklable(state)
    assert where == ("deep", "a", 1, "b") and isinstance(value, Local)
    assert unpicklable({"ok": state["ok"], "counts": collections.Counter("abc")}) is None
    assert unpicklable([collections.defaultdict(lambda: 0.5)])[0] == (0,)  # its factory: the dict itself
    assert unstorable_state("server.state", {"c": torch.zeros(3)}) is None


class TypedState(FedAvg):
    """Keeps a defaultdict, a Counter, an OrderedDict, a named tuple and a frozenset in its server and client states."""

    method_name = "typed_state"
    seen: list[tuple[str, ...]] = []

    def on_round_start(self, server: ServerContext) -> dict[str, Any]:
        state = server.state
        if not state:
            state.update(
                by_round=collections.defaultdict(list),
                votes=collections.Counter(),
                order=collections.OrderedDict(b=torch.zeros(1), a=torch.ones(1)),
                pair=Pair(torch.zeros(2), 0),
                tags=frozenset({"x"}),
            )
        self.seen.append(tuple(type(v).__name__ for v in state.values()))
        state["by_round"][server.round].append(len(server.clients))  # a missing key: the factory must still be there
        state["votes"][server.round % 2] += 1
        state["pair"] = Pair(state["pair"].tensor + 1, state["pair"].count + 1)
        return {}

    def on_client_start(self, client: ClientContext) -> None:
        visits = client.state.setdefault("visits", collections.defaultdict(int))
        self.seen.append(
            (type(visits).__name__, type(client.state.setdefault("pair", Pair(torch.ones(1), 0))).__name__)
        )
        visits[client.round] += 1


@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_state_containers_keep_their_types_between_rounds_and_through_a_resume(tmp_path, engine) -> None:
    TypedState.seen = []
    kwargs: dict[str, Any] = {"data_kwargs": {"num_clients": 2}, "fed_kwargs": {"engine": engine}}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # none of these types needs weights_only=False
        tiny_run(tmp_path, TypedState, rounds=2, **kwargs)
    types = ("defaultdict", "Counter", "OrderedDict", "Pair", "frozenset")
    assert TypedState.seen[3:] == [types, ("defaultdict", "Pair"), ("defaultdict", "Pair")]
    TypedState.seen = []
    _, fed, _ = tiny_run(tmp_path, TypedState, rounds=3, ckpt_path=str(tmp_path / "checkpoints/last.ckpt"), **kwargs)
    assert TypedState.seen == [types, ("defaultdict", "Pair"), ("defaultdict", "Pair")]  # Lightning's default load
    state = fed.server_state
    assert dict(state["by_round"]) == {0: [2], 1: [2], 2: [2]} and state["votes"] == {0: 2, 1: 1}
    assert state["pair"].count == 3 and torch.equal(state["pair"].tensor, torch.full((2,), 3.0))
    assert list(state["order"]) == ["b", "a"] and state["tags"] == frozenset({"x"})
    assert dict(fed.client_states.get(1)["visits"]) == {0: 1, 1: 1, 2: 1}


def test_plain_state_loads_with_weights_only_and_comes_back_with_its_types() -> None:
    state = {
        "dd": collections.defaultdict(list, {3: [torch.ones(2)], (1, 2): []}),
        "nested": [Pair(torch.zeros(1), collections.Counter("aab")), (frozenset({1}), None)],
        "od": collections.OrderedDict(z=1, a=torch.tensor(2)),
        "empty": collections.defaultdict(None),
    }
    buffer = io.BytesIO()
    torch.save(plain_state(state), buffer)
    buffer.seek(0)
    back = restore_state(torch.load(buffer, weights_only=True))
    assert type(back["dd"]) is collections.defaultdict and back["dd"].default_factory is list
    assert back["dd"][(1, 2)] == [] and torch.equal(back["dd"][3][0], torch.ones(2)) and back["dd"]["new"] == []
    pair, (tags, none) = back["nested"]
    assert type(pair) is Pair and pair.count == collections.Counter("aab") and type(pair.count) is collections.Counter
    assert tags == frozenset({1}) and none is None and type(back["nested"][1]) is tuple
    assert type(back["od"]) is collections.OrderedDict and list(back["od"]) == ["z", "a"]
    assert back["empty"].default_factory is None
    assert weights_only_refuses(plain_state(state)) is None


def test_a_named_tuple_a_checkpoint_cannot_name_is_left_to_pickle_and_a_moved_class_is_named_on_load() -> None:
    Local = collections.namedtuple("Local", "a")  # a local class: pickle's own refusal names it (unstorable_state)
    assert plain_state({"x": Local(1)})["x"] == Local(1)
    assert plain_state([collections.defaultdict(lambda: 0)])[0].default_factory() == 0
    moved = {"p": {STATE_TYPE_KEY: "namedtuple", "class": "nowhere.Pair", "fields": [1, 2]}}
    with pytest.raises(ValueError, match=r"^the checkpoint's state holds a named tuple's class 'nowhere.Pair', which"):
        restore_state(moved)


def test_a_state_only_weights_only_false_can_load_is_named_once_with_the_flag_to_resume(tmp_path) -> None:
    class KeepsArray(FedAvg):
        def on_client_start(self, client: ClientContext) -> None:
            client.state["history"] = [np.zeros(2)]

    with pytest.warns(UserWarning) as record:
        tiny_run(tmp_path, KeepsArray, rounds=2, data_kwargs={"num_clients": 2})
    lines = [str(w.message) for w in record if "weights_only" in str(w.message)]
    assert lines == [
        "client 0's state['history'][0] holds a numpy.ndarray, which Lightning's default checkpoint load "
        "(weights_only=True) refuses: resume with --weights_only false (trainer.fit(..., weights_only=False)), or "
        "keep only tensors, numbers, strings and containers of them in the state"
    ]
    last = str(tmp_path / "checkpoints/last.ckpt")
    with pytest.raises(pickle.UnpicklingError):  # what the warning foretold
        tiny_run(tmp_path, KeepsArray, rounds=3, data_kwargs={"num_clients": 2}, ckpt_path=last)
    tiny_run(tmp_path, KeepsArray, rounds=3, data_kwargs={"num_clients": 2}, ckpt_path=last, weights_only=False)
    assert [row["round"] for row in read_metrics(tmp_path)] == ["1", "2", "3"]

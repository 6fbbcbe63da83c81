"""The batched engine's step as one function of static tensors (``Federation(step_capture=...)``).

On the CPU: the step that a GPU records as a CUDA graph (mode ``static``: the same function, not recorded) gives
every method's federation (global weights, losses, client and server state) as the sequential engine does, within
1e-5, with its steps built once and reused in later rounds; it traces as one graph (``torch.compile(fullgraph=True)``,
no graph break) for every method; a step that cannot be built or traced says why and runs on the per-step path; the
cache rebuilds a step when what it baked in changes. On a GPU (``gpu``): the step is captured and replayed, equal to
the sequential engine in float32 and within a point of it after 20 rounds in ``bf16-mixed``.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import bare_trainer
from test_batched import (
    DATA_KWARGS,
    STATEFUL,
    _case,
    _digits_fit,
    assert_same_federation,
    assert_trees_close,
    run,
    weights,
)
from torch import Tensor, nn

import fl_lightning.engines as engines
from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.core.gpu_memory import MIB, StackedMemory
from fl_lightning.core.stacked_sgd import SGDSettings
from fl_lightning.core.step_capture import (
    MAX_SIBLINGS,
    CapturedStep,
    StepCache,
    allocate_state,
    module_fingerprint,
    resolve_capture,
)
from fl_lightning.methods import METHODS, FedNTD
from fl_lightning.stacked import StackedClient, train_stacked


def _captured(fed: Federation) -> StepCache:
    cache = getattr(fed.executor, "capture", None)
    assert isinstance(cache, StepCache), "the batched executor has no step cache"
    return cache


# ---- the modes ---------------------------------------------------------------------------------------------------


def test_auto_captures_on_a_gpu_only_and_graph_needs_one() -> None:
    assert resolve_capture("auto", torch.device("cpu")) == "off"
    assert resolve_capture("auto", torch.device("cuda", 0)) == "graph"
    for mode in ("static", "compile", "off"):
        assert resolve_capture(mode, torch.device("cpu")) == mode
    with pytest.raises(ValueError, match="step_capture=graph records a CUDA graph and this fit runs on cpu"):
        resolve_capture("graph", torch.device("cpu"))
    with pytest.raises(ValueError, match="step_capture must be one of auto, graph, compile, static, off"):
        Federation(step_capture="cuda")


def test_cpu_auto_runs_the_per_step_path(tmp_path: Path) -> None:
    fed, _ = run(tmp_path, "batched")
    assert fed.executor is not None and getattr(fed.executor, "capture", "missing") is None
    assert fed.recorder is not None and fed.recorder.info["step_capture"] == "off"


# ---- 3 and 4. the same science, one graph -------------------------------------------------------------------------


def test_static_steps_are_built_once_and_equal_the_per_step_path(tmp_path: Path) -> None:
    """Three rounds, SGD with momentum, weight decay and clipping; one build, reused.

    Not bit for bit: where few clients are left the per-step path trains them alone, the static step all five
    (masked), and a convolution over another batch count rounds differently.
    """
    kwargs: dict[str, Any] = {
        "rounds": 3,
        "model_kwargs": {"momentum": 0.9, "weight_decay": 1e-3, "clip_grad_norm": 1.0},
        "data_kwargs": {"batch_size": 16},
    }
    off, off_model = run(tmp_path / "off", "batched", FedNTD, fed_kwargs={"step_capture": "off"}, **kwargs)
    static, static_model = run(tmp_path / "static", "batched", FedNTD, fed_kwargs={"step_capture": "static"}, **kwargs)
    assert _captured(static).builds == 1  # one stack of all 5 clients, one batch shape: rounds 2 and 3 reuse it
    for key, value in off_model.state_dict().items():
        torch.testing.assert_close(static_model.state_dict()[key], value, atol=1e-6, rtol=0)
    for row_static, row_off in zip(static.history, off.history, strict=True):
        assert row_static["train_loss"] == pytest.approx(row_off["train_loss"], abs=1e-6)


def test_a_step_where_every_client_takes_a_short_batch_runs_a_sibling_of_the_built_step() -> None:
    """Every client still training takes a short last batch of one shape: a second built step sharing the state."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))
    module = FedNTD(net=net, num_classes=3)
    module.refresh_teacher()
    sgd = SGDSettings(lr=0.1, momentum=0.9, weight_decay=1e-3)
    sizes = [[4, 4, 2], [4, 4, 2], [4, 4], [4, 4, 2]]  # step 2: every client still training takes 2
    data = [[(torch.randn(n, 1, 4, 4), torch.randint(0, 3, (n,))) for n in client] for client in sizes]
    expected = train_stacked(module, _clients(data), sgd)
    cache = StepCache("static")
    siblings = []
    for _ in range(2):  # the second call reuses the built step and its sibling
        got = train_stacked(module, _clients(data), sgd, capture=cache)
        for name, value in {**expected.params, **expected.buffers}.items():
            torch.testing.assert_close({**got.params, **got.buffers}[name], value, atol=0, rtol=0, msg=name)
        assert got.losses == expected.losses
        step = next(iter(cache))
        assert list(step.siblings) == [((2, 1, 4, 4), (2,))]
        siblings.append(step.siblings[((2, 1, 4, 4), (2,))])
        assert siblings[-1].state.params is step.state.params and siblings[-1].state.momentum is step.state.momentum
    assert cache.builds == 1 and cache.notes == [] and siblings[0] is siblings[1]


def test_a_built_step_keeps_a_few_siblings_and_none_when_compiled() -> None:
    state = allocate_state({"w": torch.zeros(2, 3)}, {}, [], ["w"], torch.zeros(2, 4, 3), torch.zeros(2, 4))
    step = CapturedStep(lambda *args: None, state, "static", ["w"])
    assert step.for_batch(torch.zeros(4, 3), torch.zeros(4)) is step
    shorter = [n for n in range(1, MAX_SIBLINGS + 4) if n != 4]
    for n in shorter:
        sibling = step.for_batch(torch.zeros(n, 3), torch.zeros(n))
        assert sibling is not None and sibling is not step and sibling.state.x.shape == (2, n, 3)
    assert [shape[0][0] for shape in step.siblings] == shorter[-MAX_SIBLINGS:]  # the least recently used go first
    assert step.for_batch(torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2)) is None  # another dtype
    compiled = CapturedStep(lambda *args: None, state, "compile", ["w"], compile_backend="eager")
    assert compiled.for_batch(torch.zeros(2, 3), torch.zeros(2)) is None


@pytest.mark.parametrize("name", ["fedlmd", "fedka", "fedrs"])
def test_per_client_attributes_do_not_rebuild_the_step(tmp_path: Path, name: str) -> None:
    """Client attributes are copied into each stack: three rounds of a method that sets them build one step."""
    fed, _ = run(
        tmp_path,
        "batched",
        METHODS[name],
        rounds=3,
        data_kwargs=DATA_KWARGS.get(name),
        fed_kwargs={"step_capture": "static"},
    )
    assert _captured(fed).builds == 1


def _clients(data: list[list[tuple[Tensor, Tensor]]]) -> list[StackedClient]:
    return [StackedClient(batches=iter(batches), steps=len(batches)) for batches in data]


@pytest.mark.parametrize(
    ("sgd", "clip"),
    [
        (SGDSettings(lr=0.1, momentum=0.9, weight_decay=1e-3), None),
        (SGDSettings(lr=0.1, momentum=0.9, nesterov=True), 0.3),
        (SGDSettings(lr=0.1, momentum=0.5, dampening=0.5, maximize=True), None),
        (SGDSettings(lr=0.1), None),
    ],
    ids=["momentum-wd", "nesterov-clipped", "dampened-maximize", "plain"],
)
def test_static_step_with_batchnorm_short_and_finished_clients(sgd: SGDSettings, clip: float | None) -> None:
    """Short batches (per-step path) between static steps, a client done early, BatchNorm: the per-step numbers."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))
    module = FedNTD(net=net, num_classes=3)
    module.refresh_teacher()
    sizes = [[4, 4, 2, 4], [4], [4, 4, 4, 4]]
    data = [[(torch.randn(n, 1, 4, 4), torch.randint(0, 3, (n,))) for n in client] for client in sizes]
    expected = train_stacked(module, _clients(data), sgd, clip)
    cache = StepCache("static")
    for _ in range(2):  # the second call reuses the built step, reloaded
        taken: list[int] = []
        got = train_stacked(module, _clients(data), sgd, clip, on_step=taken.append, capture=cache)
        assert taken == [3, 2, 2, 2]
        for name, value in {**expected.params, **expected.buffers}.items():
            torch.testing.assert_close({**got.params, **got.buffers}[name], value, atol=0, rtol=0, msg=name)
        assert got.losses == expected.losses
    assert cache.builds == 1 and cache.notes == []
    step = next(iter(cache))
    # the result is a copy: the next group's stack overwrites the static tensors
    assert all(got.params[n].data_ptr() != step.state.params[n].data_ptr() for n in got.params)


#: Methods whose step Dynamo traces in the everyday set: FedNTD and FedLMD, whose rounds the GPU benches time. Tracing
#: takes 3-12 s a method on 2 cores, so the other methods' traces are ``slow`` (CI runs them); every method's built
#: step, untraced, is compared with the sequential engine in the everyday set (test_batched.py's
#: test_every_method_matches_sequential).
TRACED_EVERY_DAY = {"fedntd", "fedlmd"}


@pytest.mark.parametrize(
    "name", [n if n in TRACED_EVERY_DAY else pytest.param(n, marks=pytest.mark.slow) for n in [*METHODS, "fedavgm"]]
)
def test_every_methods_step_is_one_graph_and_matches_sequential(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each method's step traces whole (``torch.compile(fullgraph=True)``: a graph break would fail) and its federation
    equals the sequential engine's (weights, losses, client and server state within 1e-5).

    The backend is Dynamo's ``eager``: it runs the traced graph op by op, the arithmetic of mode ``static`` (no code
    generation: seconds per method on 2 cores); a graph break or host synchronisation is found while tracing. Digits'
    clients take short last batches too: those steps run on the per-step path, on the same static tensors.
    """
    torch._dynamo.reset()
    monkeypatch.setattr(engines, "StepCache", functools.partial(StepCache, compile_backend="eager"))
    rounds = 2 if name in STATEFUL else 1
    results = {}
    for engine in ("batched", "sequential"):
        method, fed_kwargs = _case(name)
        fed_kwargs = {**fed_kwargs, "step_capture": "compile"} if engine == "batched" else fed_kwargs
        results[engine] = run(
            tmp_path, engine, method, rounds=rounds, data_kwargs=DATA_KWARGS.get(name), fed_kwargs=fed_kwargs
        )
    cache = _captured(results["batched"][0])
    assert cache.notes == [], cache.notes
    assert cache.builds >= 1 and all(step.mode == "compile" for step in cache)
    assert_same_federation(results["batched"], results["sequential"])


class _BreaksTheGraph(FedAvg):
    """A loss with a Python-side effect that Dynamo cannot trace (fine in eager PyTorch)."""

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        torch._dynamo.graph_break()
        return F.cross_entropy(self(x), y)


def test_a_step_that_cannot_be_traced_says_why_and_runs_per_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch._dynamo.reset()
    monkeypatch.setattr(engines, "StepCache", functools.partial(StepCache, compile_backend="eager"))
    with pytest.warns(UserWarning, match="the stacked step runs uncaptured: it cannot run as one function"):
        captured, _ = run(tmp_path / "compile", "batched", _BreaksTheGraph, fed_kwargs={"step_capture": "compile"})
    off, _ = run(tmp_path / "off", "batched", _BreaksTheGraph, fed_kwargs={"step_capture": "off"})
    assert len(_captured(captured).notes) == 1 and captured.engine_used == "batched"
    assert captured.history[-1]["global_acc"] == off.history[-1]["global_acc"]


# ---- the cache -----------------------------------------------------------------------------------------------------


def test_a_changed_setting_or_replaced_tensor_rebuilds_the_step() -> None:
    torch.manual_seed(0)
    module = FedNTD(net=nn.Sequential(nn.Flatten(), nn.Linear(4, 3)), num_classes=3)
    module.refresh_teacher()
    data = [[(torch.randn(4, 4), torch.randint(0, 3, (4,)))] * 2 for _ in range(3)]
    cache = StepCache("static")
    sgd = SGDSettings(lr=0.1, momentum=0.9)
    before = module_fingerprint(module)
    train_stacked(module, _clients(data), sgd, capture=cache)
    module.refresh_teacher()  # copies the weights in place: the step still reads them
    train_stacked(module, _clients(data), sgd, capture=cache)
    assert module_fingerprint(module) == before and cache.builds == 1
    module.beta = 0.5  # a constant of the step
    first = train_stacked(module, _clients(data), sgd, capture=cache)
    assert cache.builds == 2
    assert first.losses == train_stacked(module, _clients(data), sgd).losses
    step = next(iter(cache))
    decayed = SGDSettings(lr=0.05, momentum=0.9)  # a new learning rate: the same step, made again on its state
    got = train_stacked(module, _clients(data), decayed, capture=cache)
    assert cache.builds == 2 and next(iter(cache)) is step and step.sgd == decayed
    expected = train_stacked(module, _clients(data), decayed)
    for name, value in expected.params.items():
        torch.testing.assert_close(got.params[name], value, atol=0, rtol=0, msg=name)
    train_stacked(module, _clients(data), SGDSettings(lr=0.2, momentum=0.5), capture=cache)  # another key
    assert cache.builds == 3 and len(list(cache)) == 2


def test_a_decaying_learning_rate_keeps_the_built_step(tmp_path: Path) -> None:
    """``lr_decay``: each round's learning rate retargets the one built step; the rounds are the sequential ones."""
    results = {
        engine: run(tmp_path, engine, rounds=3, fed_kwargs={"lr_decay": 0.5, **extra})
        for engine, extra in (("batched", {"step_capture": "static"}), ("sequential", {}))
    }
    cache = _captured(results["batched"][0])
    assert cache.builds == 1 and next(iter(cache)).sgd.lr == pytest.approx(0.05 * 0.5**2)
    assert_same_federation(results["batched"], results["sequential"])


def test_captured_step_modes() -> None:
    with pytest.raises(ValueError, match="graph, compile or static"):
        StepCache("off")
    with pytest.raises(ValueError, match="graph, compile or static"):
        CapturedStep(lambda *args: None, None, "eager", [])  # type: ignore[arg-type]


# ---- GPU -----------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", [*METHODS, "fedavgm"])
def test_gpu_graph_step_matches_sequential_in_float32(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every method's batched round, each full-batch step a replayed CUDA graph, equals the sequential one (1e-5).

    A stateful method's second round, which reads the state the first left, equals the same step unrecorded
    (``step_capture=static``) within 1e-5 too: recording changes nothing. Against the sequential engine that round is
    held to 1e-3, as the uncaptured engine's GPU test holds a round: a stacked (grouped) convolution rounds
    differently from a client's own on the GPU, and the state carries the difference on (on an H200, 2026-11-28,
    SCAFFOLD's second round ended 1.5e-4 from the sequential one and within 1e-5 of the unrecorded step; its controls
    divide a round's weight change by K·lr).
    """
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    seq = _digits_fit(tmp_path / "seq", "sequential", "32-true", rounds=1, name=name)
    graph = _digits_fit(tmp_path / "graph", "batched", "32-true", rounds=1, name=name)
    cache = _captured(graph[0])
    assert cache.notes == [] and all(step.graph is not None for step in cache)
    assert_same_federation(graph, seq)
    if name not in STATEFUL:
        return
    graph = _digits_fit(tmp_path / "graph2", "batched", "32-true", rounds=2, name=name)
    static = _digits_fit(tmp_path / "static2", "batched", "32-true", rounds=2, name=name, step_capture="static")
    assert_trees_close(weights(graph[1]), weights(static[1]), 1e-5, "weights")
    for part in ("client_states", "server_state"):
        assert_trees_close(dict(getattr(graph[0], part).items()), dict(getattr(static[0], part).items()), 1e-5, part)
    seq = _digits_fit(tmp_path / "seq2", "sequential", "32-true", rounds=2, name=name)
    assert_same_federation(graph, seq, atol=1e-3, metric_atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["fedntd", "fedlmd"])
def test_gpu_graph_step_in_bf16_ends_within_a_point_of_sequential(tmp_path: Path, name: str) -> None:
    seq, _ = _digits_fit(tmp_path / "seq", "sequential", "bf16-mixed", rounds=20, name=name)
    graph, _ = _digits_fit(tmp_path / "graph", "batched", "bf16-mixed", rounds=20, name=name)
    assert _captured(graph).notes == []
    assert all(math.isfinite(row["train_loss"]) for row in graph.history)
    assert abs(graph.history[-1]["global_acc"] - seq.history[-1]["global_acc"]) <= 0.01 + 1e-9


# ---- 5. memory ------------------------------------------------------------------------------------------------------


class _FakePeak:
    """PeakMemory that reports the next of the given peaks (bytes), as a GPU would for stacks of 1 and 2 clients."""

    peaks: list[int] = []

    def __init__(self, device: torch.device) -> None:
        self.bytes = 0

    def __enter__(self) -> _FakePeak:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bytes = _FakePeak.peaks.pop(0)


def test_memory_group_fits_the_budget_from_two_measured_stacks(monkeypatch: pytest.MonkeyPatch) -> None:
    dm = FederatedDataModule("digits", num_clients=5, batch_size=32)
    dm.setup("fit")
    module = FedAvg(net="lenet", num_classes=10, in_channels=1, image_size=8)
    monkeypatch.setattr(engines, "PeakMemory", _FakePeak)
    _FakePeak.peaks = [100 * MIB, 150 * MIB]  # 50 MiB a client over 50 MiB
    group, base, per_client = engines.memory_group(module, dm, budget=500 * MIB, clients=10)
    assert (base, per_client) == (50 * MIB, engines.MEMORY_MARGIN * 50 * MIB)
    assert group == 6  # 50 + 6 · 75 = 500 MiB
    _FakePeak.peaks = [100 * MIB, 150 * MIB]
    assert engines.memory_group(module, dm, budget=10 * 2**30, clients=10)[0] == 10  # at most the round's clients
    _FakePeak.peaks = [100 * MIB, 150 * MIB]
    assert engines.memory_group(module, dm, budget=60 * MIB, clients=10)[0] == 1  # at least one


@pytest.mark.parametrize("name", [*METHODS, "fedavgm"])
def test_memory_group_measures_every_method(name: str) -> None:
    """The measuring step runs for every method's module, its own modules (MOON's head) not in the forward."""
    dm = FederatedDataModule("digits", num_clients=5, batch_size=32)
    dm.setup("fit")
    method, _ = _case(name)
    module = method(net="lenet", num_classes=10, in_channels=1, image_size=8)
    group, base, per_client = engines.memory_group(module, dm, budget=500 * MIB, clients=10)
    assert group >= 1 and base >= 0 and per_client > 0  # nothing is measured off CUDA: the fit is the bounds'


def test_measured_peak_is_reported_and_refits_a_chosen_group(tmp_path: Path) -> None:
    said: list[str] = []
    fed = Federation(rounds=2, sample_ratio=1.0, plots=False)
    fed.dm = FederatedDataModule("digits", num_clients=8)
    fed.dm.setup("fit")
    fed.recorder = SimpleNamespace(info={}, say=lambda trainer, line: said.append(line))  # type: ignore[assignment]
    memory = StackedMemory()
    memory.record(4, 400 * MIB)
    fed.executor = SimpleNamespace(memory=memory)  # type: ignore[assignment]
    fed.client_group, fed._budget = 4, 250 * MIB
    fed._fit_group_to_memory(None)  # type: ignore[arg-type]
    assert fed.recorder.info["gpu_memory_per_client_mib"] == 100.0
    assert said[0] == "peak GPU memory 100.0 MiB per stacked client (400 MiB for a stack of 4)"
    assert fed.client_group == 2 and "up to 2 clients trained together from the next round" in said[1]
    fed._budget = None  # a group size the user set is kept
    fed.client_group = 4
    fed._fit_group_to_memory(None)  # type: ignore[arg-type]
    assert fed.client_group == 4 and len(said) == 2


@pytest.mark.gpu
def test_gpu_group_size_is_chosen_to_fit_a_budget(tmp_path: Path) -> None:
    """A budget too small for all 10 clients: the group is smaller, the peak per client is measured and recorded."""
    dm = FederatedDataModule("digits", num_clients=10, partition="dirichlet", alpha=1.0, batch_size=32)
    model = FedNTD(net="lenet", num_classes=10, in_channels=1, image_size=8, lr=0.05)
    fed = Federation(rounds=2, engine="batched", memory_budget_gb=0.002, plots=False)
    bare_trainer(tmp_path, fed, accelerator="gpu", devices=1, max_epochs=2).fit(model, datamodule=dm)
    assert fed.client_group is not None and 1 <= fed.client_group < 10
    assert fed.recorder is not None and fed.recorder.info["gpu_memory_per_client_mib"] > 0
    assert _captured(fed).notes == []


class _Replayed:
    """A stand-in for a recorded CUDA graph on the CPU: replaying runs the step on the static tensors."""

    def __init__(self, step: CapturedStep) -> None:
        self.step = step
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        self.step.run(*self.step.state.tensors())


def test_graph_mode_warms_up_records_once_and_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph runner's states on the CPU (the CUDA calls stood in for): two warm-up steps, one recording, replays.

    Replays read only the static tensors, refilled each step: the result is the uncaptured one.
    """
    recorded: list[_Replayed] = []
    monkeypatch.setattr(CapturedStep, "_warm_up", lambda self: self.run(*self.state.tensors()))
    monkeypatch.setattr(CapturedStep, "_record", lambda self: recorded.append(_Replayed(self)) or recorded[-1])
    torch.manual_seed(0)
    module = FedNTD(net=nn.Sequential(nn.Flatten(), nn.Linear(4, 3)), num_classes=3)
    module.refresh_teacher()
    data = [[(torch.randn(4, 4), torch.randint(0, 3, (4,))) for _ in range(n)] for n in (6, 4, 5)]
    sgd = SGDSettings(lr=0.1, momentum=0.9, weight_decay=1e-3)
    expected = train_stacked(module, _clients(data), sgd)
    cache = StepCache("graph")
    for _ in range(2):  # two rounds
        got = train_stacked(module, _clients(data), sgd, capture=cache)
        for name, value in expected.params.items():
            torch.testing.assert_close(got.params[name], value, atol=1e-6, rtol=0)
        assert got.losses == pytest.approx(expected.losses, abs=1e-6)
    assert len(recorded) == 1 and recorded[0].replays == 6 - 2 + 6  # round 1: after 2 warm-up steps; round 2: all
    decayed = SGDSettings(lr=0.05, momentum=0.9, weight_decay=1e-3)  # a decayed learning rate: recorded again
    expected = train_stacked(module, _clients(data), decayed)
    got = train_stacked(module, _clients(data), decayed, capture=cache)
    for name, value in expected.params.items():
        torch.testing.assert_close(got.params[name], value, atol=1e-6, rtol=0)
    assert len(recorded) == 2 and recorded[1].replays == 6 and recorded[0].replays == 10  # no warm-up steps
    assert cache.notes == [] and cache.builds == 1


def test_a_sibling_records_after_its_warm_up_and_a_new_learning_rate_records_both_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CUDA calls stood in for: a sibling (every client's short last batch) warms up and records on its own; a
    decayed learning rate records the step and its sibling again at their next calls, without warm-up steps."""
    recorded: list[_Replayed] = []
    warmed: list[CapturedStep] = []

    def warm_up(self: CapturedStep) -> None:
        warmed.append(self)
        self.run(*self.state.tensors())

    monkeypatch.setattr(CapturedStep, "_warm_up", warm_up)
    monkeypatch.setattr(CapturedStep, "_record", lambda self: recorded.append(_Replayed(self)) or recorded[-1])
    torch.manual_seed(0)
    module = FedNTD(net=nn.Sequential(nn.Flatten(), nn.Linear(4, 3)), num_classes=3)
    module.refresh_teacher()
    data = [[(torch.randn(n, 4), torch.randint(0, 3, (n,))) for n in (4, 4, 4, 2)] for _ in range(3)]
    cache = StepCache("graph")
    sgd = SGDSettings(lr=0.1, momentum=0.9)
    for _ in range(3):  # the sibling takes each round's last step: warm-ups in rounds 1 and 2, recorded in round 3
        train_stacked(module, _clients(data), sgd, capture=cache)
    step = next(iter(cache))
    sibling = step.siblings[((2, 4), (2,))]
    assert [r.step for r in recorded] == [step, sibling] and warmed.count(sibling) == 2
    decayed = SGDSettings(lr=0.05, momentum=0.9)
    expected = train_stacked(module, _clients(data), decayed)
    warmed.clear()
    got = train_stacked(module, _clients(data), decayed, capture=cache)
    for name, value in expected.params.items():
        torch.testing.assert_close(got.params[name], value, atol=1e-6, rtol=0, msg=name)
    assert cache.builds == 1 and step.sgd == sibling.sgd == decayed
    assert warmed == [] and [r.step for r in recorded[2:]] == [step, sibling]


def test_a_compiled_step_retargeted_warms_up_before_it_records_again() -> None:
    """A new learning rate compiles a new function: it runs (compiles) outside a recording first."""
    state = allocate_state({}, {}, [], [], torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long))
    step = CapturedStep(lambda *tensors: None, state, "compile", [], compile_backend="eager")
    step.records, step.graph, step.calls = True, object(), 2  # as on a GPU, once recorded
    step.retarget(lambda *tensors: None, SGDSettings(lr=0.05))
    assert step.graph is None and step.calls == 0 and step.sgd == SGDSettings(lr=0.05)
    graph = CapturedStep(lambda *tensors: None, state, "graph", [])
    graph.graph, graph.calls = object(), 2
    graph.retarget(lambda *tensors: None, SGDSettings(lr=0.05))
    assert graph.graph is None and graph.calls == graph.warmup  # recorded at the next call: its kernels have run


def test_graph_runner_warms_up_on_a_side_stream_and_restricts_only_its_own_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CUDA calls stood in for: warm-up steps run on a side stream of the state's device, and the capture uses
    ``thread_local`` (a DataLoader's pin-memory thread allocating pinned memory meanwhile must not break it)."""
    calls: list[Any] = []

    class Stream:
        def wait_stream(self, other: Any) -> None:
            calls.append("wait")

    class Graph:
        def replay(self) -> None:
            calls.append("replay")

    @contextlib.contextmanager
    def entered(*what: Any) -> Iterator[None]:
        calls.append(what)
        yield

    monkeypatch.setattr(torch.cuda, "device", lambda device: entered("device", str(device)))
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: entered("stream"))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, **kw: entered("capture", *sorted(kw.items())))
    state = allocate_state({}, {}, [], [], torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long))
    step = CapturedStep(lambda *tensors: tensors[5].add_(1), state, "graph", [])  # tensors[5]: the step counter
    for _ in range(4):
        step()
    warm_up = [("device", "cpu"), "wait", ("stream",), "wait"]
    assert calls == [
        *warm_up,
        *warm_up,
        ("device", "cpu"),
        ("capture", ("capture_error_mode", "thread_local")),
        "replay",
        "replay",
    ]
    assert int(state.counter) == 3 and step.note is None  # two warm-up steps and the (stood-in) capture ran the step


def test_a_step_that_cannot_be_recorded_says_why_and_runs_unrecorded(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: CapturedStep) -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(CapturedStep, "_warm_up", lambda self: self.run(*self.state.tensors()))
    monkeypatch.setattr(CapturedStep, "_record", refuse)
    torch.manual_seed(0)
    module = FedAvg(net=nn.Sequential(nn.Flatten(), nn.Linear(4, 3)), num_classes=3)
    data = [[(torch.randn(4, 4), torch.randint(0, 3, (4,))) for _ in range(5)] for _ in range(2)]
    sgd = SGDSettings(lr=0.1, momentum=0.9)
    said: list[str] = []
    got = train_stacked(module, _clients(data), sgd, capture=StepCache("graph", on_note=said.append))
    assert said == [
        "the stacked step could not be captured as a CUDA graph "
        "(RuntimeError: operation not permitted when stream is capturing)"
    ]
    expected = train_stacked(module, _clients(data), sgd)
    for name, value in expected.params.items():
        torch.testing.assert_close(got.params[name], value, atol=1e-6, rtol=0)


def _gathered(ahead: int) -> tuple[list[tuple[Tensor, Tensor, list[int]]], Tensor]:
    """Every step's joined batches of three clients (unequal step counts, short last batches, augmented) read with
    the given read-ahead, and the global random state after the last step."""
    from fl_lightning.core.augment import BatchTransform
    from fl_lightning.core.stacking import ClientRNG
    from fl_lightning.data import ClientBatches
    from fl_lightning.stacked import _Gather

    gen = torch.Generator().manual_seed(0)
    sources, rngs = [], []
    for j, n in enumerate((23, 16, 9)):
        x = torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8, generator=gen)
        order = torch.randperm(n, generator=gen)
        sources.append(ClientBatches(x, torch.arange(n) % 10, list(order.split(5))))
        torch.manual_seed(100 + j)
        rngs.append(ClientRNG(torch.device("cpu")))
    torch.manual_seed(7)
    augment = BatchTransform(mean=[0.5], std=[0.25], crop_padding=1, hflip=True, cutout_size=2)
    gather = _Gather(sources, augment, rngs, ahead=ahead)
    out = []
    for i in range(max(len(s.batches) for s in sources)):
        active = [j for j, s in enumerate(sources) if len(s.batches) > i]
        (x, y), sizes = gather.joined(i, active)
        out.append((x.clone(), y.clone(), sizes))
    return out, torch.get_rng_state()


# A step of the three clients is at most 15 images of 256 bytes: steps (0-1, 2-4) and (0-3, 4) are read together.
@pytest.mark.parametrize("ahead", [1, 256 * 30, 256 * 45, 10**9], ids=["a-step-a-time", "two-steps", "four", "all"])
def test_reading_ahead_gives_each_steps_batches_and_random_choices(ahead: int) -> None:
    """Steps read (and augmented) ahead in chunks equal those read one by one, and leave the same global stream."""
    expected, expected_state = _gathered(0)
    got, state = _gathered(ahead)
    assert len(got) == len(expected) == 5
    for (x, y, sizes), (ex, ey, esizes) in zip(got, expected, strict=True):
        assert sizes == esizes
        torch.testing.assert_close(x, ex, atol=0, rtol=0)
        torch.testing.assert_close(y, ey, atol=0, rtol=0)
    assert torch.equal(state, expected_state)


def test_augmented_static_steps_read_ahead_and_match_sequential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A captured stack reads its steps ahead (here a few at a time); augmentation keeps each client's stream."""
    import fl_lightning.stacked as stacked

    monkeypatch.setattr(stacked, "GATHER_AHEAD_BYTES", 3 * 5 * 32 * 64 * 4)  # three steps of 5 clients' 32 images
    augment = {"crop_padding": 1, "hflip": True, "cutout": 2}
    results = {
        engine: run(tmp_path, engine, rounds=2, data_kwargs=augment, fed_kwargs=fed_kwargs)
        for engine, fed_kwargs in (("batched", {"step_capture": "static"}), ("sequential", {}))
    }
    cache = _captured(results["batched"][0])
    assert cache.notes == [] and cache.builds >= 1
    assert_same_federation(results["batched"], results["sequential"])

"""Seconds per round and PyTorch operator calls per round of the sequential and batched engines.

Workloads (FedAvg or ``--method``, SGD momentum 0.9, weight decay 1e-5, every sampled client trains E local
epochs):

- ``quickstart``: ``configs/quickstart.yaml``: digits, ``lenet``, 10 clients Dirichlet(0.5), all sampled, E=5,
  batch 32, lr 0.05.
- ``tabular``: ``examples/tabular_mlp.py``: breast-cancer features, MLP 30-64-2, 5 clients Dirichlet(0.5), all
  sampled, E=2, batch 16, lr 0.05.
- ``fmnist_ntd``: ``configs/fedavg_fmnist_shard2.yaml``: Fashion-MNIST, ``lenet``, 100 clients shard(2), ratio 0.1,
  E=5, batch 50, lr 0.01, decay 0.99, 64 per class held out.
- ``cifar10_ntd_shapes``: the shapes of ``configs/fedavg_cifar10_shard2.yaml`` (CIFAR-10 is not needed): 50000
  random uint8 images [3, 32, 32] with random labels 0..9, 2000 random test images, ``cnn``, 100 clients shard(2),
  ratio 0.1, E=5, batch 50, lr 0.01, decay 0.99, crop (padding 4) + flip augmentation.

What is measured, per workload:

- s/round: the Federation's ``round_seconds`` (the round's plan, local training, aggregation and the global model's
  test evaluation, which runs every round), median over ``--rounds`` measured rounds of a fit of ``--rounds + 1``
  rounds; the first round is warm-up and dropped. Engines: ``sequential``, ``batched`` (all of a round's clients
  stacked at once) and ``batched`` with each ``--groups`` size (group sizes not below the clients per round are
  skipped: they are ``batched``). ``auto``: the engine it picks (its fit stops as soon as the engine is chosen).
- ops/round: ATen operator calls dispatched (forward, backward, optimizer, aggregation; everything that reaches
  ``__torch_dispatch__``, with ``vmap`` counted after batching) for ``sequential`` and ``batched`` in the second
  round of a separate 2-round fit: counting starts in ``on_train_epoch_start`` just after the Federation's (Lightning
  has set up the round's data loader, the Federation has planned the round and snapshot the global weights; the
  clients' batches are gathered and transformed lazily, inside the window) and ends in
  ``on_train_epoch_end`` just after the Federation's (the round was aggregated, evaluated and recorded); the ops of
  one global test evaluation (``Federation.evaluate``, counted on its own right after, on the same model) are
  subtracted. So ops/round counts local training, aggregation, the server step and the round's bookkeeping, not
  the evaluation (shown apart as eval ops).
- kernels/round: the same count without the operators that only make views or aliases (``view``, ``transpose``,
  ``expand``, ``detach``, ...: no kernel runs for them on a GPU), the closer proxy for GPU kernel launches.
- With ``--gpu`` the batched engine runs twice: as ``auto`` runs it on a GPU (each full-batch step replayed as one
  CUDA graph, ``Federation(step_capture="auto")``) and uncaptured (``batched off``); ``--captures off,compile``
  adds other modes. ``ran`` says which steps were ``graph``, ``compile``, ``static`` or ``uncaptured`` after all.
  ``--stacked-convs matmul,loop`` adds the batched engine (capture ``auto``) with each other way of computing its
  stacked convolutions (``Federation(stacked_conv=...)``; the default runs are ``grouped``).
- ``--profile``: where a batched round's device time goes, per way of computing the convolutions: a 2-round fit with
  ``step_capture="static"`` (the recorded step's function, run as it is: the same kernels, each visible to the
  profiler) whose second round's stacked training runs under ``torch.profiler``; the top kernels by device time (on
  a CPU: operators by CPU time), with their share and time per stacked step. ``--no-ops`` skips the operator counts
  (two more fits per workload).
  For each batched fit: the step time (the median round's seconds minus one global evaluation, timed apart after
  the last round, over the round's stacked steps), beside the arithmetic floor (the method's loss forward and
  backward on one full batch, counted by ``torch.utils.flop_counter`` on the CPU, times the clients of a round, over
  ``--peak-tflops``: 989 dense bf16 TFLOP/s on an H100 or H200 by default), the peak GPU memory per stacked client
  and 200 rounds at the median.

Usage: ``python bench/bench_engines.py [--workloads quickstart,tabular,fmnist_ntd,cifar10_ntd_shapes] [--rounds 3]
[--groups 2,5] [--method fedntd] [--gpu] [--captures off,compile] [--stacked-convs matmul,loop] [--profile] [--no-ops]
[--cudnn-benchmark] [--peak-tflops 989] [--threads N] [--verbose]`` (``--gpu``: ``accelerator="gpu"``,
``precision="bf16-mixed"``; ``--method``: the workloads' method, FedAvg by default, with its defaults on the same
setting)
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import numpy as np
import torch
from _setting import bare_trainer, fmnist_ntd_datamodule  # bench/ is on sys.path when run as a script
from lightning_utilities.core import rank_zero
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import fl_lightning.batched as batched_engine
from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.core.models import build_model
from fl_lightning.core.stacked_conv import STACKED_CONVS
from fl_lightning.core.step_capture import CAPTURE_MODES
from fl_lightning.methods import METHODS

WORKLOADS = ("quickstart", "tabular", "fmnist_ntd", "cifar10_ntd_shapes")
VERBOSE = False  # --verbose: show each fit's own output


@dataclass
class Workload:
    """How to build one workload's pieces afresh for each fit."""

    name: str
    describe: str
    datamodule: Callable[[], FederatedDataModule]
    model: Callable[[type[FedAvg]], FedAvg]
    federation: dict[str, Any] = field(default_factory=dict)
    clients_per_round: int = 1
    #: The method (``--method``): FedAvg, or a distillation method on the same setting.
    method: type[FedAvg] = FedAvg


# ---- workloads ---------------------------------------------------------------------------------------------------


def quickstart() -> Workload:
    """``configs/quickstart.yaml``."""
    return Workload(
        "quickstart",
        "digits, lenet, 10 clients Dir(0.5), all sampled, E=5, batch 32",
        lambda: FederatedDataModule("digits", partition="dirichlet", alpha=0.5, num_clients=10, batch_size=32),
        lambda method: method(net="lenet", lr=0.05, momentum=0.9, weight_decay=1e-5),
        dict(sample_ratio=1.0, local_epochs=5),
        clients_per_round=10,
    )


def mlp(features: int, classes: int, hidden: int = 64) -> nn.Module:
    """``examples/tabular_mlp.py``'s network."""
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def tabular() -> Workload:
    """``examples/tabular_mlp.py``."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    x, y = load_breast_cancer(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype(np.float32), y, test_size=0.25, random_state=0, stratify=y
    )
    return Workload(
        "tabular",
        "breast cancer, MLP 30-64-2, 5 clients Dir(0.5), all sampled, E=2, batch 16",
        lambda: FederatedDataModule.from_tensors(
            x_train,
            y_train,
            x_test,
            y_test,
            name="breast_cancer",
            partition="dirichlet",
            alpha=0.5,
            num_clients=5,
            batch_size=16,
        ),
        lambda method: method(net=mlp(x.shape[1], 2), lr=0.05),
        dict(sample_ratio=1.0, local_epochs=2),
        clients_per_round=5,
    )


def fmnist_ntd() -> Workload:
    """``configs/fedavg_fmnist_shard2.yaml`` (the FedNTD-paper setting)."""
    return Workload(
        "fmnist_ntd",
        "fashion_mnist, lenet, 100 clients shard(2), ratio 0.1, E=5, batch 50",
        fmnist_ntd_datamodule,
        lambda method: method(net="lenet", lr=0.01, momentum=0.9, weight_decay=1e-5),
        dict(sample_ratio=0.1, local_epochs=5, lr_decay=0.99),
        clients_per_round=10,
    )


def cifar10_ntd_shapes(train: int = 50000, test: int = 2000) -> Workload:
    """``configs/fedavg_cifar10_shard2.yaml``'s shapes on random images and labels."""
    gen = torch.Generator().manual_seed(0)
    train_x = torch.randint(0, 256, (train, 3, 32, 32), dtype=torch.uint8, generator=gen)
    train_y = torch.randint(0, 10, (train,), generator=gen)
    test_x = torch.randint(0, 256, (test, 3, 32, 32), dtype=torch.uint8, generator=gen)
    test_y = torch.randint(0, 10, (test,), generator=gen)
    return Workload(
        "cifar10_ntd_shapes",
        f"random [3,32,32] x {train} (test {test}), cnn, 100 clients shard(2), ratio 0.1, E=5, batch 50, crop+flip",
        lambda: FederatedDataModule.from_tensors(
            train_x,
            train_y,
            test_x,
            test_y,
            name="cifar10_shapes",
            partition="shard",
            shards_per_client=2,
            num_clients=100,
            batch_size=50,
            crop_padding=4,
            hflip=True,
        ),
        lambda method: method(net="cnn", lr=0.01, momentum=0.9, weight_decay=1e-5),
        dict(sample_ratio=0.1, local_epochs=5, lr_decay=0.99),
        clients_per_round=10,
    )


BUILDERS: dict[str, Callable[[], Workload]] = {
    "quickstart": quickstart,
    "tabular": tabular,
    "fmnist_ntd": fmnist_ntd,
    "cifar10_ntd_shapes": cifar10_ntd_shapes,
}


# ---- counting operators ------------------------------------------------------------------------------------------


_NO_KERNEL = {torch.ops.aten.lift_fresh, torch.ops.aten._unsafe_view, torch.ops.aten.alias}


class OpCounter(TorchDispatchMode):
    """Counts the operator calls that reach ``__torch_dispatch__`` while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.kernels = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls += 1
        if not (func.is_view or func.overloadpacket in _NO_KERNEL):
            self.kernels += 1
        return func(*args, **(kwargs or {}))


class RoundOps(L.Callback):
    """Per round: the ops from just after the Federation's epoch start to just after its epoch end, minus one eval.

    Put it after the Federation in the Trainer's callbacks (Lightning calls callbacks in list order).
    """

    def __init__(self, federation: Federation) -> None:
        self.federation = federation
        self.counter: OpCounter | None = None
        self.rounds: list[tuple[int, int, int, int]] = []  # ops and kernels in the window, of one evaluation

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.counter = OpCounter()
        self.counter.__enter__()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        assert self.counter is not None
        self.counter.__exit__(None, None, None)
        window, self.counter = self.counter, None
        with OpCounter() as evaluation:
            self.federation.evaluate(pl_module, trainer)
        self.rounds.append((window.calls, evaluation.calls, window.kernels, evaluation.kernels))

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self.counter is not None:
            self.counter.__exit__(None, None, None)
            self.counter = None


class EngineChosen(Exception):
    """Raised once ``auto`` has resolved its engine, to end that fit early."""


class StopAfterEngineChoice(L.Callback):
    """Ends the fit in ``on_fit_start``, after the Federation's (which resolves ``engine``)."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        raise EngineChosen


# ---- fits --------------------------------------------------------------------------------------------------------


@dataclass
class Result:
    engine: str  # what was asked for, e.g. "batched g=5"
    used: str
    seconds: float | None = None
    ops: int | None = None
    eval_ops: int | None = None
    kernels: int | None = None
    acc: float | None = None
    eval_seconds: float | None = None  # one global evaluation, timed apart after the last round
    steps: int = 0  # stacked steps a round (the most local steps of any client)
    mib_per_client: float | None = None  # peak GPU memory per stacked client
    replay_ms: float | None = None  # one replay of the recorded step alone


def fit(
    work: Workload,
    engine: str,
    group_size: int | None,
    rounds: int,
    trainer_kw: dict[str, Any],
    extra: Callable[[Federation], list[L.Callback]] | None = None,
    capture: str = "auto",
    conv: str = "grouped",
) -> Federation:
    """One ``Trainer.fit`` of ``rounds`` rounds of ``work`` in a fresh temporary run directory."""
    L.seed_everything(0, verbose=False)
    dm, model = work.datamodule(), work.model(work.method)
    fed = Federation(
        rounds=rounds,
        engine=engine,
        group_size=group_size,
        step_capture=capture,
        stacked_conv=conv,
        plots=False,
        **work.federation,
    )
    callbacks = [fed, *(extra(fed) if extra else [])]
    # The run's own lines (partition, rounds, done) are rank_zero_info records: shown with --verbose only.
    info = rank_zero.log  # the logger rank_zero_info writes to (Lightning points it at its own)
    level = info.level
    info.setLevel(logging.INFO if VERBOSE else logging.WARNING)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            bare_trainer(tmp, *callbacks, max_epochs=rounds, **trainer_kw).fit(model, datamodule=dm)
    finally:
        info.setLevel(level)
    return fed


def time_engine(
    work: Workload,
    engine: str,
    group: int | None,
    rounds: int,
    trainer_kw: dict[str, Any],
    capture: str = "auto",
    conv: str = "grouped",
) -> Result:
    """Median round seconds over ``rounds`` rounds after one warm-up round."""
    timer: list[StepTimer] = []

    def extra(fed: Federation) -> list[L.Callback]:
        timer.append(StepTimer(fed))
        return timer

    fed = fit(work, engine, group, rounds + 1, trainer_kw, extra, capture, conv)
    label = engine if group is None else f"{engine} g={group}"
    if engine == "batched" and capture != "auto":
        label += f" {capture}"
    if conv != "grouped":
        label += f" {conv}"
    seconds = statistics.median(row["round_seconds"] for row in fed.history[1:])
    used = fed.engine_used
    cache = getattr(fed.executor, "capture", None)
    if used == "batched" and cache is not None:
        modes = {step.mode if step.note is None else "uncaptured" for step in cache}
        used += f"/{'+'.join(sorted(modes)) or 'none'}"
    res = Result(label, used, seconds=seconds, acc=fed.history[-1]["global_acc"])
    res.eval_seconds = timer[0].eval_seconds
    res.steps = timer[0].steps
    memory = getattr(fed.executor, "memory", None)
    res.mib_per_client = memory.per_client / 2**20 if memory is not None and memory.per_client else None
    res.replay_ms = replay_ms(cache)
    return res


def replay_ms(cache: Any, times: int = 20) -> float | None:
    """Milliseconds of one replay of the fit's recorded step alone (no batch copied in): the step's device time.

    Replaying after the fit changes only the step's static tensors, which the next round would load afresh.
    """
    graphs = [step.graph for step in cache or () if step.graph is not None]
    if not graphs:
        return None
    graph = graphs[0]
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(times):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / times * 1e3


class StepTimer(L.Callback):
    """The stacked steps of a round (the most local steps of any client) and one evaluation's seconds, timed apart."""

    def __init__(self, federation: Federation) -> None:
        self.federation = federation
        self.steps = 0
        self.eval_seconds: float | None = None

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        plan = self.federation.plan(trainer.current_epoch)
        self.steps = max(plan.steps)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        self.federation.evaluate(pl_module, trainer)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.eval_seconds = time.perf_counter() - start


def step_flops(work: Workload) -> int:
    """FLOPs of one client's local step (the method's loss forward and backward on one full batch), on the CPU."""
    dm, model = work.datamodule(), work.model(work.method)
    dm.setup("fit")
    x = torch.zeros(dm.batch_size, *dm.input_sample("cpu").shape)
    y = torch.zeros(dm.batch_size, dtype=torch.long)
    if model.net is None:  # a built-in network by name: built for the data, as configure_model does in a fit
        model.num_classes = dm.num_classes
        model.net = build_model(model.hparams["net"], dm.in_channels, dm.image_size, dm.num_classes)
    if model.uses_teacher:
        model.refresh_teacher()
    if hasattr(model, "majority"):
        model.majority = torch.zeros(dm.num_classes, dtype=torch.bool)
    with FlopCounterMode(display=False) as counter:
        model.client_loss(x, y).backward()
    return int(counter.get_total_flops())


def count_ops(work: Workload, engine: str, trainer_kw: dict[str, Any]) -> tuple[int, int, int, str]:
    """(training ops and kernels of the second round of a 2-round fit, ops of one evaluation, the engine used)."""
    counters: list[RoundOps] = []

    def extra(fed: Federation) -> list[L.Callback]:
        counters.append(RoundOps(fed))
        return counters

    fed = fit(work, engine, None, 2, trainer_kw, extra)
    window, evaluation, window_kernels, evaluation_kernels = counters[0].rounds[-1]
    return window - evaluation, evaluation, window_kernels - evaluation_kernels, fed.engine_used


def auto_choice(work: Workload, trainer_kw: dict[str, Any]) -> str:
    """The engine ``auto`` resolves to for ``work`` (the fit stops right after the choice)."""
    fed: list[Federation] = []

    def extra(f: Federation) -> list[L.Callback]:
        fed.append(f)
        return [StopAfterEngineChoice()]

    try:
        fit(work, "auto", None, 1, trainer_kw, extra)
    except EngineChosen:
        pass
    return fed[0].engine_used


def run_workload(
    name: str,
    rounds: int,
    groups: list[int],
    trainer_kw: dict[str, Any],
    method: type[FedAvg],
    peak: float | None,
    captures: list[str],
    convs: Sequence[str] = (),
    ops: bool = True,
    profile: bool = False,
) -> list[Result]:
    work = BUILDERS[name]()
    work.method = method
    print(f"\n== {name} ({method.__name__}): {work.describe}", flush=True)
    results = []
    configs: list[tuple[str, int | None, str, str]] = [
        ("sequential", None, "auto", "grouped"),
        ("batched", None, "auto", "grouped"),
    ]
    configs += [("batched", None, capture, "grouped") for capture in captures if capture != "auto"]
    configs += [("batched", None, "auto", conv) for conv in convs if conv != "grouped"]
    configs += [("batched", g, "auto", "grouped") for g in groups if g < work.clients_per_round]
    for engine, group, capture, conv in configs:
        res = time_engine(work, engine, group, rounds, trainer_kw, capture, conv)
        if ops and group is None and capture == "auto" and conv == "grouped":
            res.ops, res.eval_ops, res.kernels, _ = count_ops(work, engine, trainer_kw)
        results.append(res)
        ops = f"{res.ops:>9,d} ops/round (eval {res.eval_ops:,d}), {res.kernels:,d} kernels" if res.ops else ""
        used = "" if res.used == engine else f" [ran {res.used}]"
        print(f"  {res.engine:<18}{used} {res.seconds:8.3f} s/round  acc {res.acc:.4f}  {ops}", flush=True)
    results.append(Result("auto", auto_choice(work, trainer_kw)))
    print(f"  auto           -> {results[-1].used}", flush=True)
    flops = step_flops(work) * work.clients_per_round
    for res in results[1:]:
        if res.engine.startswith("batched") and res.seconds and res.eval_seconds is not None and res.steps:
            step = (res.seconds - res.eval_seconds) / res.steps
            floor = (
                f", floor {flops / peak * 1e3:.3f} ms ({flops / 1e9:.2f} GFLOP at {peak / 1e12:.0f} TFLOP/s)"
                if peak
                else f" ({flops / 1e9:.2f} GFLOP)"
            )
            memory = f", {res.mib_per_client:.1f} MiB/client" if res.mib_per_client else ""
            replay = f", its graph's replay alone {res.replay_ms:.3f} ms" if res.replay_ms else ""
            print(
                f"  {res.engine:<18} step {step * 1e3:.3f} ms (round {res.seconds:.3f} s - eval "
                f"{res.eval_seconds:.3f} s over {res.steps} steps){replay}{floor}{memory}; "
                f"200 rounds {200 * res.seconds:.1f} s",
                flush=True,
            )
    if profile:
        for conv in ("grouped", *(c for c in convs if c != "grouped")):
            print_kernel_profile(work, trainer_kw, conv)
    return results


def print_kernel_profile(work: Workload, trainer_kw: dict[str, Any], conv: str, top: int = 12) -> None:
    """The top kernels of the second round's stacked training, its step run as it is (``step_capture="static"``)."""
    on_gpu = trainer_kw.get("accelerator") == "gpu"
    activities = [torch.profiler.ProfilerActivity.CUDA if on_gpu else torch.profiler.ProfilerActivity.CPU]
    profiles: list[torch.profiler.profile] = []
    train = batched_engine.train_stacked
    state = {"round": 0}

    def profiled(*args: Any, **kwargs: Any) -> Any:
        if state["round"] < 1:
            return train(*args, **kwargs)
        with torch.profiler.profile(activities=activities) as prof:
            result = train(*args, **kwargs)
            if on_gpu:
                torch.cuda.synchronize()
        profiles.append(prof)
        return result

    class Rounds(L.Callback):
        def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            state["round"] += 1

    timer: list[StepTimer] = []

    def extra(fed: Federation) -> list[L.Callback]:
        timer.append(StepTimer(fed))
        return [Rounds(), *timer]

    batched_engine.train_stacked = profiled  # type: ignore[assignment]
    try:
        fit(work, "batched", None, 2, trainer_kw, extra, "static", conv)
    finally:
        batched_engine.train_stacked = train  # type: ignore[assignment]
    totals: dict[str, list[float]] = {}
    for prof in profiles:
        for event in prof.key_averages():
            spent = float(event.self_device_time_total if on_gpu else event.self_cpu_time_total)
            if spent > 0:
                entry = totals.setdefault(event.key, [0.0, 0.0])
                entry[0] += spent
                entry[1] += event.count
    whole = sum(t for t, _ in totals.values())
    steps = max(timer[0].steps, 1) if timer else 1
    unit = "device" if on_gpu else "CPU"
    print(
        f"  profile, stacked_conv={conv}: {whole / 1e3:.1f} ms of {unit} time in round 2's stacked training over "
        f"{steps} steps ({whole / 1e3 / steps:.3f} ms a step), top {top}:",
        flush=True,
    )
    for key, (spent, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"    {spent / whole:6.1%} {spent / 1e3 / steps:8.3f} ms/step {int(count):>6d}x  {key[:90]}", flush=True)


def host() -> str:
    cpu = f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), {torch.get_num_threads()} threads"
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return f"host: {cpu}{gpu}; torch {torch.__version__}, lightning {L.__version__}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated subset of {WORKLOADS}")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per fit (plus one warm-up)")
    parser.add_argument("--groups", default="2,5", help="comma-separated batched group sizes ('' for none)")
    parser.add_argument("--gpu", action="store_true", help='accelerator="gpu", precision="bf16-mixed"')
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: as is)")
    parser.add_argument("--verbose", action="store_true", help="show each fit's own output")
    parser.add_argument("--method", default="fedavg", help="the method trained (a name in fl_lightning.METHODS)")
    parser.add_argument(
        "--captures",
        default=None,
        help="comma-separated step_capture modes the batched engine runs besides auto (default: off with --gpu)",
    )
    parser.add_argument(
        "--stacked-convs",
        default="",
        help="comma-separated stacked_conv lowerings the batched engine runs besides grouped (matmul, loop)",
    )
    parser.add_argument("--profile", action="store_true", help="the top kernels of a batched round's training")
    parser.add_argument("--no-ops", action="store_true", help="skip the operator counts (two fits per workload)")
    parser.add_argument(
        "--cudnn-benchmark",
        action="store_true",
        help="Trainer(benchmark=True): cuDNN times its convolution algorithms first (the stacked step's grouped ones)",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the GPU's dense bf16 rate for the step's arithmetic floor (default: 989 on an H100 or H200)",
    )
    args = parser.parse_args()
    if args.method not in METHODS:
        parser.error(f"unknown method {args.method!r}; choose from {', '.join(METHODS)}")
    global VERBOSE
    VERBOSE = args.verbose
    names = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in names if w not in BUILDERS]
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
    groups = [int(g) for g in args.groups.split(",") if g]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    trainer_kw: dict[str, Any] = {}
    if args.gpu:
        if not torch.cuda.is_available():
            print("--gpu: torch.cuda.is_available() is False on this machine; nothing measured")
            return
        trainer_kw = {"accelerator": "gpu", "devices": 1, "precision": "bf16-mixed"}
    if args.cudnn_benchmark:
        trainer_kw["benchmark"] = True
    device = ("GPU bf16-mixed" if args.gpu else "CPU fp32") + (", cuDNN benchmark" if args.cudnn_benchmark else "")
    print(host())
    print(f"device: {device}; {args.rounds} measured rounds (+1 warm-up) per fit")
    peak = args.peak_tflops * 1e12 if args.peak_tflops else None
    if peak is None and args.gpu and any(h in torch.cuda.get_device_name(0) for h in ("H100", "H200")):
        peak = 989e12  # dense bf16 tensor-core rate of the SXM H100 and H200
    method = METHODS[args.method]
    captures = [c for c in (args.captures if args.captures is not None else "off" if args.gpu else "").split(",") if c]
    bad = [c for c in captures if c not in CAPTURE_MODES]
    if bad:
        parser.error(f"unknown step_capture modes {bad}; choose from {', '.join(CAPTURE_MODES)}")
    convs = [c for c in args.stacked_convs.split(",") if c]
    if any(c not in STACKED_CONVS for c in convs):
        parser.error(f"unknown stacked_conv lowerings in {convs}; choose from {', '.join(STACKED_CONVS)}")
    table = {
        name: run_workload(
            name, args.rounds, groups, trainer_kw, method, peak, captures, convs, not args.no_ops, args.profile
        )
        for name in names
    }

    print("\n" + "=" * 100)
    print(host() + f"; {device}; median of {args.rounds} rounds after 1 warm-up")
    print(
        f"{'workload':<20}{'engine':<16}{'ran':<12}{'s/round':>10}{'ops/round':>12}{'kernels':>10}{'eval ops':>10}"
        f"{'acc':>8}"
    )
    for name, results in table.items():
        for r in results:
            secs = f"{r.seconds:.3f}" if r.seconds is not None else "-"
            ops = f"{r.ops:,d}" if r.ops is not None else "-"
            ev = f"{r.eval_ops:,d}" if r.eval_ops is not None else "-"
            kernels = f"{r.kernels:,d}" if r.kernels is not None else "-"
            acc = f"{r.acc:.4f}" if r.acc is not None else "-"
            print(f"{name:<20}{r.engine:<16}{r.used:<12}{secs:>10}{ops:>12}{kernels:>10}{ev:>10}{acc:>8}")
        seq, bat = results[0], results[1]
        assert seq.seconds and bat.seconds
        counted = (
            f"{seq.ops / bat.ops:.1f}x ops/round, {seq.kernels / bat.kernels:.1f}x kernels/round; "
            if seq.ops and bat.ops and seq.kernels and bat.kernels
            else ""
        )
        print(
            f"{'':<20}sequential/batched: {seq.seconds / bat.seconds:.2f}x s/round, {counted}"
            f"200 rounds batched {200 * bat.seconds:.1f} s"
        )
        for r in results[2:]:
            if r.engine in (f"batched {c}" for c in convs) and r.seconds:
                ratio = seq.seconds / r.seconds
                print(f"{'':<20}sequential/{r.engine}: {ratio:.2f}x; 200 rounds {200 * r.seconds:.1f} s")
        uncaptured = next((r for r in results if r.engine == "batched off"), None)
        if uncaptured is not None and uncaptured.seconds:
            print(
                f"{'':<20}sequential/uncaptured batched: {seq.seconds / uncaptured.seconds:.2f}x; "
                f"captured/uncaptured: {uncaptured.seconds / bat.seconds:.2f}x"
            )


if __name__ == "__main__":
    main()

"""The Trainer rules of a federated run, in one place: the command line and the Python API both go through them.

One Lightning epoch is one communication round, and a round trains every sampled client for its local epochs. So
the Trainer's ``max_epochs`` is the number of rounds, options that cut an epoch short or change what a batch is are
refused, half precision needs a CUDA GPU, and checkpoints live in ``<default_root_dir>/checkpoints``. Every refusal is
a one-line ``ValueError`` that names the option, as ``trainer option <name>=<value>``, and says what to do instead.

Plain functions of values (for the CLI, before anything is built) or of a built ``L.Trainer`` (for the Federation
callback). Lightning's own features keep working beside the federation or are refused here with one line: an LR
scheduler must step per round (``interval: "epoch"``) and is the round's schedule instead of ``lr_decay``; weight
averaging callbacks are refused (they would average local models across clients, not the global model across rounds).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import (
    Callback,
    EarlyStopping,
    GradientAccumulationScheduler,
    LearningRateMonitor,
    ModelCheckpoint,
    StochasticWeightAveraging,
    WeightAveraging,
)
from lightning.pytorch.trainer.states import TrainerFn

from fl_lightning.checkpoint import AtomicLastCheckpoint
from fl_lightning.core.messages import first_line, option
from fl_lightning.core.models import in_mode
from fl_lightning.data import FederatedDataModule
from fl_lightning.lightning_internals import checkpoints_within_epochs, max_time_seconds
from fl_lightning.module import FedAvg
from fl_lightning.recorder import is_round_metric

#: Precisions that run on the CPU (Lightning would quietly turn 16-mixed into bf16-mixed there).
CPU_PRECISIONS = ("32-true", "32", "bf16-mixed")
#: Precisions that convert the module's weights (Lightning's ``*-true``): the training and test batches, transformed
#: lazily into float32, would meet weights of another dtype ("Input type (float) and bias type ... should be the same").
CONVERTING_PRECISIONS = ("64-true", "64", "bf16-true", "16-true", "transformer-engine", "transformer-engine-float16")
#: The precisions whose gradient scaler can skip an optimizer step.
SCALED_PRECISIONS = ("16-mixed", "16")
#: What Lightning sets ``max_epochs`` to when a fit starts with it unset (and ``max_steps`` unset).
LIGHTNING_DEFAULT_MAX_EPOCHS = 1000

_QUICK_RUN = (
    "for a quick run use --federation.rounds 1 --data.num_clients 2 (in Python Federation(rounds=1) and "
    "FederatedDataModule(..., num_clients=2)), or a smaller sample_ratio to train fewer clients per round"
)
_CUTS_ROUNDS = "a round trains every sampled client for its local epochs, so it would cut rounds short; " + _QUICK_RUN
#: Trainer options that would cut rounds short or change what a batch is: name -> (allowed?, why not).
#: The order is the order of the checks: ``fast_dev_run`` implies the others, ``overfit_batches`` implies
#: ``limit_train_batches``.
_ROUND_OPTIONS: dict[str, tuple[Any, str]] = {
    "fast_dev_run": (lambda v: v is None or v is False or v == 0, _CUTS_ROUNDS),
    "overfit_batches": (lambda v: v is None or v == 0, _CUTS_ROUNDS),
    # An int is a number of batches: limit_train_batches=1 trains one batch (one client), 1.0 trains all of them.
    "limit_train_batches": (lambda v: v is None or (isinstance(v, float) and v == 1.0), _CUTS_ROUNDS),
    "max_steps": (lambda v: v is None or v == -1, _CUTS_ROUNDS),
    "accumulate_grad_batches": (
        lambda v: v is None or v == 1,
        "every local batch is one optimizer step (methods count and scale local steps); leave it at 1",
    ),
    # Below 1.0, or a number of batches, validation runs inside a round, on a client's local model.
    "val_check_interval": (
        lambda v: v is None or (isinstance(v, float) and v == 1.0),
        "validation would run in the middle of a round, on a client's local model, not the global one; leave it "
        "at 1.0 and validate every N rounds with check_val_every_n_epoch=N",
    ),
}
ROUND_OPTIONS: tuple[str, ...] = tuple(_ROUND_OPTIONS)
#: Why each of :data:`ROUND_OPTIONS` is refused, and what to give instead (the refusal's text; ``--help`` says it).
ROUND_OPTION_REASONS: dict[str, str] = {name: why for name, (_, why) in _ROUND_OPTIONS.items()}


def uses_cuda(accelerator: str | None = None) -> bool:
    """Whether a Trainer with this ``accelerator`` (``None``: ``"auto"``) runs on a CUDA GPU here."""
    return torch.cuda.is_available() and str(accelerator or "auto") in ("auto", "gpu", "cuda")


def default_precision(accelerator: str | None = None) -> str:
    """The precision of a run that does not choose one: mixed precision on a GPU, plain float32 on the CPU.

    Args:
        accelerator: the Trainer's ``accelerator`` (``None``: ``"auto"``).

    Returns:
        ``"bf16-mixed"`` on a GPU that supports bfloat16, ``"16-mixed"`` on another GPU, ``"32-true"`` otherwise.
    """
    if not uses_cuda(accelerator):
        return "32-true"
    return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"


def check_precision(precision: str | int, on_cpu: bool, exact_steps_method: str | None = None) -> None:
    """Refuse a precision the device or the method cannot train with.

    Args:
        precision: the Trainer's ``precision`` (``"16-mixed"``, ``32``, ...).
        on_cpu: whether the run trains on the CPU (then only :data:`CPU_PRECISIONS`).
        exact_steps_method: the method's name when the method counts its local steps (SCAFFOLD, FedNova, ...):
            16-mixed's gradient scaler can skip a step, so it is refused.

    Raises:
        ValueError: one line saying which precision to use instead.
    """
    precision = str(precision)
    if precision in CONVERTING_PRECISIONS:
        raise ValueError(
            f"trainer option precision={precision!r} converts the weights, and the federation's batches are float32; "
            "use --trainer.precision 32-true or bf16-mixed (16-mixed on a GPU without bfloat16; in Python "
            "L.Trainer(precision='32-true'))"
        )
    if on_cpu and precision not in CPU_PRECISIONS:
        raise ValueError(
            f"trainer option precision={precision!r} needs a CUDA GPU; on the CPU use --trainer.precision 32-true "
            "(or bf16-mixed; in Python L.Trainer(precision='32-true'))"
        )
    if exact_steps_method is not None and precision in SCALED_PRECISIONS:
        raise ValueError(
            f"{exact_steps_method} counts local steps, and 16-mixed's gradient scaler can skip some; "
            "use --trainer.precision bf16-mixed or 32-true (in Python L.Trainer(precision='bf16-mixed'))"
        )


def check_round_options(options: Mapping[str, Any]) -> None:
    """Refuse Trainer options that would cut rounds short or change what a batch is.

    Args:
        options: Trainer settings by name, e.g. the keyword arguments of ``L.Trainer`` or
            :func:`trainer_round_options` of a built one; names other than :data:`ROUND_OPTIONS` are ignored.

    Raises:
        ValueError: ``trainer option <name>=<value> is not supported: <why>; <what to use instead>``, for the first
            refused option in the order of :data:`ROUND_OPTIONS`.
    """
    for key, (allowed, why) in _ROUND_OPTIONS.items():
        if key in options and not allowed(options[key]):
            raise ValueError(f"trainer option {key}={options[key]!r} is not supported: {why}")


def check_trainer_values(options: Mapping[str, Any], rounds: int | None = None) -> None:
    """Refuse Trainer values out of range that Lightning accepts and then fails on, or silently ignores.

    Args:
        options: Trainer settings by name (the command line's ``--trainer.*``); other names are ignored.
        rounds: the federation's rounds, which a ``min_epochs`` may not exceed.

    Raises:
        ValueError: ``trainer option <name>=<value> ...; <what to use instead>``.
    """
    every = options.get("check_val_every_n_epoch")
    if every is not None and every < 1:
        raise ValueError(
            f"trainer option check_val_every_n_epoch={every} must be at least 1 (validate every that many rounds); "
            "to validate never, use --trainer.limit_val_batches 0 (in Python L.Trainer(limit_val_batches=0))"
        )
    clip = options.get("gradient_clip_val")
    if clip is not None and not clip >= 0:
        raise ValueError(f"trainer option gradient_clip_val={clip} must be >= 0 (0 or null: no clipping)")
    limit = options.get("max_time")
    if limit is not None and _seconds(limit) == 0:
        raise ValueError(
            f"trainer option max_time={limit!r} stops the fit before its first round; give a time (DD:HH:MM:SS) or "
            "leave it unset"
        )
    least = options.get("min_epochs")
    if least is not None and rounds is not None and least > rounds:
        raise ValueError(
            f"trainer option min_epochs={least} exceeds rounds={rounds}, which end the fit first (one epoch is one "
            "round); leave min_epochs unset or at most the rounds"
        )


def check_clipping(gradient_clip_val: float | None, method: str | None) -> None:
    """Refuse Lightning's gradient clipping for a method, which steps its optimizer itself (manual optimization).

    Args:
        gradient_clip_val: the Trainer's ``gradient_clip_val``.
        method: the method's name, or None for a module Lightning's clipping may serve.

    Raises:
        ValueError: naming ``--model.clip_grad_norm``, the method's own clipping.
    """
    if method is not None and gradient_clip_val:
        raise ValueError(
            f"trainer option gradient_clip_val={gradient_clip_val} is not supported by {method}, which steps its own "
            f"optimizer; use --model.clip_grad_norm {gradient_clip_val} (in Python the method's "
            f"clip_grad_norm={gradient_clip_val}: each local step's gradient clipped to that L2 norm)"
        )


def _seconds(duration: Any) -> float | None:
    """A ``max_time`` in seconds; None for a form Lightning will judge itself.

    >>> _seconds("00:01:00:30"), _seconds({"minutes": 2}), _seconds("soon")
    (3630.0, 120.0, None)
    """
    if isinstance(duration, str):
        parts = duration.strip().split(":")
        if len(parts) != 4 or not all(p.isdigit() for p in parts):
            return None
        days, hours, minutes, seconds = map(int, parts)
        return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
    try:
        return (duration if isinstance(duration, timedelta) else timedelta(**duration)).total_seconds()
    except TypeError:
        return None


def trainer_round_options(trainer: L.Trainer) -> dict[str, Any]:
    """The settings :func:`check_round_options` checks, as a built Trainer holds them.

    Lightning normalises them when the Trainer is built: ``fast_dev_run=True`` also sets ``limit_train_batches`` and
    ``max_steps`` to 1, ``overfit_batches`` sets ``limit_train_batches``; the order of the result names the option
    that was given (``fast_dev_run`` first).
    """
    # Lightning's trainer setup assigns fast_dev_run and overfit_batches; the Trainer class does not declare them.
    return {
        "fast_dev_run": trainer.fast_dev_run,  # type: ignore[attr-defined]
        "overfit_batches": trainer.overfit_batches,  # type: ignore[attr-defined]
        "limit_train_batches": trainer.limit_train_batches,
        "max_steps": trainer.max_steps,
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        "val_check_interval": trainer.val_check_interval,
    }


def trainer_values(trainer: L.Trainer) -> dict[str, Any]:
    """The settings :func:`check_trainer_values` checks, as a built Trainer holds them (``max_time``: its Timer's)."""
    seconds = max_time_seconds(trainer)
    return {
        "check_val_every_n_epoch": trainer.check_val_every_n_epoch,
        "gradient_clip_val": trainer.gradient_clip_val,
        "min_epochs": trainer.fit_loop.min_epochs,
        "max_time": None if seconds is None else {"seconds": seconds},
    }


def check_trainer(trainer: L.Trainer, exact_steps_method: str | None = None, rounds: int | None = None) -> None:
    """The fit-time rules on a built Trainer: no option that cuts rounds, a precision its device and method can use.

    Args:
        trainer: the Trainer, set up for fit (its strategy knows the device).
        exact_steps_method: see :func:`check_precision`.
        rounds: the federation's rounds, which ``min_epochs`` may not exceed.
    """
    check_round_options(trainer_round_options(trainer))
    check_trainer_values(trainer_values(trainer), rounds)
    check_precision(str(trainer.precision), trainer.strategy.root_device.type == "cpu", exact_steps_method)
    check_callbacks(trainer)


def busy_cores(interval: float = 0.1) -> float | None:
    """How many of the cores this process may run on other processes keep busy now, or None where this cannot be read.

    Read from ``/proc/stat`` over ``interval`` seconds while this process sleeps (the 1-minute load average lags: right
    after ``pip install`` an idle machine still reads busy), counting only the CPUs in this process's affinity set (a
    scheduler's job on part of a busy node is not busy itself); elsewhere the 1-minute load average.
    """
    try:
        before = _cpu_times()
        time.sleep(interval)
        after = _cpu_times()
    except (OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0]
        except (AttributeError, OSError):
            return None
    total, idle = after[0] - before[0], after[1] - before[1]
    return 0.0 if total <= 0 else after[2] * (1 - idle / total)


def _cpu_times(path: str = "/proc/stat") -> tuple[int, int, int]:
    """(total, idle + iowait) clock ticks summed over the CPUs this process may run on, and how many they are."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    total = idle = cpus = 0
    with open(path) as f:
        for line in f:
            name, *values = line.split()
            if not name.startswith("cpu") or not name[3:].isdigit():  # the "cpu" total line, intr, ctxt, ...
                continue
            if allowed is not None and int(name[3:]) not in allowed:
                continue
            fields = [int(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal
            total, idle, cpus = total + sum(fields), idle + fields[3] + fields[4], cpus + 1
    if cpus == 0:
        raise ValueError("/proc/stat lists none of this process's CPUs")
    return total, idle, cpus


def busy_cpu_note(threads: int | None = None, processes: int = 1, runner: str = "this fit runs") -> str | None:
    """One line when other work leaves fewer idle CPU cores than this fit's torch threads, else None.

    Torch's CPU threads wait for each other at every operation; a thread whose core another process holds makes the
    rest wait for it, and a round can run many times slower. A warning, not a change: the thread count can move
    float results, so the run keeps what the user chose. Nothing is said when ``OMP_NUM_THREADS`` is set (the user
    chose), when one thread is asked for, or where the CPU's load cannot be read (:func:`busy_cores`).

    Args:
        threads: torch's intra-op threads in each process (default: ``torch.get_num_threads()``).
        processes: processes of this fit on this machine (each with ``threads`` threads).
        runner: who runs the threads, in the line ("this fit runs", "its fits run").
    """
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    want = (torch.get_num_threads() if threads is None else threads) * processes
    if want <= 1:
        return None
    busy = busy_cores()
    if busy is None:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if cores - busy >= want - 0.5:
        return None
    return (
        f"the CPU is busy (other processes keep {busy:.1f} of {cores} cores busy) and {runner} {want} torch "
        "threads: threads that wait for a busy core can make each round several times slower; start it with "
        "OMP_NUM_THREADS=1 (or as many threads as idle cores) to avoid that"
    )


def check_callbacks(trainer: L.Trainer) -> None:
    """Refuse callbacks wrong under a federation: weight averaging, accumulation, per-step LR logs, in-round saves."""
    for callback in trainer.callbacks:  # type: ignore[attr-defined]  # assigned by Lightning, undeclared on Trainer
        if isinstance(callback, LearningRateMonitor) and callback.logging_interval == "step":
            raise ValueError(
                "LearningRateMonitor(logging_interval='step') would log nothing under Federation (a round's LR is "
                "the same for every local step); use logging_interval='epoch' (one value per round) or None"
            )
        if isinstance(callback, ModelCheckpoint) and checkpoints_within_epochs(callback):
            raise ValueError(
                f"{type(callback).__name__} with every_n_train_steps or train_time_interval would save in the middle "
                "of a round, which no fit resumes from (and with several processes, whose local steps differ, it "
                "would hang); save by round: every_n_epochs=N (one epoch is one round)"
            )
        if isinstance(callback, GradientAccumulationScheduler):
            raise ValueError(
                "GradientAccumulationScheduler is not supported with Federation: every local batch is one optimizer "
                "step (methods count and scale local steps; an accumulated step could span two clients); remove it"
            )
        if isinstance(callback, (StochasticWeightAveraging, WeightAveraging)):
            raise ValueError(
                f"{type(callback).__name__} is not supported with Federation: it averages the weights after every "
                "training batch, which here is a client's local model, not the global model; remove it "
                "(server-side averaging across rounds is a server optimizer: --federation.server_optimizer, in Python "
                "Federation(server_optimizer=...))"
            )


def check_lr_schedulers(trainer: L.Trainer, lr_decay: float) -> None:
    """An LR scheduler steps once per round (``interval: "epoch"``) and replaces ``lr_decay`` (one per-round schedule).

    A step-interval scheduler is refused: it would make a client's learning rate depend on how many local steps the
    clients before it in the round took.
    """
    for config in trainer.lr_scheduler_configs:
        name = type(config.scheduler).__name__
        if config.reduce_on_plateau and config.monitor is None:  # a method's dict without one (Lightning's own rule)
            raise ValueError(
                "the LR scheduler ReduceLROnPlateau needs the key it monitors: return {'scheduler': ..., 'monitor': "
                "'global/acc'} as configure_optimizers' 'lr_scheduler'"
            )
        if config.interval != "epoch":
            raise ValueError(
                f"the LR scheduler {name} steps every {config.interval}: under Federation a client's LR would depend "
                "on its place in the round; return it with interval 'epoch' (one step per round)"
            )
        if lr_decay != 1.0:
            raise ValueError(
                f"both lr_decay={lr_decay} and the LR scheduler {name} schedule the round's learning rate; "
                "use one (Federation(lr_decay=1), --federation.lr_decay 1, or no scheduler in configure_optimizers)"
            )


def check_round_monitors(trainer: L.Trainer, eval_every: int, rounds: int, validates: bool) -> None:
    """Refuse a watcher of a round metric that fails on the rounds without an evaluation (``eval_every`` above 1).

    A round's metrics (``global/acc``, ``train/loss``, ...: :func:`~fl_lightning.recorder.is_round_metric`) exist only
    after an evaluated round. ``EarlyStopping`` and ``ReduceLROnPlateau`` (``strict``, their default) raise on a round
    without them, and so does a ``ModelCheckpoint`` monitoring one in a fit that ``validates`` (without validation it
    skips those rounds); each gets the line that makes it wait for the evaluated rounds.
    """
    if eval_every == 1 or rounds == 1:
        return
    every = f"measured only every {eval_every} rounds (eval_every={eval_every})"
    for callback in trainer.callbacks:  # type: ignore[attr-defined]  # assigned by Lightning, undeclared on Trainer
        monitor = getattr(callback, "monitor", None)
        if not isinstance(monitor, str) or not is_round_metric(monitor):
            continue
        name = type(callback).__name__
        if isinstance(callback, EarlyStopping) and callback.strict:
            raise ValueError(
                f"{name}(monitor={monitor!r}) watches a key {every}; pass strict=False (it then skips the rounds "
                "without an evaluation, and patience counts evaluations), or eval_every=1"
            )
        saves = callback.every_n_epochs if isinstance(callback, ModelCheckpoint) else None  # 0: not per round
        if saves and validates and saves % eval_every != 0:
            raise ValueError(
                f"{name}(monitor={monitor!r}) watches a key {every}; pass every_n_epochs={eval_every} (it then "
                "saves on the evaluated rounds), or eval_every=1"
            )
    for config in trainer.lr_scheduler_configs:
        if config.reduce_on_plateau and config.strict and isinstance(config.monitor, str):
            if is_round_metric(config.monitor):
                raise ValueError(
                    f"ReduceLROnPlateau monitors {config.monitor!r}, a key {every}; add 'strict': False to its "
                    "configure_optimizers dict (it then steps on the evaluated rounds only), or eval_every=1"
                )


def set_round_lr(trainer: L.Trainer, lr_scale: float) -> float:
    """Set the LR of a round's clients and return it.

    ``lr_0 · lr_decay^r`` (``lr_scale``), unless an LR scheduler owns the LR: then its value, which it set when it
    stepped at the end of the previous round.
    """
    if not trainer.lr_scheduler_configs:
        for opt in trainer.optimizers:
            for group in opt.param_groups:
                group.setdefault("fl_initial_lr", group["lr"])
                group["lr"] = group["fl_initial_lr"] * lr_scale
    return trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else float("nan")


def step_lr_schedulers(trainer: L.Trainer, module: L.LightningModule) -> None:
    """At a round's end, step the epoch-interval LR schedulers of a module with manual optimization (the methods).

    Lightning steps them itself for automatic optimization, and never for manual; a ``ReduceLROnPlateau`` reads its
    monitored key from the callback metrics (any key a round records, see ``RunRecorder.publish``). A round that did
    not record the key steps no such scheduler when its dict says ``strict: False`` (with ``eval_every`` above 1, the
    rounds without an evaluation) and is an error otherwise, as under Lightning's automatic optimization.
    """
    if module.automatic_optimization:
        return
    for config in trainer.lr_scheduler_configs:
        if (trainer.current_epoch + 1) % config.frequency != 0:
            continue
        if not config.reduce_on_plateau:
            module.lr_scheduler_step(config.scheduler, None)
            continue
        metric = trainer.callback_metrics.get(config.monitor) if config.monitor is not None else None
        if metric is not None:
            module.lr_scheduler_step(config.scheduler, metric)
        elif config.strict:
            known = ", ".join(sorted(trainer.callback_metrics)) or "none yet"
            raise ValueError(
                f"ReduceLROnPlateau monitors {config.monitor!r}, which round {trainer.current_epoch + 1} did not "
                f"record (its keys: {known}); give a key every round records in the scheduler dict's 'monitor', or "
                "'strict': False to step it only on the rounds that record it"
            )


def check_datamodule(datamodule: Any) -> FederatedDataModule:
    """The Trainer's datamodule, if it is a :class:`~fl_lightning.FederatedDataModule` (which plans the rounds)."""
    if not isinstance(datamodule, FederatedDataModule):
        raise TypeError(
            f"the Federation callback needs a FederatedDataModule, got {type(datamodule).__name__}; "
            "pass datamodule=FederatedDataModule(...) to trainer.fit"
        )
    return datamodule


def check_pieces(
    trainer: L.Trainer, module: L.LightningModule, datamodule: FederatedDataModule, holdout_needed: int = 0
) -> None:
    """The module, the data and the processes fit together (called by the Federation callback at setup).

    Args:
        trainer: the Trainer.
        module: the LightningModule; a method (``FedAvg`` or a subclass) trains a whole client per batch.
        datamodule: the data, set up for fit.
        holdout_needed: server holdout samples per class the method needs.
    """
    name, owner = getattr(module, "method_name", type(module).__name__), type(module).__name__
    if trainer.world_size > 1 and not isinstance(module, FedAvg):
        raise TypeError(
            f"several processes need an fl_lightning method (FedAvg or a subclass); {type(module).__name__} "
            "trains per-step batches, which cannot be padded to keep processes in step: use one device"
        )
    if datamodule.holdout_per_class < holdout_needed:
        raise ValueError(
            f"{name} needs {holdout_needed} server holdout samples per class; "
            f"set {option('data.holdout_per_class', holdout_needed)} (it is {datamodule.holdout_per_class})"
            + (f" or lower {option('model.aux_per_class', owner=owner)}" if hasattr(module, "aux_per_class") else "")
        )
    if getattr(module, "num_classes", datamodule.num_classes) != datamodule.num_classes:
        raise ValueError(
            f"the model predicts {module.num_classes} classes but {datamodule.dataset} has {datamodule.num_classes}"
        )
    if isinstance(module, FedAvg) and module.net is not None:
        check_network_output(module, datamodule.input_sample(module.device), datamodule.num_classes)
    sizes = datamodule.client_sizes
    if datamodule.drop_last and min(sizes) < datamodule.batch_size:
        raise ValueError(
            f"with drop_last, clients smaller than one batch never train (smallest client {min(sizes)} "
            f"samples, batch size {datamodule.batch_size}); set {option('data.drop_last', False)} or a smaller "
            + option("data.batch_size")
        )


def check_network_output(module: FedAvg, sample: torch.Tensor, num_classes: int) -> None:
    """A method's network takes the data's inputs and returns one logit per class (checked on ``sample``, two of them).

    Too few outputs failed mid-round (``Target 7 is out of bounds``), too many trained on without a word (and were
    distilled as if they were classes); an input size the network does not take failed deep in its first layer.
    """
    first = next(module.parameters(), None)  # a network moved or cast by its user takes its inputs there
    if first is not None:
        sample = sample.to(first.device, first.dtype if first.is_floating_point() else sample.dtype)
    # Two separate rows (a network may work on its input in place); the global RNG as it was (a lazy layer draws).
    with in_mode(module, training=False), torch.no_grad(), torch.random.fork_rng(devices=[]):
        try:
            out = module(torch.stack([sample, sample]))
        except Exception as err:  # noqa: BLE001 - whatever the network raises, the fix is the same
            raise ValueError(
                f"the network failed on two of the data's inputs of shape {tuple(sample.shape)} "
                f"({first_line(err)[:160]}); give {option('model.net', owner=type(module).__name__)} one that takes "
                "them (a built-in network adapts to the data)"
            ) from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(
            f"the network returns {got} for 2 inputs, but the data has {num_classes} classes: give "
            f"{option('model.net', owner=type(module).__name__)} one that returns logits [batch, {num_classes}] (e.g. "
            f"--model.net.init_args.num_classes {num_classes}; in Python a network built for {num_classes} classes)"
        )


def check_max_epochs(max_epochs: int | None, rounds: int) -> int:
    """The Trainer's ``max_epochs`` for a run of ``rounds`` rounds: one epoch is one round.

    Args:
        max_epochs: what the Trainer was given; ``None`` and ``-1`` mean unset.
        rounds: the federation's rounds.

    Returns:
        ``rounds``.

    Raises:
        ValueError: ``max_epochs`` is set to another number.
    """
    if max_epochs not in (None, -1, rounds):
        raise ValueError(
            f"max_epochs={max_epochs} conflicts with rounds={rounds}: one epoch is one round; "
            "leave max_epochs unset and give the rounds to the federation (Federation(rounds=...), "
            "--federation.rounds)"
        )
    return rounds


def checkpoint_dir(default_root_dir: str | os.PathLike) -> Path:
    """Where a run's checkpoints live, so that ``ckpt_path="last"`` (``--ckpt_path last``) finds them."""
    return Path(default_root_dir) / "checkpoints"


def prepare_trainer(trainer: L.Trainer, rounds: int) -> None:
    """Make a Trainer run ``rounds`` rounds and keep its checkpoints in the run directory.

    Call it before Lightning reads ``max_epochs`` or resolves ``ckpt_path="last"`` (the Federation callback does,
    when the datamodule is attached; the CLI when it builds the Trainer). It refuses the options that cut rounds
    (:func:`check_round_options`) and, in a fit of a method, Lightning's gradient clipping (:func:`check_clipping`;
    Lightning would refuse it next, saying to switch to automatic optimization), sets ``max_epochs`` to the rounds
    (:func:`check_max_epochs`; Lightning's own default, 1000 once a fit has started, counts as unset), and points
    every ``ModelCheckpoint`` without a ``dirpath`` at :func:`checkpoint_dir`, with ``save_last`` on unless it was
    chosen. When checkpoints are on but every ``ModelCheckpoint`` writes elsewhere (``dirpath`` given), an
    :class:`AtomicLastCheckpoint` joins them, so that the run still keeps its ``last.ckpt`` for ``ckpt_path="last"``.
    """
    check_round_options(trainer_round_options(trainer))
    module = trainer.lightning_module  # trainer.fit sets it before it attaches the data
    if trainer.state.fn == TrainerFn.FITTING and isinstance(module, FedAvg):
        check_clipping(trainer.gradient_clip_val, module.method_name)
    max_epochs = trainer.fit_loop.max_epochs
    if max_epochs == LIGHTNING_DEFAULT_MAX_EPOCHS:
        max_epochs = None
    trainer.fit_loop.max_epochs = check_max_epochs(max_epochs, rounds)
    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]  # assigned by Lightning, undeclared
    here = str(checkpoint_dir(trainer.default_root_dir))
    for i, callback in enumerate(callbacks):
        if not isinstance(callback, ModelCheckpoint) or callback.dirpath is not None:
            continue
        if _is_default(callback):  # Lightning's own (or a bare ModelCheckpoint()): the run's one file, last.ckpt
            callback = callbacks[i] = AtomicLastCheckpoint()
        callback.dirpath = here
        if callback.save_last is None:
            callback.save_last = True
    # Every checkpoint callback writing elsewhere (each with a dirpath of its own): the run keeps its last.ckpt too.
    checkpoints = [c for c in callbacks if isinstance(c, ModelCheckpoint)]
    if checkpoints and os.path.abspath(here) not in {os.path.abspath(str(c.dirpath)) for c in checkpoints}:
        last = AtomicLastCheckpoint()
        last.dirpath = here
        callbacks.append(last)


def _is_default(callback: ModelCheckpoint) -> bool:
    """Whether a checkpoint callback has Lightning's defaults: no monitor, the best one of every epoch, no filename."""
    return (
        type(callback) is ModelCheckpoint
        and callback.monitor is None
        and callback.save_top_k == 1
        and callback.filename is None
        and callback.save_last is None
        and callback.every_n_epochs == 1
        and not checkpoints_within_epochs(callback)
    )

"""Which executor runs a fit's local updates: the engines, what keeps a method off the batched one, ``auto``'s rule.

:func:`choose_executor` resolves the :class:`~fl_lightning.Federation`'s ``engine`` once per fit: ``sequential``
(:class:`~fl_lightning.executor.SequentialClients`), ``batched`` (:class:`~fl_lightning.batched.BatchedClients`)
unless :func:`batching_refusal` or :func:`network_refusal` says why the method or setting cannot train stacked, or
``auto`` (batched where :func:`auto_engine` expects it to be faster).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from torch import Tensor, nn
from torch.func import functional_call, vmap

from fl_lightning.batched import BatchedClients
from fl_lightning.core.evaluation import Evaluation
from fl_lightning.core.gpu_memory import GIB, MIB, PeakMemory, fitting_group, memory_budget
from fl_lightning.core.messages import first_line
from fl_lightning.core.models import in_mode, trainable
from fl_lightning.core.stacked_conv import lowered_convolutions
from fl_lightning.core.stacking import overrides, stacked_state, swap_names, swap_state
from fl_lightning.core.state import ClientStateStore
from fl_lightning.core.step_capture import StepCache, resolve_capture
from fl_lightning.data import FederatedDataModule
from fl_lightning.executor import ClientExecutor, SequentialClients
from fl_lightning.module import FedAvg

#: The engines a :class:`~fl_lightning.Federation` can run a round's local updates with.
ENGINES = ("sequential", "batched", "auto")
#: What the run's first line adds about the stacked step, per capture mode.
CAPTURE_NOTES = {
    "graph": "each full-batch step replayed as one CUDA graph",
    "compile": "each full-batch step compiled whole (torch.compile; on a GPU replayed as one CUDA graph)",
    "static": "each full-batch step one function of static tensors (uncaptured)",
}
#: What the run's first line adds about the stacked convolutions, per lowering other than ``grouped``.
STACKED_CONV_NOTES = {
    "matmul": "im2col and one batched matmul (stacked_conv=matmul)",
    "loop": "one convolution per client (stacked_conv=loop)",
}
#: ``auto`` on a CPU: batched when a local batch holds at most this many input values (see :func:`auto_engine`).
AUTO_CPU_BATCH_VALUES = 8192


@dataclass
class EngineChoice:
    """The executor a fit runs its local updates with, and what to say about the choice."""

    executor: ClientExecutor
    #: ``sequential`` or ``batched``.
    engine: str
    #: Clients per training batch with the batched engine (``None``: sequential).
    group_size: int | None
    #: One line for the run's output about the choice (``None``: nothing to say).
    note: str | None
    #: Why the method or setting cannot train batched, when batched or auto was asked for (``None``: it can).
    refusal: str | None = None
    #: The refusal as a warning, where ``batched`` was asked for (then there is no ``note``).
    warning: str | None = None
    #: How the batched engine runs its stacked step (:func:`~fl_lightning.core.step_capture.resolve_capture`).
    step_capture: str = "off"
    #: The GPU memory (bytes) the group size was fitted to, where it was chosen here (``None``: it was not).
    memory_budget: float | None = None


def choose_executor(
    requested: str,
    trainer: L.Trainer,
    module: L.LightningModule,
    datamodule: FederatedDataModule,
    client_states: ClientStateStore,
    seed: int,
    group_size: int | None,
    evaluate_local: Callable[[L.LightningModule], Evaluation] | None = None,
    on_fallback: Callable[[str], None] | None = None,
    step_capture: str = "auto",
    on_capture_note: Callable[[str], None] | None = None,
    clients_per_round: int = 1,
    memory_budget_gb: float | None = None,
    stacked_conv: str = "grouped",
) -> EngineChoice:
    """The executor for the ``requested`` engine (one of :data:`ENGINES`) with this Trainer, module and data.

    A refused method or setting trains sequentially, with the reason in :attr:`EngineChoice.refusal` (a warning
    where ``batched`` was asked for, a note where ``auto`` was).

    Args:
        requested: ``sequential``, ``batched`` or ``auto``.
        trainer: the Trainer of the fit (its optimizers configured).
        module: the LightningModule being federated.
        datamodule: the federated data (set up).
        client_states: where each client's persistent method state lives between rounds.
        seed: the federation's seed.
        group_size: with the batched engine, clients trained together at most (``None``: all of the round's
            ``clients_per_round`` on a CPU; on a GPU as many as fit ``memory_budget_gb``, :func:`memory_group`).
        evaluate_local: evaluates a client's local weights, for ``eval_local``; ``None`` to skip.
        on_fallback: told why, when the batched executor meets a group it cannot stack and trains sequentially.
        step_capture: how the batched engine runs its stacked step (one of
            :data:`~fl_lightning.core.step_capture.CAPTURE_MODES`; ``auto``: a CUDA graph on a GPU, else as it is).
        on_capture_note: told why, when a stacked step runs uncaptured after all.
        clients_per_round: the clients a process trains in a round (the largest useful group).
        memory_budget_gb: GPU memory the stacked clients may use (``None``: 90 % of the free memory at fit start).
        stacked_conv: how the batched engine computes stacked 2-d convolutions (one of
            :data:`~fl_lightning.core.stacked_conv.STACKED_CONVS`).
    """
    capture = resolve_capture(step_capture, torch.device(module.device))
    engine, note, refusal = "sequential", None, None
    if requested != "sequential":
        refusal = batching_refusal(
            module,
            trainer.optimizers,
            scaler=getattr(trainer.precision_plugin, "scaler", None) is not None,
            streaming=datamodule.streaming,
            strategy=trainer.strategy,
            device=module.device,
        )
        sample = None
        if refusal is None:
            sample = datamodule.input_sample(module.device)
            refusal = network_refusal(module, sample)
        if refusal is not None:
            note = f"engine {requested}: {refusal}; training sequentially"
        elif requested == "batched":
            engine = "batched"
        else:
            assert sample is not None
            engine, why = auto_engine(module.device, batch_values(sample, datamodule.batch_size))
            note = f"engine auto: {engine} ({why})"
    if engine == "batched":
        cache = StepCache(capture, on_note=on_capture_note) if capture != "off" else None
        batched = BatchedClients(datamodule, client_states, seed, evaluate_local, cache, stacked_conv)
        batched.on_fallback = on_fallback
        group, why, budget = group_size or clients_per_round, "", None
        if group_size is None and module.device.type == "cuda":
            budget = memory_budget(module.device, memory_budget_gb)
            group, base, per_client = memory_group(module, datamodule, budget, clients_per_round, stacked_conv)
            why = (
                f" (to fit {budget / GIB:.1f} GiB: about {per_client / MIB:.1f} MiB a client over "
                f"{base / MIB:.0f} MiB, estimated)"
            )
        note = note or f"engine batched: up to {group} clients trained together{why}"
        if capture != "off":
            note += f"; {CAPTURE_NOTES[capture]}"
        if stacked_conv != "grouped":
            note += f"; convolutions as {STACKED_CONV_NOTES[stacked_conv]}"
        return EngineChoice(batched, "batched", group, note, step_capture=capture, memory_budget=budget)
    sequential = SequentialClients(datamodule, client_states, seed, evaluate_local)
    if refusal is not None and requested == "batched":
        return EngineChoice(sequential, "sequential", None, None, refusal, warning=note)
    return EngineChoice(sequential, "sequential", None, note, refusal)


#: A measured network step's memory times this is what :func:`memory_group` plans a client for: a method's own
#: terms (a teacher's forward, anchors, per-client attributes) and a captured step's pool come on top.
MEMORY_MARGIN = 1.5


def memory_group(
    module: L.LightningModule, datamodule: FederatedDataModule, budget: float, clients: int, conv: str = "grouped"
) -> tuple[int, float, float]:
    """The group size that fits ``budget`` bytes on the module's GPU, and the fixed and per-client bytes behind it.

    Measured on one step of the network's cross-entropy stacked for 1 and then 2 clients (weights, gradients,
    momentum and activations on a full batch of zeros), in float32 (an upper bound for ``bf16-mixed``), planned with
    a :data:`MEMORY_MARGIN`, its convolutions computed as ``conv`` (a ``stacked_conv`` lowering) computes them. The
    batched executor measures the real step in the first round (:attr:`~fl_lightning.batched.BatchedClients.memory`)
    and the callback re-fits the group to it.
    """
    sample = datamodule.input_sample(module.device)
    peaks = []
    names = swap_names(module)
    with in_mode(module, training=True):
        for k in (1, 2):
            with PeakMemory(module.device) as peak:
                params, buffers = stacked_state(module, k)
                x = torch.zeros(k, datamodule.batch_size, *sample.shape, dtype=sample.dtype, device=sample.device)
                y = torch.zeros(k, datamodule.batch_size, dtype=torch.long, device=sample.device)

                def loss(p: dict[str, Tensor], b: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
                    with lowered_convolutions(conv):
                        logits = functional_call(module, swap_state({**p, **b}, names), (xi,), tie_weights=False)
                    return torch.nn.functional.cross_entropy(logits, yi)

                total = vmap(loss, randomness="error")(params, buffers, x, y).sum()
                # allow_unused: a method's own modules (MOON's projection head) are not in the network's forward
                grads = torch.autograd.grad(total, list(params.values()), allow_unused=True)
                momentum = [g.clone() for g in grads if g is not None]
                del total, grads, momentum, params, buffers, x, y
            peaks.append(peak.bytes)
    per_client = MEMORY_MARGIN * max(peaks[1] - peaks[0], 1)
    base = max(peaks[0] - (peaks[1] - peaks[0]), 0)
    return fitting_group(budget, base, per_client, clients), base, per_client


def batching_refusal(
    module: L.LightningModule, optimizers: Sequence[torch.optim.Optimizer] = (), **facts: Any
) -> str | None:
    """Why ``module`` cannot train batched (``None``: it can). One short clause, for "trains sequentially: ...".

    ``facts``: ``scaler`` (a gradient scaler is in use), ``streaming`` (the data is read from disk per round),
    ``strategy`` (the Trainer's: one device or DDP), ``device`` (CPU or CUDA).
    """
    name = type(module).__name__
    if not isinstance(module, FedAvg):
        return f"{name} is not an fl_lightning method (a plain LightningModule trains one batch per step)"
    if not getattr(module, "batchable", True):
        return f"{name} declares batchable = False"
    for hook in ("training_step", "local_step", "before_local_step"):
        if overrides(module, hook, FedAvg):
            return f"{name} overrides {hook} (the batched engine calls client_loss and local_gradient only)"
    if module.hparams.get("step_hooks", False):
        return "step_hooks=True runs every local step through Lightning's hooks"
    if facts.get("scaler"):
        return "fp16 mixed precision needs a gradient scaler per client (bf16-mixed trains batched)"
    if facts.get("streaming"):
        return "the data is streamed from disk (in_memory=False) one client at a time"
    strategy = facts.get("strategy")
    if strategy is not None and not isinstance(strategy, SingleDeviceStrategy | DDPStrategy):
        return f"the {type(strategy).__name__} strategy shards or wraps the model (one device or DDP train batched)"
    device = facts.get("device")
    if device is not None and torch.device(device).type not in ("cpu", "cuda"):
        return f"it runs on {torch.device(device).type} (the batched engine keeps clients' random streams on CPU/CUDA)"
    if len(optimizers) != 1 or type(optimizers[0]) is not torch.optim.SGD:
        kinds = ", ".join(type(o).__name__ for o in optimizers) or "none"
        return f"its optimizer is {kinds}; the batched engine runs torch.optim.SGD"
    groups = optimizers[0].param_groups
    if len(groups) != 1 or {id(p) for p in groups[0]["params"]} != {id(p) for _, p in trainable(module)}:
        return "its SGD has several parameter groups, or does not train every trainable parameter"
    return None


def network_refusal(module: nn.Module, sample: Tensor) -> str | None:
    """Why the module's network cannot run stacked under ``vmap`` on inputs like ``sample`` (``None``: it can)."""
    params, buffers = stacked_state(module, 2)
    names = swap_names(module)
    try:
        with in_mode(module, training=True), torch.no_grad():
            vmap(
                lambda p, b, x: functional_call(module, swap_state({**p, **b}, names), (x,), tie_weights=False),
                randomness="error",
            )(params, buffers, sample.expand(2, 2, *sample.shape))
    except Exception as err:  # noqa: BLE001 - any failure means: train it sequentially, and say why
        first = first_line(err)
        return f"its network cannot run under torch.func.vmap ({first[:160]})"
    return None


def auto_engine(device: torch.device, batch_values: int) -> tuple[str, str]:
    """``auto``'s choice for a method that can train batched: the engine and why.

    ``batch_values``: the input values of one local batch (batch size × values per sample). On a GPU a small network's
    step is bound by kernel launches, which stacking divides by the group size: batched. On a CPU the arithmetic
    decides: batches of at most :data:`AUTO_CPU_BATCH_VALUES` input values (the 8×8 quickstart, the tabular MLP)
    train faster batched; the papers' 28×28 and 32×32 images do not, as ``vmap``'s grouped convolutions are
    compute-bound (``bench/bench_engines.py`` measures both engines; its figures are in the README).
    """
    if device.type == "cuda":
        return "batched", "on a GPU, stacking clients divides the kernel launches of each local step"
    if batch_values <= AUTO_CPU_BATCH_VALUES:
        return "batched", f"a local batch holds {batch_values:,} input values, small enough to train faster stacked"
    return (
        "sequential",
        f"a local batch holds {batch_values:,} input values: the CPU is compute-bound, stacking is slower",
    )


def batch_values(sample: Tensor, batch_size: int) -> int:
    """Input values in one local batch of ``batch_size`` samples shaped like ``sample``."""
    return sample.numel() * batch_size

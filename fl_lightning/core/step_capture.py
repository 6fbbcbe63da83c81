"""The stacked local step as one function of static tensors: run plain, compiled, or replayed as a CUDA graph.

The batched engine's step (forward, backward and per-client SGD for K stacked clients) is short and bound by the
launch of its few hundred small kernels. :func:`make_step` writes it as one function that reads and writes only
the tensors of a :class:`StepState` (the stacked weights, statistics, client attributes, momentum, step counter,
loss sums and the batch's static input slots) and takes no decision on a tensor's value: which clients are done is a
mask computed on the device, a client's first momentum step is a flag on the device. Such a function can be
recorded once as a CUDA graph and replayed each step after the next batch is copied into the static inputs
(:class:`CapturedStep`, mode ``graph``), compiled whole (``torch.compile(fullgraph=True)``, mode ``compile``), or
called as it is (mode ``static``). Its arithmetic is :mod:`~fl_lightning.core.stacked_sgd`'s, op for op.

:class:`StepCache` keeps each built step (its static tensors and graph) across a fit's rounds, keyed by everything
the graph bakes in, and rebuilds it when the module's reachable tensors or plain settings change
(:func:`module_fingerprint`).
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import grad_and_value

from fl_lightning.core.messages import first_line
from fl_lightning.core.stacked_sgd import SGDSettings, clip_per_client, sgd_step

log = logging.getLogger(__name__)

#: ``Federation(step_capture=...)``: how the batched engine runs its stacked step.
CAPTURE_MODES = ("auto", "graph", "compile", "static", "off")

#: Batch shapes besides the first a built step keeps a recording for (:meth:`CapturedStep.for_batch`).
MAX_SIBLINGS = 4

#: A stacked loss: ``(params, buffers, attrs, x, y) -> [K]`` losses (``vmap`` of the method's ``client_loss``).
StackedLoss = Callable[[dict[str, Tensor], dict[str, Tensor], list[Tensor], Tensor, Tensor], Tensor]
#: A stacked gradient transform: ``(grads, attrs) -> grads`` (``vmap`` of the method's ``local_gradient``).
StackedGradient = Callable[[list[Tensor], list[Tensor]], list[Tensor]]


def resolve_capture(mode: str, device: torch.device) -> str:
    """The mode a fit runs: ``auto`` is ``graph`` on a CUDA device and ``off`` elsewhere.

    Raises:
        ValueError: an unknown mode, or ``graph`` on a device that is not CUDA.
    """
    if mode not in CAPTURE_MODES:
        raise ValueError(f"step_capture must be one of {', '.join(CAPTURE_MODES)}, got {mode!r}")
    if mode == "auto":
        return "graph" if device.type == "cuda" else "off"
    if mode == "graph" and device.type != "cuda":
        raise ValueError(
            f"step_capture=graph records a CUDA graph and this fit runs on {device.type}; "
            "use step_capture=static (the same step, not recorded) or auto"
        )
    return mode


@dataclass
class StepState:
    """The tensors one stacked step reads and writes in place; their addresses stay fixed across steps and rounds."""

    #: Stacked trainable parameters ``[K, ...]`` (leaves that require grad), by name.
    params: dict[str, Tensor]
    #: Stacked buffers (BatchNorm statistics) and frozen parameters, by name.
    buffers: dict[str, Tensor]
    #: The clients' stacked attribute tensors (:func:`~fl_lightning.core.stacking.stack_attributes`).
    attrs: list[Tensor]
    #: SGD momentum per stepped parameter (the names in ``used``, in that order).
    momentum: list[Tensor]
    #: ``()`` bool: no step has been taken yet (momentum starts as the first step's direction, as in SGD).
    first: Tensor
    #: ``()`` int64: steps taken so far in the round.
    counter: Tensor
    #: ``[K]`` int64: each client's local steps this round (a client is done once ``counter`` reaches it).
    steps: Tensor
    #: ``[K]`` float64: each client's summed loss over its steps.
    loss_sums: Tensor
    #: The step's inputs ``[K, B, ...]`` and labels ``[K, B]``, copied in before each step.
    x: Tensor
    y: Tensor

    def tensors(self) -> tuple[Any, ...]:
        """The state as the step function's arguments (:func:`make_step`), in field order."""
        return tuple(getattr(self, f.name) for f in fields(self))

    def clone(self) -> StepState:
        """A copy to try the step on without touching this state."""

        def c(value: Any) -> Any:
            if isinstance(value, dict):
                return {n: c(t) for n, t in value.items()}
            if isinstance(value, list):
                return [c(t) for t in value]
            return value.detach().clone().requires_grad_(value.requires_grad)

        return StepState(*(c(value) for value in self.tensors()))


def allocate_state(
    params: Mapping[str, Tensor],
    buffers: Mapping[str, Tensor],
    attrs: Sequence[Tensor],
    used: Sequence[str],
    x: Tensor,
    y: Tensor,
) -> StepState:
    """Static tensors shaped like the given stacked state and one step's inputs (``x``: ``[K, B, ...]``)."""
    k = x.shape[0]
    device = x.device

    def like(t: Tensor) -> Tensor:
        return torch.zeros_like(t, memory_format=torch.contiguous_format)

    return StepState(
        params={n: like(p).requires_grad_(True) for n, p in params.items()},
        buffers={n: like(b) for n, b in buffers.items()},
        attrs=[like(a) for a in attrs],
        momentum=[like(params[n]) for n in used],
        first=torch.ones((), dtype=torch.bool, device=device),
        counter=torch.zeros((), dtype=torch.int64, device=device),
        steps=torch.zeros(k, dtype=torch.int64, device=device),
        loss_sums=torch.zeros(k, dtype=torch.float64, device=device),
        x=like(x),
        y=like(y),
    )


def make_step(
    loss_fn: StackedLoss,
    names: Sequence[str],
    used: Sequence[str],
    sgd: SGDSettings,
    clip_grad_norm: float | None,
    gradient_fn: StackedGradient | None = None,
    autocast: tuple[str, torch.dtype] | None = None,
) -> Callable[..., None]:
    """One stacked local step over a :class:`StepState`'s tensors (its :meth:`~StepState.tensors`), all in place.

    Clients with ``steps <= counter`` are done: their loss counts zero, their weights and statistics are kept. The
    gradient is taken with respect to the ``used`` parameters (those the loss reaches; ``torch.optim.SGD`` skips the
    others); ``gradient_fn`` (a method's ``local_gradient``) sees every parameter's, as in the sequential step.
    ``autocast``: the device type and dtype of the fit's autocast, re-entered with its weight cache off (a cache
    filled outside a graph's capture would be read by every replay).
    """
    names, used = list(names), list(used)
    if gradient_fn is not None and used != names:
        raise ValueError("a local_gradient transform needs every parameter stepped")

    def step(
        params: dict[str, Tensor],
        buffers: dict[str, Tensor],
        attrs: list[Tensor],
        momentum: list[Tensor],
        first: Tensor,
        counter: Tensor,
        steps: Tensor,
        loss_sums: Tensor,
        x: Tensor,
        y: Tensor,
    ) -> None:
        keep = steps > counter
        frozen = {n: params[n].detach() for n in names if n not in used}
        saved = [b.clone() for b in buffers.values()]

        def total(trained: dict[str, Tensor], buffers_: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
            ctx = (
                torch.autocast(autocast[0], dtype=autocast[1], cache_enabled=False)
                if autocast is not None
                else contextlib.nullcontext()
            )
            with ctx:
                losses = loss_fn({**trained, **frozen}, buffers_, attrs, x, y)
            losses = torch.where(keep, losses, torch.zeros((), dtype=losses.dtype, device=losses.device))
            return losses.sum(), losses

        # The buffers are an argument (not differentiated) so that BatchNorm may update them in place.
        found, (_, losses) = grad_and_value(total, argnums=0, has_aux=True)({n: params[n] for n in used}, buffers)
        with torch.no_grad():
            for b, old in zip(buffers.values(), saved, strict=True):  # a done client's statistics are its own
                b.copy_(torch.where(keep.view(-1, *([1] * (b.dim() - 1))), b, old))
            loss_sums.add_(losses.detach().double())
            grads = [found[n] for n in used]
            if gradient_fn is not None:
                grads = list(gradient_fn(grads, attrs))
            if clip_grad_norm is not None:
                clip_per_client(grads, clip_grad_norm)
            if used:
                sgd_step([params[n] for n in used], grads, list(momentum), sgd, keep, first=first)
            first.fill_(False)
            counter.add_(1)

    return step


def reached_parameters(
    loss_fn: StackedLoss,
    params: Mapping[str, Tensor],
    buffers: Mapping[str, Tensor],
    attrs: Sequence[Tensor],
    x: Tensor,
    y: Tensor,
) -> list[str]:
    """The parameters the loss reaches on a batch like ``x`` (it runs once on copies of the buffers)."""
    leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    copies = {n: b.clone() for n, b in buffers.items()}
    losses = loss_fn(leaves, copies, list(attrs), x, y)
    found = torch.autograd.grad(losses.sum(), list(leaves.values()), allow_unused=True)
    return [n for n, g in zip(leaves, found, strict=True) if g is not None]


class CapturedStep:
    """A built step: its static :class:`StepState` and how it runs (``graph``, ``compile`` or ``static``).

    ``graph`` runs the first ``warmup`` steps as plain calls on a side stream (CUDA's rule before a capture), then
    records the step into a CUDA graph and from then on replays it. ``compile`` compiles the step whole
    (``torch.compile(fullgraph=True)``: fewer, fused kernels) and on a CUDA device records the compiled step the same
    way. A capture that fails (the step syncs with the host, or does an operation a graph cannot hold) leaves the
    state untouched: the step then runs unrecorded and :attr:`note` says why. A batch of another shape (every
    client's short last batch) runs a sibling step on the same state (:meth:`for_batch`).
    """

    def __init__(
        self,
        fn: Callable[..., None],
        state: StepState,
        mode: str,
        used: Sequence[str],
        warmup: int = 2,
        compile_backend: str = "inductor",
        sgd: SGDSettings | None = None,
    ) -> None:
        if mode not in ("graph", "compile", "static"):
            raise ValueError(f"a captured step runs as graph, compile or static, got {mode!r}")
        self.fn, self.state, self.mode, self.warmup = fn, state, mode, warmup
        self.compile_backend = compile_backend
        #: The SGD settings ``fn`` was made with (:meth:`retarget` changes them).
        self.sgd = sgd
        #: The parameters the step updates (those the loss reaches), in the order of ``state.momentum``.
        self.used = list(used)
        self.run = self._runner(fn)
        #: Whether the step is recorded as a CUDA graph (``graph``, and ``compile`` on a CUDA device).
        self.records = mode == "graph" or (mode == "compile" and state.x.is_cuda)
        self.graph: Any = None
        self.calls = 0
        #: Why the step runs uncaptured after all (``None``: it runs as its mode says).
        self.note: str | None = None
        #: Steps for other batch shapes sharing this one's state (:meth:`for_batch`), least recently used first.
        self.siblings: OrderedDict[tuple[tuple[int, ...], ...], CapturedStep] = OrderedDict()

    def _runner(self, fn: Callable[..., None]) -> Callable[..., None]:
        """What runs ``fn``: itself, or in mode ``compile`` its compiled whole."""
        return torch.compile(fn, fullgraph=True, backend=self.compile_backend) if self.mode == "compile" else fn

    def retarget(self, fn: Callable[..., None], sgd: SGDSettings) -> None:
        """Run ``fn``, the same step made with other SGD settings (a round's decayed learning rate), on this state.

        A recorded step is recorded again: in mode ``graph`` at its next call, without warm-up steps (its kernels have
        run); in mode ``compile`` after its warm-up steps, the first of which compiles the new function (a compilation
        cannot run inside a recording). Its siblings follow. The state, and with it what the step baked in from the
        module, stays.
        """
        self.fn, self.sgd = fn, sgd
        self.run = self._runner(fn)
        if self.graph is not None:
            self.graph = None
            self.calls = self.warmup if self.mode == "graph" else 0
        for sibling in self.siblings.values():
            sibling.retarget(fn, sgd)

    def for_batch(self, x: Tensor, y: Tensor) -> CapturedStep | None:
        """The step for batches shaped like one client's ``x`` and ``y``: this one, or a sibling sharing its state.

        A sibling has input slots of the new shape (every client's short last batch at once) and its own recording; it
        is kept for the next rounds.

        ``None`` in mode ``compile``, where a new shape would compile the step again.
        """
        shape = (tuple(x.shape), tuple(y.shape))
        if shape == (tuple(self.state.x.shape[1:]), tuple(self.state.y.shape[1:])):
            return self
        if self.mode == "compile" or x.dtype != self.state.x.dtype or y.dtype != self.state.y.dtype:
            return None
        sibling = self.siblings.get(shape)
        if sibling is not None:
            self.siblings.move_to_end(shape)
            return sibling
        k, device = self.state.x.shape[0], self.state.x.device
        state = replace(
            self.state,
            x=torch.zeros((k, *shape[0]), dtype=x.dtype, device=device),
            y=torch.zeros((k, *shape[1]), dtype=y.dtype, device=device),
        )
        sibling = CapturedStep(self.fn, state, self.mode, self.used, self.warmup, self.compile_backend, self.sgd)
        self.siblings[shape] = sibling
        while len(self.siblings) > MAX_SIBLINGS:
            self.siblings.popitem(last=False)
        return sibling

    def load(
        self,
        params: Mapping[str, Tensor],
        buffers: Mapping[str, Tensor],
        attrs: Sequence[Tensor],
        steps: Sequence[int],
    ) -> None:
        """Start a round: copy in the clients' starting weights, statistics and attributes; reset the rest."""
        s = self.state
        with torch.no_grad():
            for name, p in params.items():
                s.params[name].copy_(p)
            for name, b in buffers.items():
                s.buffers[name].copy_(b)
            for a, value in zip(s.attrs, attrs, strict=True):
                a.copy_(value)
            for buf in s.momentum:
                buf.zero_()
            s.first.fill_(True)
            s.counter.zero_()
            s.steps.copy_(torch.tensor(list(steps), dtype=torch.int64), non_blocking=True)
            s.loss_sums.zero_()

    def __call__(self) -> None:
        """Take one step on the batch in the state's input slots."""
        if not self.records or self.note is not None:
            self.run(*self.state.tensors())
            return
        if self.graph is not None:
            self.graph.replay()
            return
        if self.calls < self.warmup:
            self.calls += 1
            self._warm_up()
            return
        try:
            graph = self._record()
        except Exception as err:  # noqa: BLE001 - not capturable: run the same step unrecorded, and say why
            first = first_line(err)
            self.note = f"the stacked step could not be captured as a CUDA graph ({type(err).__name__}: {first[:160]})"
            self.run(*self.state.tensors())
            return
        self.graph = graph
        graph.replay()  # capturing records the step; replaying takes it

    def _warm_up(self) -> None:
        """One step on a side stream (before a capture, CUDA's libraries must have run once off the capture)."""
        with torch.cuda.device(self.state.x.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.run(*self.state.tensors())
            torch.cuda.current_stream().wait_stream(side)

    def _record(self) -> Any:
        """The step recorded as a CUDA graph (recording runs nothing: the state is as it was).

        The capture restricts only this thread (``thread_local``): under the default (``global``) a DataLoader's
        pin-memory thread allocating pinned memory during the capture would invalidate it and fail that thread.
        """
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(self.state.x.device), torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.run(*self.state.tensors())
        return graph


def module_fingerprint(module: nn.Module, per_client: Sequence[str] = ()) -> tuple[Hashable, ...]:
    """What a built step bakes in from ``module``: its tensors' addresses and its public plain settings' values.

    A step reads the module's tensors where they were when it was built (the teacher's weights, a method's own
    tensors) and its plain attributes (``beta``, ``tau``) as constants; a change to either means a rebuild. Tensors
    changed in place are read afresh by every step and need none. Private attributes (``_name``) are not watched,
    nor the ``per_client`` ones (a method's ``client_attributes`` and ``client``), which every stack copies in.
    """
    skip = set(per_client) | {"client"}
    out: list[Hashable] = []
    for name, t in module.state_dict(keep_vars=True).items():
        out.append((name, t.data_ptr()))
    for key in sorted(module.__dict__):
        if key in skip or (key.startswith("_") and key != "_teacher_store"):
            continue
        out.append((key, *_value_print(module.__dict__[key])))
    return tuple(out)


def _value_print(value: Any, depth: int = 0) -> tuple[Hashable, ...]:
    if isinstance(value, Tensor):
        return ("t", value.data_ptr(), tuple(value.shape), value.dtype)
    if isinstance(value, nn.Module):
        return ("m", *((n, t.data_ptr()) for n, t in value.state_dict(keep_vars=True).items()))
    if isinstance(value, bool | int | float | str | type(None)):
        return ("v", value)
    if depth < 3 and isinstance(value, list | tuple):
        return ("l", *(_value_print(v, depth + 1) for v in value))
    if depth < 3 and isinstance(value, Mapping):
        return ("d", *((str(k), _value_print(v, depth + 1)) for k, v in value.items()))
    return ("o", id(value))


class StepCache:
    """The built steps of one fit, kept across rounds (at most ``size``; the least recently used goes first).

    ``mode``: ``graph``, ``compile`` or ``static`` (:func:`resolve_capture`). ``on_note`` is told, once per reason,
    why a step runs uncaptured or on the engine's per-step path. ``compile_backend``: ``torch.compile``'s backend in
    mode ``compile``.
    """

    def __init__(
        self,
        mode: str,
        size: int = 4,
        on_note: Callable[[str], None] | None = None,
        compile_backend: str = "inductor",
    ) -> None:
        if mode not in ("graph", "compile", "static"):
            raise ValueError(f"a step cache runs graph, compile or static steps, got {mode!r}")
        self.mode, self.size, self.on_note, self.compile_backend = mode, size, on_note, compile_backend
        self._steps: OrderedDict[Hashable, tuple[tuple[Hashable, ...], CapturedStep]] = OrderedDict()
        self._refused: dict[Hashable, str] = {}
        #: What was said (:meth:`note`), in order: why steps ran uncaptured.
        self.notes: list[str] = []
        #: Steps built so far (a rebuild counts): rounds after the first should reuse theirs.
        self.builds = 0

    def note(self, reason: str) -> None:
        """Say ``reason`` once."""
        if reason not in self.notes:
            self.notes.append(reason)
            log.info("%s", reason)
            if self.on_note is not None:
                self.on_note(reason)

    def get(
        self, key: Hashable, fingerprint: tuple[Hashable, ...], build: Callable[[], CapturedStep]
    ) -> CapturedStep | None:
        """The step built for ``key`` (rebuilt if ``fingerprint`` changed); ``None`` where it cannot be built."""
        if key in self._refused:
            return None
        entry = self._steps.get(key)
        if entry is not None and entry[0] == fingerprint:
            self._steps.move_to_end(key)
            return entry[1]
        self._steps.pop(key, None)
        try:
            step = build()
        except Exception as err:  # noqa: BLE001 - the loss cannot run as a static step: the per-step path runs it
            first = first_line(err)
            reason = (
                f"the stacked step runs uncaptured: it cannot run as one function ({type(err).__name__}: {first[:160]})"
            )
            self._refused[key] = reason
            self.note(reason)
            return None
        self.builds += 1
        self._steps[key] = (fingerprint, step)
        while len(self._steps) > self.size:
            self._steps.popitem(last=False)
        return step

    def __iter__(self) -> Iterator[CapturedStep]:
        return iter(step for _, step in self._steps.values())

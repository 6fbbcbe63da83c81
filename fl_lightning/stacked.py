"""The stacked local update: a group of clients trains together, as one model stacked along a client axis.

Simulated FL with the papers' small networks is dominated by per-operation overhead: ten clients one after another
dispatch ten times the kernels of one stacked step. Here the K clients of a stack hold their weights stacked
(``[K, ...]`` per parameter, :func:`~fl_lightning.core.stacking.stacked_state`); each local step runs the method's
own :meth:`~fl_lightning.FedAvg.client_loss` once, under :func:`torch.func.vmap` over
:func:`torch.func.functional_call`, takes the gradient of the summed losses (the clients are independent, so this is
each client's own gradient) and applies SGD (momentum, dampening, Nesterov, weight decay, gradient clipping) per
client (:mod:`~fl_lightning.core.stacked_sgd`). A client with fewer steps stops: its later steps are masked. A short
last batch is padded to the full batch with weight-0 samples where the loss is a mean over samples.

:func:`train_stacked` needs no Trainer; :class:`~fl_lightning.batched.BatchedClients` runs it for the
:class:`~fl_lightning.Federation` callback with ``engine="batched"``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from fl_lightning.core.augment import BatchTransform
from fl_lightning.core.stacked_conv import lowered_convolutions
from fl_lightning.core.stacked_sgd import SGDSettings, clip_per_client, sgd_step
from fl_lightning.core.stacking import (
    ClientRNG,
    StackedResult,
    attribute_structure,
    bind_leaves,
    bound_attributes,
    overrides,
    stack_attributes,
    stacked_state,
    swap_names,
    swap_state,
    tensor_aliases,
)
from fl_lightning.core.step_capture import (
    CapturedStep,
    StackedGradient,
    StackedLoss,
    StepCache,
    allocate_state,
    make_step,
    module_fingerprint,
    reached_parameters,
)
from fl_lightning.data import ClientBatches
from fl_lightning.module import FedAvg, FederatedHooks, has_batch_norm


@dataclass
class StackedClient:
    """One client of a stack: its local batches, step count, per-client attributes and random stream."""

    batches: Iterator[tuple[Tensor, Tensor]]
    steps: int
    attributes: dict[str, Any] = field(default_factory=dict)
    rng: ClientRNG | None = None
    #: The client's data, batch positions and (deterministic) transform, when its batches may be gathered together
    #: with other clients' in one indexing and one transform per step (``None``: read ``batches`` one by one).
    source: ClientBatches | None = None


class _ClientLoss(nn.Module):
    """Calls the method's ``client_loss``, so that :func:`functional_call` can swap the method's weights."""

    def __init__(self, method: FedAvg) -> None:
        super().__init__()
        self.m = method

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.m.client_loss(x, y)


def _local_loss(
    module: FedAvg, wrapper: _ClientLoss, template: Mapping[str, Any], conv: str = "grouped"
) -> Callable[[dict[str, Tensor], dict[str, Tensor], list[Tensor], Tensor, Tensor], Tensor]:
    names = swap_names(module)  # once, outside the traced step: it walks every module

    def loss(
        params: dict[str, Tensor], buffers: dict[str, Tensor], attrs: list[Tensor], x: Tensor, y: Tensor
    ) -> Tensor:
        # {**a, **b}, not a | b: torch 2.6's compile could not trace a dict union (the step compiles whole)
        state = swap_state({**params, **buffers}, names, prefix="m.")
        with bound_attributes(module, bind_leaves(template, attrs)), lowered_convolutions(conv):
            return functional_call(wrapper, state, (x, y), tie_weights=False)

    return loss


def pads_short_batches(module: FedAvg) -> bool:
    """Whether a short last batch can join its step's stacked call, padded to the full batch with weight-0 samples.

    It can when the loss is a mean over samples of per-sample terms, plus terms that do not depend on the batch
    (declared by the class that defines ``client_loss``: ``sample_mean_loss = True``; a subclass that overrides
    ``client_loss`` must declare it again), and the network has no BatchNorm layer (whose batch statistics mix the
    samples). Other layers that mix a batch's samples are not detected: a network with one must not be used with a
    loss declared ``sample_mean_loss``.
    """
    owner = next(c for c in type(module).__mro__ if "client_loss" in c.__dict__)
    if not owner.__dict__.get("sample_mean_loss", False):
        return False
    return not has_batch_norm(module)


def _sample_weighted(
    loss: Callable[[dict[str, Tensor], dict[str, Tensor], list[Tensor], Tensor, Tensor], Tensor],
) -> Callable[..., Tensor]:
    """``loss`` as the ``w``-weighted mean of its per-sample values: Σ_i w_i·L(x_i, y_i) / max(Σ_i w_i, 1).

    For a loss that is a mean over samples (:func:`pads_short_batches`) and 0/1 weights this is the loss of the
    weight-1 samples alone, whatever the weight-0 ones hold.
    """

    def weighted(
        params: dict[str, Tensor], buffers: dict[str, Tensor], attrs: list[Tensor], x: Tensor, y: Tensor, w: Tensor
    ) -> Tensor:
        def one(xi: Tensor, yi: Tensor) -> Tensor:
            return loss(params, buffers, attrs, xi.unsqueeze(0), yi.unsqueeze(0))

        per_sample = vmap(one, randomness="error")(x, y)
        zero = torch.zeros((), dtype=per_sample.dtype, device=per_sample.device)
        return torch.where(w > 0, per_sample * w, zero).sum() / w.sum().clamp_min(1)

    return weighted


def _local_gradient(
    module: FedAvg, template: Mapping[str, Any]
) -> Callable[[list[Tensor], list[Tensor]], list[Tensor]]:
    def gradient(grads: list[Tensor], attrs: list[Tensor]) -> list[Tensor]:
        with bound_attributes(module, bind_leaves(template, attrs)):
            return list(module.local_gradient(list(grads)))

    return gradient


def train_stacked(
    module: FedAvg,
    clients: Sequence[StackedClient],
    sgd: SGDSettings,
    clip_grad_norm: float | None = None,
    on_step: Callable[[int], None] | None = None,
    pad: bool | None = None,
    augment: BatchTransform | None = None,
    capture: StepCache | None = None,
    conv: str = "grouped",
) -> StackedResult:
    """Train ``clients`` together from the module's current weights; the module itself is left unchanged.

    Every client's attributes must have the same structure (:func:`~fl_lightning.core.stacking.stack_attributes`).
    Step ``i`` trains the clients with more than ``i`` steps. The clients whose batch has the common (full) shape run
    in one call; a client with another batch shape at that step (a short last batch) joins that call padded with
    weight-0 samples where the loss allows it (:func:`pads_short_batches`) and autocast is off, else runs in its own.
    The full-shape call covers every client of the stack, the others masked (their loss counts zero and their
    BatchNorm statistics are put back), when ``pad`` is true (default: on a GPU, or when at least three quarters of
    the clients take a full batch); else it selects the full-batch clients. ``on_step(n)`` is told how many client
    steps each stacked step took.
    ``augment``: the datamodule's transform, so that clients with random batches (``rng``) are gathered too.
    ``capture``: run every step in which each client still training takes a batch of one shape (a full batch, or
    all of them their short last one) as one built step (:mod:`~fl_lightning.core.step_capture`: a replayed CUDA
    graph, a compiled or a plain function of static tensors, kept in the cache across rounds), the round's batches
    read ahead (:data:`GATHER_AHEAD_BYTES`); the other steps run as described above, on the same tensors.
    ``conv``: how the stacked 2-d convolutions are computed (:data:`~fl_lightning.core.stacked_conv.STACKED_CONVS`).
    """
    k = len(clients)
    template, attr_stack = stack_attributes([c.attributes for c in clients])
    params, buffers = stacked_state(module, k)
    names = list(params)
    wrapper = _ClientLoss(module)
    plain_loss = _local_loss(module, wrapper, template, conv)
    loss_fn = vmap(plain_loss, randomness="error")
    device = next(iter(params.values())).device if params else torch.device("cpu")
    # Padding runs the loss under a second, per-sample vmap. Under CUDA autocast that nesting hands a convolution a
    # bf16 input with its float32 bias (RuntimeError, seen with torch 2.11 on an H200), so under autocast a short
    # batch runs in its own call instead: the same step, one more launch.
    pads = pads_short_batches(module) and not torch.is_autocast_enabled(device.type)
    weighted_fn = vmap(_sample_weighted(plain_loss), randomness="error") if pads else None
    pad_index: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}  # (n, B) -> positions filling n samples to B, weights
    gradient_fn = (
        vmap(_local_gradient(module, template), randomness="error")
        if overrides(module, "local_gradient", FederatedHooks)
        else None
    )
    momentum_buffers: list[Tensor | None] = [None] * len(names)
    steps = [c.steps for c in clients]
    loss_sums = torch.zeros(k, dtype=torch.float64, device=device)
    gather = _Gather.of(clients, augment, GATHER_AHEAD_BYTES if capture is not None else 0)
    steps_on_device = torch.tensor(steps, device=device)
    runner: CapturedStep | None = None  # the built step this call runs, once a step fits it
    slots: list[int] = []  # where each of the runner's momentum buffers sits in momentum_buffers
    capturing = capture is not None and bool(params)  # until the cache refuses this stack's step
    for i in range(max(steps, default=0)):
        active = [j for j in range(k) if steps[j] > i]
        joined: tuple[Tensor, Tensor] | None = None
        if gather is not None:
            joined, sizes = gather.joined(i, active)
            batches = dict(zip(active, zip(joined[0].split(sizes), joined[1].split(sizes), strict=True), strict=True))
        else:
            batches = _read(clients, active)
        full_shape = max((tuple(batches[j][0].shape) for j in active), key=lambda shape: shape[0])
        full = [j for j in active if tuple(batches[j][0].shape) == full_shape]
        short: dict[tuple, list[int]] = {}
        for j in active:
            if j not in full:
                short.setdefault(tuple(batches[j][0].shape), []).append(j)
        if capture is not None and capturing and not short:
            if runner is None:
                runner = _built_step(
                    capture,
                    module,
                    loss_fn,
                    gradient_fn,
                    template,
                    attr_stack,
                    params,
                    buffers,
                    batches,
                    active,
                    sgd,
                    clip_grad_norm,
                    device,
                    conv,
                )
                capturing = runner is not None
                if runner is not None:  # from now on the step's static tensors are the clients' state
                    slots = [names.index(name) for name in runner.used]
                    _adopt(
                        runner, params, buffers, attr_stack, steps, [momentum_buffers[n] for n in slots], loss_sums, i
                    )
                    params, buffers, loss_sums = runner.state.params, runner.state.buffers, runner.state.loss_sums
            step = runner.for_batch(*batches[active[0]]) if runner is not None else None
            if step is not None:  # every client's batch has one shape: the built step, or its sibling for the shape
                _fill(step, batches, active, joined, k)
                step()
                if step.note is not None:
                    capture.note(step.note)
                if on_step is not None:
                    on_step(len(active))
                continue
        if runner is not None:  # it has stepped (it runs once built): this step's SGD updates its momentum in place
            for n, buf in zip(slots, runner.state.momentum, strict=True):
                momentum_buffers[n] = buf
        sample_w: dict[int, Tensor] | None = None
        if weighted_fn is not None and short and len(active) > 1 and all(s[1:] == full_shape[1:] for s in short):
            # Short batches padded to the full one (their own samples repeated, weight 0): one call for the step.
            b_full = full_shape[0]
            if (b_full, b_full) not in pad_index:
                pad_index[(b_full, b_full)] = (torch.arange(b_full, device=device), torch.ones(b_full, device=device))
            ones = pad_index[(b_full, b_full)][1]
            sample_w = {j: ones for j in full}
            for j in (j for members in short.values() for j in members):
                xj, yj = batches[j]
                n = len(yj)
                if (n, b_full) not in pad_index:
                    at = torch.arange(b_full, device=device)
                    pad_index[(n, b_full)] = (at % n, (at < n).to(ones.dtype))
                fill, sample_w[j] = pad_index[(n, b_full)]
                batches[j] = (xj[fill], yj[fill])
            full, short = list(active), {}
        padded = pad if pad is not None else device.type == "cuda" or 4 * len(full) >= 3 * k
        stack = [params[n] for n in names]
        grads: list[Tensor] | None = None
        reached = [False] * len(names)  # a parameter no loss reaches is not stepped (torch.optim.SGD skips it)
        calls = [(full, padded)] + [(members, False) for members in short.values()]
        for members, whole in calls:
            weighted = sample_w is not None and members is full
            if whole or len(members) == k:  # every client of the stack in one call, those not in it masked
                filler = batches[members[0]]
                x = torch.stack([batches[j][0] if j in members else filler[0] for j in range(k)])
                y = torch.stack([batches[j][1] if j in members else filler[1] for j in range(k)])
                saved = [b.clone() for b in buffers.values()] if len(members) < k and buffers else None
                if weighted:
                    assert sample_w is not None and weighted_fn is not None
                    zeros = torch.zeros_like(sample_w[members[0]])
                    w = torch.stack([sample_w[j] if j in members else zeros for j in range(k)])
                    losses = weighted_fn(params, buffers, attr_stack, x, y, w)
                else:
                    losses = loss_fn(params, buffers, attr_stack, x, y)
                keep = None
                if len(members) < k:  # where, not a product: a masked client's non-finite loss must not leak
                    keep = _on(device, [j in members for j in range(k)])
                    losses = torch.where(keep, losses, torch.zeros((), dtype=losses.dtype, device=device))
                loss_sums += losses.detach().double()
                found = torch.autograd.grad(losses.sum(), stack, allow_unused=True)
                reached = [r or g is not None for r, g in zip(reached, found, strict=True)]
                if saved is not None and keep is not None:  # after the backward, which reads the statistics
                    with torch.no_grad():  # the masked clients' BatchNorm statistics are theirs again
                        for b, old in zip(buffers.values(), saved, strict=True):
                            b.copy_(torch.where(keep.view(-1, *([1] * (b.dim() - 1))), b, old))
                filled = [torch.zeros_like(p) if g is None else g for p, g in zip(stack, found, strict=True)]
                grads = filled if grads is None else [g.add_(f) for g, f in zip(grads, filled, strict=True)]
                continue
            # A subset: its own leaves (copies of its clients' weights), whose gradients go back to their clients.
            if grads is None:
                grads = [torch.zeros_like(p) for p in stack]
            if len(members) == 1:  # one client: no vmap; BatchNorm updates land in the stacked statistics (views)
                j = members[0]
                leaves = {n: params[n][j].detach().requires_grad_() for n in names}
                loss = plain_loss(
                    leaves, {n: b[j] for n, b in buffers.items()}, [a[j] for a in attr_stack], *batches[j]
                )
                found = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
                reached = [r or g is not None for r, g in zip(reached, found, strict=True)]
                with torch.no_grad():
                    for g, f in zip(grads, found, strict=True):
                        if f is not None:
                            g[j].add_(f)
                loss_sums[j] += loss.detach().double()
                continue
            idx = _on(device, members)
            leaves = {n: params[n].index_select(0, idx).detach().requires_grad_() for n in names}
            sub_buffers = {n: b.index_select(0, idx) for n, b in buffers.items()}
            x = torch.stack([batches[j][0] for j in members])
            y = torch.stack([batches[j][1] for j in members])
            sub_attrs = [a.index_select(0, idx.to(a.device)) for a in attr_stack]
            if weighted:
                assert sample_w is not None and weighted_fn is not None
                w = torch.stack([sample_w[j] for j in members])
                losses = weighted_fn(leaves, sub_buffers, sub_attrs, x, y, w)
            else:
                losses = loss_fn(leaves, sub_buffers, sub_attrs, x, y)
            found = torch.autograd.grad(losses.sum(), list(leaves.values()), allow_unused=True)
            reached = [r or g is not None for r, g in zip(reached, found, strict=True)]
            with torch.no_grad():
                for name, b in buffers.items():  # a network's buffer updates (BatchNorm statistics) go back to them
                    b.index_copy_(0, idx, sub_buffers[name])
                for g, f in zip(grads, found, strict=True):
                    if f is not None:
                        g.index_add_(0, idx, f)
            loss_sums.index_add_(0, idx, losses.detach().double())
        assert grads is not None
        if gradient_fn is not None:
            grads = gradient_fn(grads, attr_stack)
        mask = None
        if len(active) < k:
            mask = steps_on_device > i
        if gradient_fn is not None:
            reached = [True] * len(names)  # local_gradient gives every parameter a gradient, as in local_step
        used = [n for n, r in enumerate(reached) if r]
        with torch.no_grad():
            if clip_grad_norm is not None:
                clip_per_client([grads[n] for n in used], clip_grad_norm)
            buffers_used = [momentum_buffers[n] for n in used]
            if used:
                sgd_step([stack[n] for n in used], [grads[n] for n in used], buffers_used, sgd, mask)
            for n, momentum in zip(used, buffers_used, strict=True):
                momentum_buffers[n] = momentum
            if runner is not None:  # the built step's counter follows the step taken here
                runner.state.counter.add_(1)
        if on_step is not None:
            on_step(len(active))
    sums = loss_sums.cpu().tolist()
    losses_out = [sums[j] / steps[j] if steps[j] else 0.0 for j in range(k)]
    if runner is not None:  # the static tensors are the next round's: hand back copies
        return StackedResult(
            {n: p.detach().clone() for n, p in params.items()},
            {n: b.clone() for n, b in buffers.items()},
            losses_out,
            tensor_aliases(module),
        )
    return StackedResult({n: p.detach() for n, p in params.items()}, buffers, losses_out, tensor_aliases(module))


def _built_step(
    cache: StepCache,
    module: FedAvg,
    loss_fn: StackedLoss,
    gradient_fn: StackedGradient | None,
    template: Mapping[str, Any],
    attr_stack: list[Tensor],
    params: dict[str, Tensor],
    buffers: dict[str, Tensor],
    batches: Mapping[int, tuple[Tensor, Tensor]],
    active: Sequence[int],
    sgd: SGDSettings,
    clip_grad_norm: float | None,
    device: torch.device,
    conv: str = "grouped",
) -> CapturedStep | None:
    """The cache's step for this stack and batch shape, built (tried once on copies of the state) if need be.

    ``loss_fn`` and ``gradient_fn``: the stack's stacked loss and ``local_gradient`` (``None``: not overridden).
    """
    k = next(iter(params.values())).shape[0]
    x0, y0 = batches[active[0]]
    autocast = (device.type, torch.get_autocast_dtype(device.type)) if torch.is_autocast_enabled(device.type) else None
    key = (
        id(module),
        k,
        tuple((n, tuple(p.shape), p.dtype) for n, p in params.items()),
        tuple((n, tuple(b.shape), b.dtype) for n, b in buffers.items()),
        attribute_structure(dict(template)),
        tuple((tuple(a.shape), a.dtype) for a in attr_stack),
        (tuple(x0.shape), x0.dtype, tuple(y0.shape), y0.dtype),
        replace(sgd, lr=0.0),  # a new learning rate (a schedule's) retargets the built step below
        clip_grad_norm,
        autocast,
        gradient_fn is not None,
        module.training,
        str(device),
        conv,
    )

    def build() -> CapturedStep:
        x = torch.stack([batches[j][0] for j in range(k)]) if len(active) == k else x0.expand(k, *x0.shape)
        y = torch.stack([batches[j][1] for j in range(k)]) if len(active) == k else y0.expand(k, *y0.shape)
        names = list(params)
        used = names if gradient_fn is not None else reached_parameters(loss_fn, params, buffers, attr_stack, x, y)
        fn = make_step(loss_fn, names, used, sgd, clip_grad_norm, gradient_fn, autocast)
        step = CapturedStep(
            fn,
            allocate_state(params, buffers, attr_stack, used, x, y),
            cache.mode,
            used,
            compile_backend=cache.compile_backend,
            sgd=sgd,
        )
        trial = step.state.clone()
        with torch.no_grad():
            for name, p in params.items():
                trial.params[name].copy_(p)
            trial.x.copy_(x)
            trial.y.copy_(y)
        step.run(*trial.tensors())  # a loss the step cannot hold fails here, before any real step
        return step

    step = cache.get(key, module_fingerprint(module, module.client_attributes), build)
    if step is not None and step.sgd != sgd:
        step.retarget(make_step(loss_fn, list(params), step.used, sgd, clip_grad_norm, gradient_fn, autocast), sgd)
    return step


def _adopt(
    runner: CapturedStep,
    params: Mapping[str, Tensor],
    buffers: Mapping[str, Tensor],
    attr_stack: Sequence[Tensor],
    steps: Sequence[int],
    held: Sequence[Tensor | None],
    loss_sums: Tensor,
    taken: int,
) -> None:
    """Move the stack's state (``taken`` steps in; ``held``: the momentum of ``runner.used``) into its tensors."""
    runner.load(params, buffers, attr_stack, steps)
    state = runner.state
    with torch.no_grad():
        if any(b is not None for b in held):
            for buf, value in zip(state.momentum, held, strict=True):
                if value is not None:
                    buf.copy_(value)
            state.first.fill_(False)
        state.counter.fill_(taken)
        state.loss_sums.copy_(loss_sums)


def _fill(
    runner: CapturedStep,
    batches: Mapping[int, tuple[Tensor, Tensor]],
    active: Sequence[int],
    joined: tuple[Tensor, Tensor] | None,
    k: int,
) -> None:
    """Copy the step's batches into the static inputs (a done client's slot keeps its last batch: it is masked)."""
    x, y = runner.state.x, runner.state.y
    with torch.no_grad():
        if joined is not None and len(active) == k:
            x.view(-1, *x.shape[2:]).copy_(joined[0], non_blocking=True)
            y.view(-1, *y.shape[2:]).copy_(joined[1], non_blocking=True)
            return
        for j in active:
            x[j].copy_(batches[j][0], non_blocking=True)
            y[j].copy_(batches[j][1], non_blocking=True)


def _on(device: torch.device, values: list) -> Tensor:
    """``values`` as a tensor on ``device``, copied without waiting for the device (no stream synchronisation)."""
    return torch.tensor(values).to(device, non_blocking=True)


def _read(clients: Sequence[StackedClient], active: Sequence[int]) -> dict[int, tuple[Tensor, Tensor]]:
    """The next batch of each active client, each drawn from the client's own random stream."""
    out = {}
    for j in active:
        rng = clients[j].rng
        with rng.active() if rng is not None else contextlib.nullcontext():
            out[j] = next(clients[j].batches)
    return out


#: Bytes of transformed images a captured stack gathers ahead (:class:`_Gather`'s ``ahead``): a round's steps are
#: read and augmented a chunk at a time, so that between two replays of the step the host only copies the next batch
#: into its inputs. The chunk and its transform's temporaries (a few times this) count in the stack's measured peak
#: memory.
GATHER_AHEAD_BYTES = 32 * 2**20


class _Gather:
    """A step's batches of all its clients read with one indexing and one transform.

    With augmentation (a :class:`~fl_lightning.core.augment.BatchTransform` that augments), each client's random choices
    are drawn on its own stream, as the sequential engine draws them, and applied to every client's images at once.
    ``ahead`` (bytes, 0: off): read the batches of as many consecutive steps as fit at once, each client's choices
    for them drawn in one visit to its stream; the images and choices are the ones step-by-step reading gives.
    """

    def __init__(
        self, sources: Sequence[ClientBatches], augment: BatchTransform | None, rngs: list[ClientRNG], ahead: int = 0
    ) -> None:
        self.x = torch.cat([s.x for s in sources])
        self.y = torch.cat([s.y for s in sources])
        offsets = [0]
        for s in sources[:-1]:
            offsets.append(offsets[-1] + len(s.y))
        self.positions = [
            list((torch.cat(s.batches) + off).split([len(pos) for pos in s.batches])) if s.batches else []
            for s, off in zip(sources, offsets, strict=True)
        ]
        self.transform = sources[0].transform
        self.augment, self.rngs = augment, rngs
        self.ahead = ahead
        # The steps read ahead: [start, end), the images and labels, and each step's offset and clients' sizes.
        self._chunk: tuple[int, int, Tensor, Tensor, list[int], list[list[int]]] | None = None

    @classmethod
    def of(cls, clients: Sequence[StackedClient], augment: BatchTransform | None, ahead: int = 0) -> _Gather | None:
        """The gatherer of ``clients``' batches, or ``None`` where they must be read one by one."""
        sources = [c.source for c in clients]
        rngs = [c.rng for c in clients]
        if any(s is None for s in sources):
            return None
        if any(r is not None for r in rngs):
            if augment is None or any(r is None for r in rngs):
                return None
            return cls(sources, augment, rngs, ahead)  # type: ignore[arg-type]
        return cls(sources, None, [], ahead)  # type: ignore[arg-type]

    def joined(self, i: int, active: Sequence[int]) -> tuple[tuple[Tensor, Tensor], list[int]]:
        """The ``i``-th batches of the clients in ``active``, one after another in one tensor, and their sizes."""
        if self.ahead > 0:
            return self._ahead(i, active)
        parts = [self.positions[j][i] for j in active]
        return self._read(parts, {j: [len(p)] for j, p in zip(active, parts, strict=True)}), [len(p) for p in parts]

    def _read(self, parts: list[Tensor], draws: Mapping[int, list[int]]) -> tuple[Tensor, Tensor]:
        """The images at ``parts`` (concatenated), transformed; ``draws``: each client's batch sizes, in its order.

        Each client's choices are drawn in one visit to its stream; ``parts`` lists the batches in the order of the
        ``draws`` interleaved step by step (a step's clients in ``draws``' order).
        """
        idx = torch.cat(parts)
        x, y = self.x[idx], self.y[idx]
        if self.augment is not None:
            drawn: dict[int, list[dict[str, Tensor]]] = {}
            for j, sizes in draws.items():
                with self.rngs[j].active():
                    drawn[j] = [self.augment.draw(n, x.shape[-2:], x.device) for n in sizes]
            order = [drawn[j][s] for s in range(max(map(len, draws.values()))) for j in draws if s < len(drawn[j])]
            x = self.augment.apply(x, {key: torch.cat([d[key] for d in order]) for key in order[0]})
        elif self.transform is not None:
            x = self.transform(x)
        return x, y

    def _ahead(self, i: int, active: Sequence[int]) -> tuple[tuple[Tensor, Tensor], list[int]]:
        if self._chunk is None or not self._chunk[0] <= i < self._chunk[1]:
            self._chunk = self._read_ahead(i)
        start, _, x, y, offsets, sizes = self._chunk
        at, n = offsets[i - start], sizes[i - start]
        if len(n) != len(active):
            raise RuntimeError(f"step {i}: {len(active)} clients train, the batches read ahead hold {len(n)}")
        end = at + sum(n)
        return (x[at:end], y[at:end]), n

    def _read_ahead(self, start: int) -> tuple[int, int, Tensor, Tensor, list[int], list[list[int]]]:
        """Steps ``start`` onwards, as many as :attr:`ahead` bytes of transformed images hold (one at least)."""
        k = len(self.positions)
        per_sample = 4 * math.prod(self.x.shape[1:])  # the transformed images are float32
        last = max(len(p) for p in self.positions)
        end, total, offsets, sizes = start, 0, [], []
        while end < last:
            step = [len(self.positions[j][end]) for j in range(k) if len(self.positions[j]) > end]
            if end > start and (total + sum(step)) * per_sample > self.ahead:
                break
            offsets.append(total)
            sizes.append(step)
            total += sum(step)
            end += 1
        members = [j for j in range(k) if len(self.positions[j]) > start]
        draws = {j: [len(pos) for pos in self.positions[j][start:end]] for j in members}
        parts = [self.positions[j][s] for s in range(start, end) for j in members if s < len(self.positions[j])]
        x, y = self._read(parts, draws)
        if self.augment is not None:  # the global stream ends where step-by-step reading leaves it: the step's last
            with self.rngs[[j for j in members if len(self.positions[j]) >= end][-1]].active():
                pass
        return start, end, x, y, offsets, sizes

"""The batched engine: a round's clients take their local steps together, as one model stacked along a client axis.

Simulated FL with the papers' small networks is dominated by per-operation overhead: ten clients one after another
dispatch ten times the kernels of one stacked step. Here the K clients of a group hold their weights stacked
(``[K, ...]`` per parameter); each local step runs the method's own :meth:`~fl_lightning.FedAvg.client_loss` once,
under :func:`torch.func.vmap` over :func:`torch.func.functional_call`, takes the gradient of the summed losses (the
clients are independent, so this is each client's own gradient) and applies SGD (momentum, dampening, Nesterov,
weight decay, gradient clipping) per client. A client with fewer steps stops: its later steps are masked. A short
last batch is padded to the full batch with weight-0 samples where the loss is a mean over samples.

What a method computes per client in ``on_client_start`` and reads in ``client_loss`` is named in its
:attr:`~fl_lightning.module.FederatedHooks.client_attributes`; the engine stacks those attributes over the group and
binds each client's slice while its loss runs. Clients whose attributes differ in structure (FedDyn's first-time
clients without ``h_k``, FedKA's clients without anchors) are stacked separately, unless the method's
``align_client_attributes`` makes them one structure exactly (FedKA pads its anchor sets of different sizes and
weights the padding 0, except on a BatchNorm network).

:class:`BatchedClients` is the executor the :class:`~fl_lightning.Federation` callback uses with
``engine="batched"``; :func:`train_stacked` is the engine itself, usable without a Trainer.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from torch import Tensor, nn
from torch.func import functional_call, vmap

from fl_lightning.core.augment import BatchTransform
from fl_lightning.core.context import ClientContext
from fl_lightning.core.distributed import to_device
from fl_lightning.core.evaluation import Evaluation
from fl_lightning.core.rounds import RoundState, round_seed, seed_torch
from fl_lightning.core.state import ClientStateStore
from fl_lightning.data import ClientBatches, ClientGroup, FederatedDataModule
from fl_lightning.executor import SequentialClients
from fl_lightning.module import FedAvg, FederatedHooks, has_batch_norm

#: The engines a :class:`~fl_lightning.Federation` can run a round's local updates with.
ENGINES = ("sequential", "batched", "auto")
#: ``auto`` on a CPU: batched when a local batch holds at most this many input values (see :func:`auto_engine`).
AUTO_CPU_BATCH_VALUES = 8192


# ---- what the engine needs of a method ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SGDSettings:
    """The local optimizer, read from the module's ``torch.optim.SGD`` (its one parameter group)."""

    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    maximize: bool = False

    @classmethod
    def from_optimizer(cls, optimizer: torch.optim.Optimizer) -> SGDSettings:
        """The settings of ``optimizer``'s first parameter group."""
        group = optimizer.param_groups[0]
        return cls(
            lr=float(group["lr"]),
            momentum=float(group.get("momentum", 0.0)),
            dampening=float(group.get("dampening", 0.0)),
            weight_decay=float(group.get("weight_decay", 0.0)),
            nesterov=bool(group.get("nesterov", False)),
            maximize=bool(group.get("maximize", False)),
        )


def _overrides(module: nn.Module, name: str, base: type) -> bool:
    return getattr(type(module), name) is not getattr(base, name)


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
        if _overrides(module, hook, FedAvg):
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
    trainable = {id(p) for p in module.parameters() if p.requires_grad}
    if len(groups) != 1 or {id(p) for p in groups[0]["params"]} != trainable:
        return "its SGD has several parameter groups, or does not train every trainable parameter"
    return None


def network_refusal(module: FedAvg, sample: Tensor) -> str | None:
    """Why the module's network cannot run stacked under ``vmap`` on inputs like ``sample`` (``None``: it can)."""
    params, buffers = stacked_state(module, 2)
    was_training = module.training
    module.train()
    try:
        with torch.no_grad():
            vmap(lambda p, b, x: functional_call(module, {**p, **b}, (x,)), randomness="error")(
                params, buffers, sample.expand(2, 2, *sample.shape)
            )
    except Exception as err:  # noqa: BLE001 - any failure means: train it sequentially, and say why
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"its network cannot run under torch.func.vmap ({first[:160]})"
    finally:
        module.train(was_training)
    return None


def stacked_state(module: nn.Module, k: int) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``k`` copies of the module's trainable parameters and of its other tensors, stacked along a new first axis."""
    params, buffers = {}, {}
    for name, p in module.named_parameters():
        target = params if p.requires_grad else buffers
        target[name] = p.detach().unsqueeze(0).repeat(k, *([1] * p.dim()))
    for name, b in module.named_buffers():
        buffers[name] = b.detach().unsqueeze(0).repeat(k, *([1] * b.dim()))
    for p in params.values():
        p.requires_grad_(True)
    return params, buffers


# ---- per-client attributes -----------------------------------------------------------------------------------------


def _leaves(tree: Any) -> list[Any]:
    if isinstance(tree, Mapping):
        return [leaf for key in sorted(tree) for leaf in _leaves(tree[key])]
    if isinstance(tree, list | tuple):
        return [leaf for item in tree for leaf in _leaves(item)]
    return [tree]


def _structure(tree: Any) -> Any:
    """The tree's shape: containers, tensor shapes and dtypes, and the values of other leaves."""
    if isinstance(tree, Mapping):
        return ("dict", tuple((key, _structure(tree[key])) for key in sorted(tree)))
    if isinstance(tree, list | tuple):
        return (type(tree).__name__, tuple(_structure(item) for item in tree))
    if isinstance(tree, Tensor):
        return ("tensor", tuple(tree.shape), tree.dtype, tree.device)
    return ("value", tree if _hashable(tree) else id(tree))


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def stack_attributes(per_client: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], list[Tensor]]:
    """The clients' attributes (same structure) as one template and their tensor leaves, stacked leaf by leaf.

    The template is the first client's attributes: its non-tensor leaves are every client's (equal, by structure);
    its tensors are replaced by each client's slice when bound (:func:`bind_leaves`).
    """
    columns = [_leaves(attrs) for attrs in per_client]
    stacked = [
        torch.stack([col[i] for col in columns]) for i, leaf in enumerate(columns[0]) if isinstance(leaf, Tensor)
    ]
    return dict(per_client[0]), stacked


def bind_leaves(template: Mapping[str, Any], tensors: Sequence[Tensor]) -> dict[str, Any]:
    """``template`` with its tensor leaves replaced, in :func:`_leaves` order, by ``tensors``."""
    return _replace(dict(template), iter(tensors))


def _replace(tree: Any, supply: Iterator[Tensor]) -> Any:
    if isinstance(tree, Mapping):
        built = {key: _replace(tree[key], supply) for key in sorted(tree)}
        return {key: built[key] for key in tree}
    if isinstance(tree, list | tuple):
        return type(tree)(_replace(item, supply) for item in tree)
    return next(supply) if isinstance(tree, Tensor) else tree


@contextlib.contextmanager
def bound_attributes(module: nn.Module, attributes: Mapping[str, Any]) -> Iterator[None]:
    """Set ``module``'s attributes for the duration of the block, then put the previous values back."""
    missing = object()
    saved = {name: module.__dict__.get(name, missing) for name in attributes}
    try:
        for name, value in attributes.items():
            module.__dict__[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = value


def client_attributes(module: FederatedHooks) -> dict[str, Any]:
    """The module's per-client attributes (:attr:`~fl_lightning.module.FederatedHooks.client_attributes`) now."""
    return {name: getattr(module, name, None) for name in module.client_attributes}


def undeclared_changes(module: nn.Module, before: Mapping[str, int]) -> list[str]:
    """Attributes that ``on_client_start`` replaced without declaring them (``before``: :func:`attribute_ids`)."""
    declared = set(getattr(module, "client_attributes", ())) | {"client"}
    after = attribute_ids(module)
    return sorted(k for k, v in after.items() if k not in declared and before.get(k) != v)


class NotBatchable(RuntimeError):
    """Raised inside the batched engine when a method turns out not to be batchable; it then trains sequentially."""


def tensor_versions(module: nn.Module) -> list[tuple[str, int, int]]:
    """Each parameter's and buffer's name, storage and in-place version counter: what tells a change to them."""
    return [(n, t.data_ptr(), t._version) for n, t in module.state_dict(keep_vars=True).items()]


def attribute_ids(module: nn.Module) -> dict[str, int]:
    """The identities of the module's plain attributes (not parameters, buffers or submodules)."""
    return {k: id(v) for k, v in module.__dict__.items() if not k.startswith("_trainer") and k != "_hparams"}


# ---- the engine --------------------------------------------------------------------------------------------------


class ClientRNG:
    """One client's random stream for its training batches (augmentation), kept while other clients draw theirs."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.cpu_state = torch.get_rng_state()
        self.cuda_state = torch.cuda.get_rng_state(device) if self.cuda else None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Draw from this client's stream inside the block."""
        torch.set_rng_state(self.cpu_state)
        if self.cuda:
            torch.cuda.set_rng_state(self.cuda_state, self.device)
        try:
            yield
        finally:
            self.cpu_state = torch.get_rng_state()
            if self.cuda:
                self.cuda_state = torch.cuda.get_rng_state(self.device)


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


@dataclass
class StackedResult:
    """What :func:`train_stacked` returns: every client's final parameters and buffers, and its mean loss."""

    params: dict[str, Tensor]
    buffers: dict[str, Tensor]
    losses: list[float]
    #: State-dict names of shared (tied) tensors → the name they are stacked under.
    aliases: dict[str, str] = field(default_factory=dict)

    def client_state(self, k: int, template: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Client ``k``'s state dict (``template``: the module's state dict, for order, dtypes and other entries)."""
        out = {}
        for name, value in template.items():
            name_ = self.aliases.get(name, name)
            stacked = self.params.get(name_, self.buffers.get(name_))
            out[name] = value if stacked is None else stacked[k].detach().to(value.dtype)
        return out


def tensor_aliases(module: nn.Module) -> dict[str, str]:
    """Every name of a parameter or buffer that ``module`` holds under several names → its first name."""
    first: dict[int, str] = {}
    aliases = {}
    for name, t in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
        if id(t) in first:
            aliases[name] = first[id(t)]
        else:
            first[id(t)] = name
    return aliases


class _ClientLoss(nn.Module):
    """Calls the method's ``client_loss``, so that :func:`functional_call` can swap the method's weights."""

    def __init__(self, method: FedAvg) -> None:
        super().__init__()
        self.m = method

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.m.client_loss(x, y)


def _local_loss(
    module: FedAvg, wrapper: _ClientLoss, template: Mapping[str, Any]
) -> Callable[[dict[str, Tensor], dict[str, Tensor], list[Tensor], Tensor, Tensor], Tensor]:
    # Untying shared weights walks every module on every call; only a network that shares a parameter needs it.
    tied = len(list(module.named_parameters(remove_duplicate=False))) != len(list(module.named_parameters()))

    def loss(
        params: dict[str, Tensor], buffers: dict[str, Tensor], attrs: list[Tensor], x: Tensor, y: Tensor
    ) -> Tensor:
        state = {f"m.{k}": v for k, v in params.items()} | {f"m.{k}": v for k, v in buffers.items()}
        with bound_attributes(module, bind_leaves(template, attrs)):
            return functional_call(wrapper, state, (x, y), tie_weights=tied)

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
) -> StackedResult:
    """Train ``clients`` together from the module's current weights; the module itself is left unchanged.

    Every client's attributes must have the same structure (:func:`stack_attributes`). Step ``i`` trains the clients
    with more than ``i`` steps. The clients whose batch has the common (full) shape run in one call; a client with
    another batch shape at that step (a short last batch) joins that call padded with weight-0 samples where the
    loss allows it (:func:`pads_short_batches`) and autocast is off, else runs in its own. The full-shape call covers
    every client of the stack, the others masked (their loss counts zero and their BatchNorm statistics are put
    back), when ``pad`` is true (default: on a GPU, or when at least three quarters of the clients take a full
    batch); else it selects the full-batch clients. ``on_step(n)`` is told how many client steps each stacked step
    took.
    ``augment``: the datamodule's transform, so that clients with random batches (``rng``) are gathered too.
    """
    k = len(clients)
    template, attr_stack = stack_attributes([c.attributes for c in clients])
    params, buffers = stacked_state(module, k)
    names = list(params)
    wrapper = _ClientLoss(module)
    plain_loss = _local_loss(module, wrapper, template)
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
        if _overrides(module, "local_gradient", FederatedHooks)
        else None
    )
    momentum_buffers: list[Tensor | None] = [None] * len(names)
    steps = [c.steps for c in clients]
    loss_sums = torch.zeros(k, dtype=torch.float64, device=device)
    gather = _Gather.of(clients, augment)
    steps_on_device = torch.tensor(steps, device=device)
    for i in range(max(steps, default=0)):
        active = [j for j in range(k) if steps[j] > i]
        batches = gather.step(i, active) if gather is not None else _read(clients, active)
        full_shape = max((tuple(batches[j][0].shape) for j in active), key=lambda shape: shape[0])
        full = [j for j in active if tuple(batches[j][0].shape) == full_shape]
        short: dict[tuple, list[int]] = {}
        for j in active:
            if j not in full:
                short.setdefault(tuple(batches[j][0].shape), []).append(j)
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
                found = [torch.zeros_like(p) if g is None else g for p, g in zip(stack, found, strict=True)]
                grads = found if grads is None else [g.add_(f) for g, f in zip(grads, found, strict=True)]
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
                for n, b in buffers.items():  # a network's buffer updates (BatchNorm statistics) go back to them
                    b.index_copy_(0, idx, sub_buffers[n])
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
                _clip_per_client([grads[n] for n in used], clip_grad_norm)
            buffers_used = [momentum_buffers[n] for n in used]
            if used:
                _sgd_step([stack[n] for n in used], [grads[n] for n in used], buffers_used, sgd, mask)
            for n, b in zip(used, buffers_used, strict=True):
                momentum_buffers[n] = b
        if on_step is not None:
            on_step(len(active))
    sums = loss_sums.cpu().tolist()
    losses_out = [sums[j] / steps[j] if steps[j] else 0.0 for j in range(k)]
    return StackedResult({n: p.detach() for n, p in params.items()}, buffers, losses_out, tensor_aliases(module))


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


class _Gather:
    """A step's batches of all its clients read with one indexing and one transform.

    With augmentation (a :class:`~fl_lightning.core.augment.BatchTransform` that augments), each client's random choices
    are drawn on its own stream, as the sequential engine draws them, and applied to every client's images at once.
    """

    def __init__(self, sources: Sequence[ClientBatches], augment: BatchTransform | None, rngs: list[ClientRNG]) -> None:
        self.x = torch.cat([s.x for s in sources])
        self.y = torch.cat([s.y for s in sources])
        offsets = [0]
        for s in sources[:-1]:
            offsets.append(offsets[-1] + len(s.y))
        self.positions = [[pos + off for pos in s.batches] for s, off in zip(sources, offsets, strict=True)]
        self.transform = sources[0].transform
        self.augment, self.rngs = augment, rngs

    @classmethod
    def of(cls, clients: Sequence[StackedClient], augment: BatchTransform | None) -> _Gather | None:
        """The gatherer of ``clients``' batches, or ``None`` where they must be read one by one."""
        sources = [c.source for c in clients]
        rngs = [c.rng for c in clients]
        if any(s is None for s in sources):
            return None
        if any(r is not None for r in rngs):
            if augment is None or any(r is None for r in rngs):
                return None
            return cls(sources, augment, rngs)  # type: ignore[arg-type]
        return cls(sources, None, [])  # type: ignore[arg-type]

    def step(self, i: int, active: Sequence[int]) -> dict[int, tuple[Tensor, Tensor]]:
        """The ``i``-th batch of each client in ``active``."""
        parts = [self.positions[j][i] for j in active]
        idx = torch.cat(parts)
        x, y = self.x[idx], self.y[idx]
        if self.augment is not None:
            drawn = []
            for j, part in zip(active, parts, strict=True):
                with self.rngs[j].active():
                    drawn.append(self.augment.draw(len(part), x.shape[-2:], x.device))
            x = self.augment.apply(x, {key: torch.cat([d[key] for d in drawn]) for key in drawn[0]})
        elif self.transform is not None:
            x = self.transform(x)
        sizes = [len(p) for p in parts]
        return dict(zip(active, zip(x.split(sizes), y.split(sizes), strict=True), strict=True))


def _clip_per_client(grads: list[Tensor], max_norm: float) -> None:
    """Scale each client's gradient to total L2 norm at most ``max_norm`` (``clip_grad_norm_``'s arithmetic)."""
    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads], dim=1)
    total = torch.linalg.vector_norm(norms, dim=1)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))).to(g.dtype))


def _sgd_step(
    params: list[Tensor], grads: list[Tensor], buffers: list[Tensor | None], sgd: SGDSettings, mask: Tensor | None
) -> None:
    """``torch.optim.SGD``'s update on stacked clients; a client whose ``mask`` is false keeps its weights.

    Its arithmetic, op for op, in foreach ops (one dispatch per operation for all parameters). ``buffers`` holds each
    parameter's momentum buffer (``None`` before its first step), updated in place.
    """
    d = torch._foreach_neg(grads) if sgd.maximize else list(grads)
    if sgd.weight_decay != 0:
        d = torch._foreach_add(d, params, alpha=sgd.weight_decay)
    if sgd.momentum != 0:
        fresh = [i for i, b in enumerate(buffers) if b is None]
        held = [i for i, b in enumerate(buffers) if b is not None]
        for i in fresh:
            buffers[i] = torch.clone(d[i]).detach()
        if held:
            old = [buffers[i] for i in held]
            torch._foreach_mul_(old, sgd.momentum)  # type: ignore[arg-type]
            torch._foreach_add_(old, [d[i] for i in held], alpha=1 - sgd.dampening)  # type: ignore[arg-type]
        bufs = [b for b in buffers if b is not None]
        d = torch._foreach_add(d, bufs, alpha=sgd.momentum) if sgd.nesterov else bufs
    if mask is not None:  # where, not a product: a finished client keeps its weights whatever its gradient holds
        zero = torch.zeros((), dtype=params[0].dtype, device=params[0].device)
        d = [torch.where(mask.view(-1, *([1] * (t.dim() - 1))), t, zero) for t in d]
    torch._foreach_add_(params, d, alpha=-sgd.lr)


# ---- the executor ------------------------------------------------------------------------------------------------


class BatchedClients(SequentialClients):
    """The round's clients trained in stacks: each training batch is a :class:`~fl_lightning.data.ClientGroup`.

    Per group: each client's setup runs as in :class:`~fl_lightning.executor.SequentialClients` (its seed, context,
    ``on_client_start`` on the global weights, the shared teacher), clients with attributes of one structure are
    trained together by :func:`train_stacked`, then each client's ``on_client_end`` runs on its own weights and its
    results go to the round. The arguments are :class:`~fl_lightning.executor.SequentialClients`'.
    """

    def __init__(
        self,
        datamodule: FederatedDataModule,
        client_states: ClientStateStore,
        seed: int,
        evaluate_local: Callable[[L.LightningModule], Evaluation] | None = None,
    ) -> None:
        super().__init__(datamodule, client_states, seed, evaluate_local)
        #: Why the clients train one by one from now on (a failure of the stacked step), or ``None``.
        self.fallback: str | None = None
        #: Told the reason when the engine falls back.
        self.on_fallback: Callable[[str], None] | None = None

    def on_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        """Attach the group's training to the batch, which the method's ``training_step`` runs."""
        rnd = self.round
        assert rnd is not None
        if not isinstance(batch, ClientGroup):
            raise TypeError(f"the batched engine trains ClientGroup batches, got {type(batch).__name__}")
        batch.run = functools.partial(self._train_group, trainer, rnd.group_positions(batch_idx))

    def before_optimizer_step(self, module: L.LightningModule) -> None:
        """Nothing: a stacked step has no Lightning optimizer step."""

    def on_batch_end(self, module: L.LightningModule, outputs: Any, batch_idx: int) -> None:
        """Nothing: the group's clients went to the round as they finished."""

    def _train_group(
        self, trainer: L.Trainer, positions: Sequence[int], module: FedAvg, group: ClientGroup
    ) -> Tensor | None:
        rnd = self.round
        assert rnd is not None
        if not positions:
            return None
        if self.fallback is None:
            done = rnd.done
            try:
                return self._train_stacks(trainer, positions, module, group)
            except NotBatchable as err:
                reason = str(err)
            except Exception as err:  # noqa: BLE001 - a loss or network vmap cannot run: say so, train sequentially
                if rnd.done != done:  # clients of this group already reached the round: nothing to redo
                    raise
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                reason = f"the stacked step failed ({type(err).__name__}: {first[:200]})"
            self.fallback = reason
            module.client = None
            module.load_state_dict(rnd.global_weights)
            if self.on_fallback is not None:
                self.on_fallback(reason)
        return self._train_one_by_one(trainer, positions, module, group)

    def _train_one_by_one(
        self, trainer: L.Trainer, positions: Sequence[int], module: FedAvg, group: ClientGroup
    ) -> Tensor | None:
        """The group's clients one after another, as :class:`~fl_lightning.executor.SequentialClients` trains them."""
        rnd = self.round
        assert rnd is not None
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        losses = []
        for i, pos in enumerate(positions):
            module.load_state_dict(rnd.global_weights)
            for opt in trainer.optimizers:
                opt.state.clear()
            ctx = self._context(rnd, pos, module, lr)
            seed_torch(round_seed(self.seed, rnd.plan.round, ctx.client, 1), module.device)
            module.client = ctx
            if module.teacher_needed(ctx):
                module.refresh_teacher()
            module.on_client_start(ctx)
            loss = module.training_step(group.clients[i], pos)
            upload = module.on_client_end(ctx) or {}
            value = 0.0 if loss is None else float(loss)
            losses.append(value)
            if rnd.add_client(pos, module.state_dict(), upload, value, ctx.client, ctx.state):
                self.client_states.put(ctx.client, ctx.state)
                if self.evaluate_local is not None:
                    rnd.add_local_eval(pos, self.evaluate_local(module))
        module.load_state_dict(rnd.global_weights)
        return torch.tensor(sum(losses) / len(losses)) if losses else None

    def _context(self, rnd: RoundState, pos: int, module: FedAvg, lr: float) -> ClientContext:
        slot = rnd.slots[pos]
        client = rnd.plan.clients[slot]
        return self.dm.client_context(
            rnd.plan.round,
            client,
            steps=rnd.plan.steps[slot],
            lr=lr,
            weight=rnd.weights[slot],
            server=self.payload,
            state=to_device(self.client_states.get(client), module.device),
            global_weights=rnd.global_weights,
            device=module.device,
            generator=torch.Generator().manual_seed(round_seed(self.seed, rnd.plan.round, client, 2)),
        )

    def _train_stacks(
        self, trainer: L.Trainer, positions: Sequence[int], module: FedAvg, group: ClientGroup
    ) -> Tensor | None:
        rnd = self.round
        assert rnd is not None
        sgd = SGDSettings.from_optimizer(trainer.optimizers[0])
        transform = self.dm.transform
        random_batches = isinstance(transform, BatchTransform) and transform.augments
        contexts: list[ClientContext] = []
        stacks: dict[Any, list[int]] = {}
        members: list[StackedClient] = []
        needs_teacher = False
        for pos in positions:
            ctx = self._context(rnd, pos, module, sgd.lr)
            contexts.append(ctx)
            needs_teacher = needs_teacher or module.teacher_needed(ctx)
        if needs_teacher:
            module.refresh_teacher()  # the global model, shared by every client of the group
        weights = tensor_versions(module)
        for i, ctx in enumerate(contexts):
            seed_torch(round_seed(self.seed, rnd.plan.round, ctx.client, 1), module.device)
            module.client = ctx
            before = attribute_ids(module)
            module.on_client_start(ctx)
            if tensor_versions(module) != weights:
                raise NotBatchable(
                    f"{type(module).__name__}.on_client_start changes the module's weights or buffers "
                    "(the batched engine starts every client from the global weights)"
                )
            changed = undeclared_changes(module, before)
            if changed:
                raise NotBatchable(
                    f"{type(module).__name__}.on_client_start sets {', '.join(changed)} without declaring "
                    f"{'it' if len(changed) == 1 else 'them'} in client_attributes"
                )
            attrs = client_attributes(module)
            rng = ClientRNG(module.device) if random_batches else None
            source = group.clients[i]
            members.append(
                StackedClient(
                    iter(source), ctx.steps, attrs, rng, source if isinstance(source, ClientBatches) else None
                )
            )
        module.client = None  # a loss that reads self.client in the batched engine fails loudly
        aligned = module.align_client_attributes([member.attributes for member in members])
        if len(aligned) != len(members) or any(
            not isinstance(a, Mapping) or set(a) != set(m.attributes) for a, m in zip(aligned, members, strict=True)
        ):
            raise NotBatchable(
                f"{type(module).__name__}.align_client_attributes must return one dict per client with the keys of "
                "client_attributes"
            )
        for i, (member, attrs) in enumerate(zip(members, aligned, strict=True)):
            member.attributes = dict(attrs)
            stacks.setdefault(_structure(attrs), []).append(i)
        opt = module.optimizers()
        template = module.state_dict()
        losses = []
        for stack in stacks.values():
            result = train_stacked(
                module,
                [members[i] for i in stack],
                sgd,
                module._clip_grad_norm,
                on_step=functools.partial(_count_steps, opt),
                augment=transform if random_batches else None,
            )
            # The local weights go into the module only for a method that reads them at its client's end.
            load = _overrides(module, "on_client_end", FederatedHooks) or self.evaluate_local is not None
            for k, i in enumerate(stack):
                ctx = contexts[i]
                weights = result.client_state(k, template)
                upload = {}
                if load:
                    module.load_state_dict(weights)
                    module.client = ctx
                    rng = members[i].rng
                    with (
                        bound_attributes(module, members[i].attributes),
                        rng.active() if rng is not None else contextlib.nullcontext(),
                    ):
                        upload = module.on_client_end(ctx) or {}
                loss = result.losses[k]
                losses.append(loss)
                if rnd.add_client(positions[i], weights, upload, loss, ctx.client, ctx.state):
                    self.client_states.put(ctx.client, ctx.state)
                    if self.evaluate_local is not None:
                        rnd.add_local_eval(positions[i], self.evaluate_local(module))
            if load:
                module.load_state_dict(rnd.global_weights)
        module.client = None
        return torch.tensor(sum(losses) / len(losses)) if losses else None


def _count_steps(opt: Any, n: int) -> None:
    """Lightning's step bookkeeping (``global_step``), once per client step, as the sequential engine keeps it."""
    for _ in range(n):
        opt._on_before_step()
        opt._on_after_step()


def auto_engine(device: torch.device, batch_values: int) -> tuple[str, str]:
    """``auto``'s choice for a method that can train batched: the engine and why.

    ``batch_values``: the input values of one local batch (batch size × values per sample). On a GPU a small network's
    step is bound by kernel launches, which stacking divides by the group size: batched. On a CPU the arithmetic
    decides: small inputs train faster batched (the 8×8 quickstart, 2,048 values a batch: 1.67×; the tabular MLP,
    480: 1.10×), the papers' 28×28 and 32×32 images no faster or slower (39,200 values: 0.98×; 153,600: 0.56×;
    figures of ``bench/bench_engines.py`` in the README), where ``vmap``'s grouped convolutions are compute-bound.
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

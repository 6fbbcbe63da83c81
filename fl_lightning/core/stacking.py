"""A model's tensors and its per-client attributes stacked along a new first (client) axis.

The batched engine (:mod:`fl_lightning.batched`) trains K clients as one model: :func:`stacked_state` holds K copies
of every parameter and buffer, :class:`StackedResult` hands each client's own back as a state dict. What a method
computes per client (its ``client_attributes``) is a tree of tensors and other values; :func:`stack_attributes`
stacks the tensor leaves of clients whose trees have one :func:`attribute_structure`, and :func:`bind_leaves` with
:func:`bound_attributes` give the module one client's slice while its loss runs. :class:`ClientRNG` keeps one
client's random stream while the others draw theirs.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch._C import _functorch

# ---- stacked tensors -------------------------------------------------------------------------------------------------


def stacked_state(module: nn.Module, k: int) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``k`` copies of the module's trainable parameters and of its other tensors, stacked along a new first axis."""
    params: dict[str, Tensor] = {}
    buffers: dict[str, Tensor] = {}
    for name, p in module.named_parameters():
        target = params if p.requires_grad else buffers
        target[name] = p.detach().unsqueeze(0).repeat(k, *([1] * p.dim()))
    for name, b in module.named_buffers():
        buffers[name] = b.detach().unsqueeze(0).repeat(k, *([1] * b.dim()))
    for stacked in params.values():
        stacked.requires_grad_(True)
    return params, buffers


@dataclass
class StackedResult:
    """What :func:`~fl_lightning.stacked.train_stacked` returns: each client's final parameters, buffers, mean loss."""

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


def swap_names(module: nn.Module) -> dict[str, str] | None:
    """The names to hand :func:`torch.func.functional_call` (with ``tie_weights=False``) for a module's stacked state.

    Each slot a tensor sits in (one module attribute; a module reached by several paths counts once) → the name its
    tensor is stacked under (:func:`stacked_state`'s, the tensor's first name). ``None`` when every tensor has one
    name: the stacked state's names are the ones. A shared tensor in two modules gets the one stacked tensor in both
    slots; a module registered twice (``self.b = self.a``) is swapped once, which ``tie_weights=True`` does not do: it
    swaps such a module twice and, putting the originals back, leaves the stacked tensor in it (torch 2.14).
    """
    aliases = tensor_aliases(module)
    if not aliases:
        return None
    seen: set[tuple[int, str]] = set()
    names: dict[str, str] = {}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for attr, tensor in [*sub._parameters.items(), *sub._buffers.items()]:
            if tensor is None or (id(sub), attr) in seen:
                continue
            seen.add((id(sub), attr))
            name = f"{prefix}.{attr}" if prefix else attr
            names[name] = aliases.get(name, name)
    return names


def swap_state(state: Mapping[str, Tensor], names: Mapping[str, str] | None, prefix: str = "") -> dict[str, Tensor]:
    """``state`` (stacked, by first names) under the names of :func:`swap_names`, each behind ``prefix``."""
    if names is None:
        return {f"{prefix}{k}": v for k, v in state.items()}
    return {f"{prefix}{name}": state[first] for name, first in names.items() if first in state}


# ---- per-client attributes -------------------------------------------------------------------------------------------


def _leaves(tree: Any) -> list[Any]:
    if isinstance(tree, Mapping):
        return [leaf for key in sorted(tree) for leaf in _leaves(tree[key])]
    if isinstance(tree, list | tuple):
        return [leaf for item in tree for leaf in _leaves(item)]
    return [tree]


def attribute_structure(tree: Any) -> Any:
    """The tree's shape: containers, tensor shapes and dtypes, and the values of other leaves."""
    if isinstance(tree, Mapping):
        return ("dict", tuple((key, attribute_structure(tree[key])) for key in sorted(tree)))
    if isinstance(tree, list | tuple):
        return (type(tree).__name__, tuple(attribute_structure(item) for item in tree))
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
    if isinstance(tree, (list, tuple)):  # not `list | tuple`: torch 2.9's compile cannot trace a UnionType
        return type(tree)(_replace(item, supply) for item in tree)
    return next(supply) if isinstance(tree, Tensor) else tree


_MISSING = object()


class bound_attributes:  # noqa: N801 - a context manager class (Dynamo before 2.7 cannot trace a generator one)
    """Set ``module``'s attributes for the duration of the block, then put the previous values back."""

    def __init__(self, module: nn.Module, attributes: Mapping[str, Any]) -> None:
        self.module, self.attributes = module, attributes

    def __enter__(self) -> None:
        self.saved = {name: self.module.__dict__.get(name, _MISSING) for name in self.attributes}
        for name, value in self.attributes.items():
            self.module.__dict__[name] = value

    def __exit__(self, *exc: object) -> None:
        for name, value in self.saved.items():
            if value is _MISSING:
                self.module.__dict__.pop(name, None)
            else:
                self.module.__dict__[name] = value


# ---- what tells a change to a module, one client's random stream -----------------------------------------------------


def overrides(obj: object, name: str, base: type) -> bool:
    """Whether ``type(obj)`` replaces ``base``'s attribute ``name`` (a hook or a method) with its own."""
    return getattr(type(obj), name) is not getattr(base, name)


def tensor_versions(module: nn.Module) -> list[tuple[str, int, int]]:
    """Each parameter's and buffer's name, storage and in-place version counter: what tells a change to them."""
    return [(n, t.data_ptr(), t._version) for n, t in module.state_dict(keep_vars=True).items()]


def attribute_ids(module: nn.Module) -> dict[str, int]:
    """The identities of the module's plain attributes (not parameters, buffers or submodules)."""
    return {k: id(v) for k, v in module.__dict__.items() if not k.startswith("_trainer") and k != "_hparams"}


#: A torchmetrics metric's bookkeeping beside its states, which its ``update`` moves too.
_METRIC_BOOKKEEPING = ("_update_count", "_computed", "_forward_cache")


class HeldMetrics:
    """The torchmetrics metrics in a module, their states kept to tell and undo what the stacked step did to them.

    A metric updated under ``vmap`` (in ``client_loss``) stores batched tensors that nothing outside can use, or, from
    a value of no batched input, counts once for all the clients it stacks. Found by class, only once torchmetrics is
    imported (a module without metrics costs nothing).
    """

    def __init__(self, module: nn.Module) -> None:
        torchmetrics = sys.modules.get("torchmetrics")
        self.metrics: list[tuple[str, nn.Module]] = (
            [(name, sub) for name, sub in module.named_modules() if isinstance(sub, torchmetrics.Metric)]
            if torchmetrics is not None
            else []
        )
        self.before = [(_states(metric), _bookkeeping(metric)) for _, metric in self.metrics]

    def restore(self) -> tuple[list[str], list[str]]:
        """Put back the states the step replaced or extended: their names, and those changed in place (kept)."""
        restored: list[str] = []
        in_place: list[str] = []
        for (prefix, metric), (states, bookkeeping) in zip(self.metrics, self.before, strict=True):
            label = f"{prefix}." if prefix else ""
            for name, (value, signature) in states.items():
                now = getattr(metric, name)
                if _signature(now) == signature:
                    continue
                if _changed_in_place(now, signature):
                    in_place.append(label + name)
                    continue
                restored.append(label + name)
                setattr(metric, name, list(value) if isinstance(value, list) else value)
            for name, value in bookkeeping.items():
                setattr(metric, name, value)
        return restored, in_place


def _states(metric: nn.Module) -> dict[str, tuple[Any, tuple[Any, ...]]]:
    states = cast(Mapping[str, Any], getattr(metric, "metric_state", {}))
    return {name: (list(v) if isinstance(v, list) else v, _signature(v)) for name, v in states.items()}


def _bookkeeping(metric: nn.Module) -> dict[str, Any]:
    return {name: getattr(metric, name) for name in _METRIC_BOOKKEEPING if hasattr(metric, name)}


def _signature(value: Any) -> tuple[Any, ...]:
    """What changes when code replaces, extends or changes in place a state (a tensor or a list of tensors)."""
    if isinstance(value, Tensor):
        return (id(value), value._version, _functorch.is_functorch_wrapped_tensor(value))
    if isinstance(value, (list, tuple)):
        return (id(value), tuple(_signature(v) for v in value))
    return (id(value),)


def _changed_in_place(value: Any, signature: tuple[Any, ...]) -> bool:
    """Whether ``value`` is the tensor ``signature`` was taken of (or holds one), its version counter moved since."""
    if isinstance(value, Tensor):
        return id(value) == signature[0] and value._version != signature[1]
    if isinstance(value, (list, tuple)) and len(signature) == 2:
        old = {s[0]: s for s in signature[1] if len(s) == 3}
        return any(isinstance(v, Tensor) and id(v) in old and v._version != old[id(v)][1] for v in value)
    return False


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
        if self.cuda_state is not None:
            torch.cuda.set_rng_state(self.cuda_state, self.device)
        try:
            yield
        finally:
            self.cpu_state = torch.get_rng_state()
            if self.cuda:
                self.cuda_state = torch.cuda.get_rng_state(self.device)

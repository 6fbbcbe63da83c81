"""Per-client state kept by the server between rounds: on the CPU, or on disk once a memory budget is used up."""

from __future__ import annotations

import copy
import pickle
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fl_lightning.core.distributed import to_device
from fl_lightning.core.files import atomic_path
from fl_lightning.core.registry import import_path

#: The key of a plain dict that stands for a container ``torch.load(weights_only=True)`` refuses (:func:`plain_state`).
STATE_TYPE_KEY = "__fl_lightning_state_type__"


def state_nbytes(tree: Any) -> int:
    """Bytes held by the tensors in a (nested) state."""
    if isinstance(tree, Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(state_nbytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(state_nbytes(v) for v in tree)
    return 0


def unpicklable(tree: Any, path: tuple[Any, ...] = ()) -> tuple[tuple[Any, ...], Any] | None:
    """Where pickle (as ``torch.save``) fails in ``tree``: the keys down to the first value it refuses, and the value.

    Plain dicts, lists and tuples are searched, not pickled, and tensors taken as ``torch.save`` stores them, so that
    finding the value costs about one more pickling of the state (it is only looked for once a save has failed).
    None when nothing in ``tree`` fails.

    >>> where, value = unpicklable({"c": torch.zeros(2), "f": [1, lambda: 0]})
    >>> where, type(value).__name__
    (('f', 1), 'function')
    """
    if isinstance(tree, Tensor):
        return None
    children = _children(tree)
    if type(tree) not in (dict, list, tuple):  # anything else pickles as a whole (a defaultdict's lambda factory)
        try:
            pickle.dumps(tree, protocol=2)
            return None
        except Exception:  # pickle's refusal is a TypeError, AttributeError or PicklingError, as the object says
            pass
    for key, value in children:
        found = unpicklable(value, (*path, key))
        if found is not None:
            return found
    return None if type(tree) in (dict, list, tuple) else (path, tree)


def _children(tree: Any) -> list[tuple[Any, Any]]:
    """A container's (key, value) pairs: a mapping's items, a list's or tuple's positions; none for anything else."""
    if isinstance(tree, dict):
        return list(tree.items())
    if isinstance(tree, list | tuple):
        return list(enumerate(tree))
    return []


def unstorable_state(owner: str, state: Any, refuser: str = "a checkpoint cannot store") -> TypeError | None:
    """The one-line error for the first value in ``state`` that a checkpoint cannot store; None when there is none.

    ``owner`` names the state: ``client 3's state`` (a ``client.state``) or ``server.state``; ``refuser`` says what
    needed to pickle it (the processes of a several-process fit send each other their clients' states).

    >>> print(unstorable_state("client 3's state", {"c": torch.zeros(1), "log": (i for i in [])}))  # doctest: +ELLIPSIS
    client 3's state['log'] holds a generator (<genexpr>), which a checkpoint cannot store: keep only tensors, ...
    """
    found = unpicklable(state)
    if found is None:
        return None
    path, value = found
    keys = "".join(f"[{key!r}]" for key in path)
    kind = type(value).__qualname__
    kind = kind if type(value).__module__ == "builtins" else f"{type(value).__module__}.{kind}"  # _io.TextIOWrapper
    name = getattr(value, "__qualname__", None)  # a function's, a generator's or a class's own name
    where, hook = ("server.state", "on_round_start") if owner == "server.state" else ("client.state", "on_client_start")
    return TypeError(
        f"{owner}{keys} holds a {kind}{f' ({name})' if isinstance(name, str) else ''}, which {refuser}: keep only "
        f"tensors, numbers, strings and plain dicts, lists or tuples of them in {where} (rebuild a function, generator "
        f"or open file in {hook})"
    )


def plain_state(tree: Any) -> Any:
    """``tree`` with each container that ``torch.load(weights_only=True)`` refuses written as a tagged plain dict.

    A ``defaultdict`` (with an importable factory, such as ``int`` or ``list``), a ``Counter``, a named tuple (of an
    importable class) and a ``frozenset`` are refused by Lightning's default checkpoint load; in this form a
    checkpoint holding them loads, and :func:`restore_state` gives them back with their types. Anything else is kept
    as it is (a ``defaultdict`` of a lambda still fails to save, and :func:`unstorable_state` names it).

    >>> plain_state(defaultdict(int, {"seen": 2}))
    {'__fl_lightning_state_type__': 'defaultdict', 'factory': 'builtins.int', 'items': [['seen', 2]]}
    """
    if isinstance(tree, Tensor):
        return tree
    if isinstance(tree, defaultdict):
        factory = tree.default_factory
        name = None if factory is None else _import_name(factory)
        items = [[key, plain_state(value)] for key, value in tree.items()]
        if factory is None or name is not None:
            return {STATE_TYPE_KEY: "defaultdict", "factory": name, "items": items}
        return tree
    if type(tree) is Counter:
        return {STATE_TYPE_KEY: "Counter", "items": [[key, plain_state(value)] for key, value in tree.items()]}
    if isinstance(tree, dict):
        out = copy.copy(tree)  # an OrderedDict stays one
        for key, value in tree.items():
            out[key] = plain_state(value)
        return out
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        name = _import_name(type(tree))
        if name is None:
            return tree
        return {STATE_TYPE_KEY: "namedtuple", "class": name, "fields": [plain_state(v) for v in tree]}
    if isinstance(tree, list | tuple):
        return type(tree)(plain_state(v) for v in tree)
    if isinstance(tree, frozenset):
        return {STATE_TYPE_KEY: "frozenset", "items": list(tree)}
    return tree


def restore_state(tree: Any) -> Any:
    """The state :func:`plain_state` wrote, with its containers' own types given back.

    >>> state = restore_state(plain_state({"seen": defaultdict(int, {"a": 2})}))
    >>> state["seen"]["b"], type(state["seen"]).__name__
    (0, 'defaultdict')

    Raises:
        ValueError: a named tuple's class or a ``defaultdict``'s factory no longer imports (renamed or moved).
    """
    if isinstance(tree, dict):
        kind = tree.get(STATE_TYPE_KEY)
        if kind == "defaultdict":
            factory = None if tree["factory"] is None else _imported(tree["factory"], "a defaultdict's factory")
            return defaultdict(factory, {key: restore_state(value) for key, value in tree["items"]})
        if kind == "namedtuple":
            return _imported(tree["class"], "a named tuple's class")(*(restore_state(v) for v in tree["fields"]))
        if kind == "Counter":
            return Counter({key: restore_state(value) for key, value in tree["items"]})
        if kind == "frozenset":
            return frozenset(tree["items"])
        out = copy.copy(tree)
        for key, value in tree.items():
            out[key] = restore_state(value)
        return out
    if isinstance(tree, list | tuple) and not hasattr(tree, "_fields"):
        return type(tree)(restore_state(v) for v in tree)
    return tree


#: Leaves ``torch.load(weights_only=True)`` (Lightning's default when it resumes) accepts, besides tensors.
_WEIGHTS_ONLY_LEAVES = frozenset(
    {type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size}
)


def weights_only_refuses(tree: Any, path: tuple[Any, ...] = ()) -> tuple[tuple[Any, ...], Any] | None:
    """The first value in a :func:`plain_state` tree that ``torch.load(weights_only=True)`` refuses, with its keys.

    >>> import numpy as np
    >>> where, value = weights_only_refuses(plain_state({"seen": defaultdict(int), "log": [np.zeros(2)]}))
    >>> where, type(value).__name__
    (('log', 0), 'ndarray')
    """
    if isinstance(tree, Tensor) or type(tree) in _WEIGHTS_ONLY_LEAVES:
        return None
    if type(tree) in (dict, OrderedDict):
        children: list[tuple[Any, Any]] = list(tree.items())
    elif type(tree) in (list, tuple, set):
        children = list(enumerate(tree))
    else:
        return path, tree
    for key, value in children:
        found = weights_only_refuses(value, (*path, key))
        if found is not None:
            return found
    return None


def _import_name(obj: Any) -> str | None:
    """The dotted path that imports ``obj`` back (None for a lambda, a local class or anything not importable)."""
    name = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
    return name if "<" not in name and import_path(name) is obj else None


def _imported(name: str, what: str) -> Any:
    found = import_path(name)
    if found is None:
        raise ValueError(
            f"the checkpoint's state holds {what} {name!r}, which does not import here: resume where it imports "
            "(the code that saved it)"
        )
    return found


class ClientStateStore:
    """Every client's persistent state (``ClientContext.state``), stored off the accelerator.

    States are kept in CPU memory until they hold ``max_memory_mb``; further clients' states are written to
    ``spill_dir`` (one file per client) and read back when that client trains again. Checkpoints hold every state,
    wherever it lives, so a resumed run continues exactly.

    Args:
        max_memory_mb: CPU memory for client states before spilling to disk (``None``: no limit).
        spill_dir: folder for spilled states (needed when ``max_memory_mb`` is set).
    """

    def __init__(self, max_memory_mb: float | None = None, spill_dir: str | Path | None = None) -> None:
        if max_memory_mb is not None and max_memory_mb < 0:
            raise ValueError(f"client state memory limit must be >= 0 MB, got {max_memory_mb}")
        if max_memory_mb is not None and spill_dir is None:
            raise ValueError("a client state memory limit needs a folder to spill to")
        self.max_bytes = None if max_memory_mb is None else int(max_memory_mb * 2**20)
        self.spill_dir = Path(spill_dir) if spill_dir is not None else None
        self._memory: dict[int, dict[str, Any]] = {}
        self._on_disk: set[int] = set()
        self._bytes = 0

    def __contains__(self, client: int) -> bool:
        return client in self._memory or client in self._on_disk

    def __len__(self) -> int:
        return len(self._memory) + len(self._on_disk)

    @property
    def memory_bytes(self) -> int:
        """Bytes of client state held in CPU memory."""
        return self._bytes

    def usage(self) -> dict[str, float]:
        """What the states cost: clients holding one, MB in CPU memory, clients spilled to disk.

        >>> store = ClientStateStore()
        >>> store.put(3, {"control": torch.zeros(2**18)})  # 1 MB of float32
        >>> store.usage()
        {'clients': 1, 'memory_mb': 1.0, 'on_disk': 0}
        """
        return {"clients": len(self), "memory_mb": round(self._bytes / 2**20, 3), "on_disk": len(self._on_disk)}

    def get(self, client: int) -> dict[str, Any]:
        """A copy-free view of the client's state (an empty dict for a client seen for the first time)."""
        if client in self._memory:
            return self._memory[client]
        if client in self._on_disk:
            return torch.load(self._path(client), map_location="cpu", weights_only=False)
        return {}

    def put(self, client: int, state: dict[str, Any]) -> None:
        """Store the client's state (its tensors moved to the CPU), replacing the previous one."""
        state = to_device(state, "cpu")
        self._bytes -= state_nbytes(self._memory.pop(client, {}))
        size = state_nbytes(state)
        if self.max_bytes is None or self._bytes + size <= self.max_bytes:
            self._memory[client] = state
            self._bytes += size
            if client in self._on_disk:
                self._on_disk.discard(client)
                self._path(client).unlink(missing_ok=True)
            return
        assert self.spill_dir is not None
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        try:
            with atomic_path(self._path(client)) as tmp:
                torch.save(state, tmp)
        except (TypeError, AttributeError, pickle.PicklingError) as err:
            unstorable = unstorable_state(f"client {client}'s state", state)
            if unstorable is None:
                raise
            raise unstorable from err
        self._on_disk.add(client)

    def items(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Every (client, state), in client order."""
        for client in sorted(set(self._memory) | self._on_disk):
            yield client, self.get(client)

    def state_dict(self) -> dict[int, dict[str, Any]]:
        """All states, for a checkpoint."""
        return dict(self.items())

    def load_state_dict(self, states: dict[int, dict[str, Any]]) -> None:
        """Replace every state with the checkpoint's."""
        self._memory, self._on_disk, self._bytes = {}, set(), 0
        for client, state in sorted(states.items()):
            self.put(int(client), state)

    def _path(self, client: int) -> Path:
        assert self.spill_dir is not None
        return self.spill_dir / f"client_{client}.pt"

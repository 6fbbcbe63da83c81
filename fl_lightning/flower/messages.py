"""What travels between the ServerApp and a ClientApp, packed into Flower records.

A round's instruction to a client holds the global weights (an ``ArrayRecord``), the method's payload (what its
``on_round_start`` returned), and the client's part of the round plan (a ``ConfigRecord``); the reply holds the local
weights, the method's upload (what its ``on_client_end`` returned) and the client's mean training loss. A payload, an
upload or a client's persistent state is any nest of dicts, lists and tuples whose leaves are tensors or plain values
(``None``, numbers, strings): :func:`pack` puts its tensors in an ``ArrayRecord`` and its shape, with the plain
values, in a ``ConfigRecord``; :func:`unpack` rebuilds it with the same containers (a ``defaultdict``, a named
tuple, a dict with int or tuple keys; an ``OrderedDict`` arrives as a dict, in its order). Tensors travel as NumPy
arrays of the same dtype, so the values arrive bit for bit; a dtype NumPy has no type for (``bfloat16``: a network or
state kept in bf16) travels as float32, which holds its values exactly, and is cast back on arrival.

>>> import torch
>>> tree = {"c": {"w": torch.tensor([1.5, 2.0])}, "n": 3, "tag": None, "pair": (torch.tensor(1), 0.5)}
>>> back = unpack(*pack(tree))
>>> back["c"]["w"].tolist(), back["n"], back["tag"], back["pair"][0].item(), back["pair"][1]
([1.5, 2.0], 3, None, 1, 0.5)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from torch import Tensor

from fl_lightning.core.state import plain_state, restore_state

#: The ``ConfigRecord`` key holding a packed tree's shape.
SHAPE_KEY = "shape"
#: The ``ConfigRecord`` key holding the dtypes of the tensors that travel widened (:data:`WIDENED`), by array key.
DTYPES_KEY = "dtypes"
#: Tensor dtypes NumPy cannot represent: they travel as float32 (exact for every one of their values).
WIDENED = (torch.bfloat16,)


def _sendable(tensors: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """``tensors`` on the CPU, those of a :data:`WIDENED` dtype as float32; and those keys' own dtypes."""
    out: dict[str, Tensor] = {}
    dtypes: dict[str, str] = {}
    for key, value in tensors.items():
        value = value.detach().cpu()
        if value.dtype in WIDENED:
            dtypes[key] = str(value.dtype).removeprefix("torch.")
            value = value.float()
        out[key] = value
    return out, dtypes


def _received(tensors: Mapping[str, Tensor], dtypes: Mapping[str, str]) -> dict[str, Tensor]:
    """``tensors`` with the widened ones cast back to their own dtypes (:func:`_sendable`)."""
    return {k: v.to(getattr(torch, dtypes[k])) if k in dtypes else v for k, v in tensors.items()}


def pack(tree: Any) -> tuple[ArrayRecord, ConfigRecord]:
    """``tree``'s tensors (an ``ArrayRecord``, on the CPU) and its shape with the plain values (a ``ConfigRecord``).

    Raises ``TypeError`` for a leaf that is neither a tensor nor a plain value.
    """
    tensors: dict[str, Tensor] = {}

    def walk(node: Any) -> Any:
        if isinstance(node, Tensor):
            key = str(len(tensors))
            tensors[key] = node
            return {"t": key}
        if isinstance(node, Mapping):
            if all(isinstance(k, str) for k in node):
                return {"d": {k: walk(v) for k, v in node.items()}}
            return {"m": [[walk(k), walk(v)] for k, v in node.items()]}  # int or tuple keys (JSON's are strings)
        if isinstance(node, list | tuple):
            return {"l" if isinstance(node, list) else "u": [walk(v) for v in node]}
        if type(node) is set:
            return {"s": [walk(v) for v in node]}
        if node is None or isinstance(node, bool | int | float | str):
            return {"v": node}
        raise TypeError(f"a {type(node).__name__} cannot be sent to or from a Flower client (tensors and plain values)")

    shape = walk(plain_state(tree))
    sendable, dtypes = _sendable(tensors)
    config = ConfigRecord({SHAPE_KEY: json.dumps(shape)})
    if dtypes:
        config[DTYPES_KEY] = json.dumps(dtypes)
    return ArrayRecord(torch_state_dict=sendable), config


def unpack(arrays: ArrayRecord, shape: ConfigRecord) -> Any:
    """The tree that :func:`pack` packed into ``arrays`` and ``shape``."""
    tensors = arrays.to_torch_state_dict() if len(arrays) else {}
    if DTYPES_KEY in shape:
        tensors = _received(tensors, json.loads(str(shape[DTYPES_KEY])))

    def build(node: dict[str, Any]) -> Any:
        kind, value = next(iter(node.items()))
        if kind == "t":
            return tensors[value]
        if kind == "d":
            return {k: build(v) for k, v in value.items()}
        if kind == "m":
            return {build(k): build(v) for k, v in value}
        if kind == "l":
            return [build(v) for v in value]
        if kind == "u":
            return tuple(build(v) for v in value)
        if kind == "s":
            return {build(v) for v in value}
        return value

    return restore_state(build(json.loads(str(shape[SHAPE_KEY]))))


def put_tree(content: RecordDict, name: str, tree: Any) -> None:
    """Pack ``tree`` into ``content`` under ``<name>.arrays`` and ``<name>.shape``."""
    arrays, shape = pack(tree)
    content[f"{name}.arrays"] = arrays
    content[f"{name}.shape"] = shape


def get_tree(content: RecordDict, name: str) -> Any:
    """The tree :func:`put_tree` put into ``content`` under ``name`` (``None`` when there is none)."""
    if f"{name}.shape" not in content:
        return None
    arrays = content[f"{name}.arrays"]
    shape = content[f"{name}.shape"]
    assert isinstance(arrays, ArrayRecord) and isinstance(shape, ConfigRecord)
    return unpack(arrays, shape)


def put_weights(content: RecordDict, name: str, weights: Mapping[str, Tensor]) -> None:
    """A model's state dict into ``content[name]`` (an ``ArrayRecord``, on the CPU).

    The dtypes of widened tensors (:data:`WIDENED`) go into ``content["<name>.dtypes"]``.
    """
    sendable, dtypes = _sendable(weights)
    content[name] = ArrayRecord(torch_state_dict=sendable)
    if dtypes:
        content[f"{name}.{DTYPES_KEY}"] = ConfigRecord({DTYPES_KEY: json.dumps(dtypes)})


def get_weights(content: RecordDict, name: str, device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """The state dict :func:`put_weights` put into ``content[name]``, on ``device``, in its own dtypes."""
    record = content[name]
    assert isinstance(record, ArrayRecord)
    tensors: Mapping[str, Tensor] = record.to_torch_state_dict()
    if f"{name}.{DTYPES_KEY}" in content:
        dtypes = content[f"{name}.{DTYPES_KEY}"]
        assert isinstance(dtypes, ConfigRecord)
        tensors = _received(tensors, json.loads(str(dtypes[DTYPES_KEY])))
    return {k: v.to(device) for k, v in tensors.items()}

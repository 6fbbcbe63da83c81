"""What travels between the ServerApp and a ClientApp, packed into Flower records.

A round's instruction to a client holds the global weights (an ``ArrayRecord``), the method's payload (what its
``on_round_start`` returned), and the client's part of the round plan (a ``ConfigRecord``); the reply holds the local
weights, the method's upload (what its ``on_client_end`` returned) and the client's mean training loss. A payload, an
upload or a client's persistent state is any nest of dicts, lists and tuples whose leaves are tensors or plain values
(``None``, numbers, strings): :func:`pack` puts its tensors in an ``ArrayRecord`` and its shape, with the plain
values, in a ``ConfigRecord``; :func:`unpack` rebuilds it. Tensors travel as NumPy arrays of the same dtype, so the
values arrive bit for bit.

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

#: The ``ConfigRecord`` key holding a packed tree's shape.
SHAPE_KEY = "shape"


def pack(tree: Any) -> tuple[ArrayRecord, ConfigRecord]:
    """``tree``'s tensors (an ``ArrayRecord``, on the CPU) and its shape with the plain values (a ``ConfigRecord``).

    Raises ``TypeError`` for a leaf that is neither a tensor nor a plain value.
    """
    tensors: dict[str, Tensor] = {}

    def walk(node: Any) -> Any:
        if isinstance(node, Tensor):
            key = str(len(tensors))
            tensors[key] = node.detach().cpu()
            return {"t": key}
        if isinstance(node, Mapping):
            if not all(isinstance(k, str) for k in node):
                raise TypeError("only dicts with string keys can be sent to or from a Flower client")
            return {"d": {k: walk(v) for k, v in node.items()}}
        if isinstance(node, list | tuple):
            return {"l" if isinstance(node, list) else "u": [walk(v) for v in node]}
        if node is None or isinstance(node, bool | int | float | str):
            return {"v": node}
        raise TypeError(f"a {type(node).__name__} cannot be sent to or from a Flower client (tensors and plain values)")

    shape = walk(tree)
    return ArrayRecord(torch_state_dict=tensors), ConfigRecord({SHAPE_KEY: json.dumps(shape)})


def unpack(arrays: ArrayRecord, shape: ConfigRecord) -> Any:
    """The tree that :func:`pack` packed into ``arrays`` and ``shape``."""
    tensors = arrays.to_torch_state_dict() if len(arrays) else {}

    def build(node: dict[str, Any]) -> Any:
        kind, value = next(iter(node.items()))
        if kind == "t":
            return tensors[value]
        if kind == "d":
            return {k: build(v) for k, v in value.items()}
        if kind == "l":
            return [build(v) for v in value]
        if kind == "u":
            return tuple(build(v) for v in value)
        return value

    return build(json.loads(str(shape[SHAPE_KEY])))


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
    """A model's state dict into ``content[name]`` (an ``ArrayRecord``, on the CPU)."""
    content[name] = ArrayRecord(torch_state_dict={k: v.detach().cpu() for k, v in weights.items()})


def get_weights(content: RecordDict, name: str, device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """The state dict :func:`put_weights` put into ``content[name]``, on ``device``."""
    record = content[name]
    assert isinstance(record, ArrayRecord)
    return {k: v.to(device) for k, v in record.to_torch_state_dict().items()}

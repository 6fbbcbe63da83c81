"""What the server hands to a method each round (:class:`ServerContext`) and to each client (:class:`ClientContext`).

These two objects are the only channel between the federation and a method. Down: what the method's
``on_round_start`` returns (FedSSD's credibility matrix, SCAFFOLD's server control) reaches every client of the round
as ``ClientContext.server``. Up: what ``on_client_end`` returns (SCAFFOLD's control delta, FedCurv's Fisher) is
reduced over the round's clients and handed to ``server_update``. State that outlives a round lives in
``ServerContext.state`` (server) and ``ClientContext.state`` (one per client); both are checkpointed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from fl_lightning.core.messages import short


def _batches(
    x: Tensor, y: Tensor, transform: Callable[[Tensor, bool], Tensor], device: torch.device, batch_size: int
) -> Iterator[tuple[Tensor, Tensor]]:
    for start in range(0, len(y), batch_size):
        xb = x[start : start + batch_size].to(device, non_blocking=True)
        yield transform(xb, False), y[start : start + batch_size].to(device, non_blocking=True)


@dataclass
class ServerContext:
    """The server's view at the start of a round, before the global model is sent.

    Attributes:
        round: 0-based round index.
        clients: the clients sampled this round (sorted).
        weights: their aggregation weights p_k (sample-size or uniform, per ``--federation.aggregation``), sum 1.
        num_clients: N, the number of clients in the federation.
        global_weights: the global model's state dict this round (on the device; do not modify); filled in right
            after ``on_round_start``, so that what that hook sets in the module reaches every client.
        param_keys: the state-dict keys of trainable parameters (the other keys are buffers).
        state: the method's persistent server state (checkpointed; tensors on the device).
        aux_x: the server's held-out images (uint8), ``holdout_per_class`` per class; never given to clients.
        aux_y: their labels.
        num_classes: number of classes C.
        client_class_counts: int64 ``[N, C]`` label counts of every client.
        transform: maps a uint8 batch to the normalised float batch the model expects (``transform(x, train)``).
        device: the training device.
    """

    round: int
    clients: tuple[int, ...]
    weights: tuple[float, ...]
    num_clients: int
    global_weights: dict[str, Tensor]
    param_keys: frozenset[str]
    state: dict[str, Any]
    aux_x: Tensor
    aux_y: Tensor
    num_classes: int
    client_class_counts: Tensor
    transform: Callable[[Tensor, bool], Tensor]
    device: torch.device

    def aux_batches(self, batch_size: int = 1024) -> Iterator[tuple[Tensor, Tensor]]:
        """The held-out data as normalised (images, labels) batches on the training device."""
        return _batches(self.aux_x, self.aux_y, self.transform, self.device, batch_size)


@dataclass
class ClientContext:
    """Everything a client knows when it starts its local update.

    Attributes:
        round: 0-based round index.
        client: the client's id.
        num_samples: n_k, the client's training samples.
        class_counts: int64 ``[C]``, the client's label counts n_{k,c}.
        steps: K, the local optimizer steps it takes this round.
        lr: its learning rate this round.
        weight: its aggregation weight p_k this round.
        server: what the method's ``on_round_start`` returned this round (same object for every client).
        state: this client's persistent state, kept by the server between rounds and in checkpoints; its tensors
            are on the device during the update and stored on the CPU (or disk) between rounds.
        global_weights: the state dict the client started from (on the device; do not modify).
        read_data: returns the client's raw training inputs and labels (on the CPU); read through :attr:`x` and
            :attr:`y`, which call it once, on first use, so a streamed client is read only by methods that look.
        transform: see :class:`ServerContext`.
        device: the training device.
        generator: a CPU generator seeded by (seed, round, client) for the client's own random choices.
    """

    round: int
    client: int
    num_samples: int
    class_counts: Tensor
    steps: int
    lr: float
    weight: float
    server: dict[str, Any]
    state: dict[str, Any]
    global_weights: dict[str, Tensor]
    read_data: Callable[[], tuple[Tensor, Tensor]] = field(repr=False)
    transform: Callable[[Tensor, bool], Tensor]
    device: torch.device
    generator: torch.Generator = field(default_factory=torch.Generator)

    @functools.cached_property
    def _data(self) -> tuple[Tensor, Tensor]:
        return self.read_data()

    @property
    def x(self) -> Tensor:
        """The client's raw training inputs (as stored, e.g. uint8; on the CPU)."""
        return self._data[0]

    @property
    def y(self) -> Tensor:
        """Their labels."""
        return self._data[1]

    def batches(self, batch_size: int = 1024) -> Iterator[tuple[Tensor, Tensor]]:
        """The client's own data, normalised and not augmented, as batches on the training device."""
        return _batches(self.x, self.y, self.transform, self.device, batch_size)


def checked_payload(method: str, payload: Any) -> dict[str, Any]:
    """What ``method``'s ``on_round_start`` returned, refused in one line unless it is a dict.

    >>> checked_payload("Mine", [1])
    Traceback (most recent call last):
    ...
    TypeError: Mine.on_round_start must return a dict (every client of the round receives it as client.server), got [1]
    """
    if not isinstance(payload, Mapping):
        raise TypeError(
            f"{method}.on_round_start must return a dict (every client of the round receives it as client.server), "
            f"got {short(payload)}"
        )
    return dict(payload)


def checked_upload(method: str, upload: Any) -> Mapping[str, Tensor]:
    """What ``method``'s ``on_client_end`` returned (``None``: nothing), refused in one line unless a dict of tensors.

    >>> checked_upload("Mine", {"seen": 1.0})
    Traceback (most recent call last):
    ...
    TypeError: Mine.on_client_end must return a dict of tensors (the client's upload) or None; 'seen' is float 1.0
    """
    if upload is None:
        return {}
    where = f"{method}.on_client_end must return a dict of tensors (the client's upload) or None"
    if not isinstance(upload, Mapping):
        raise TypeError(f"{where}, got {short(upload)}")
    for key, value in upload.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            raise TypeError(f"{where}; {key!r} is {type(value).__name__} {short(value)}")
    return upload


def checked_weights(method: str, weights: Any, average: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """What ``method``'s ``server_update`` returned, refused in one line unless a state dict with ``average``'s keys.

    >>> checked_weights("Mine", None, {"w": torch.zeros(1)})
    Traceback (most recent call last):
    ...
    TypeError: Mine.server_update must return the new global state dict (the keys of `average`), got None
    """
    where = f"{method}.server_update must return the new global state dict (the keys of `average`)"
    if not isinstance(weights, Mapping):
        raise TypeError(f"{where}, got {short(weights)}")
    missing, extra = sorted(set(average) - set(weights)), sorted(set(weights) - set(average))
    if missing or extra:
        keys = [f"{what} {names[:5]}" for what, names in (("missing", missing), ("unexpected", extra)) if names]
        raise TypeError(f"{where}; {', '.join(keys)}")
    wrong = next((k for k, v in weights.items() if not isinstance(v, Tensor)), None)
    if wrong is not None:
        raise TypeError(f"{where}; {wrong!r} is {type(weights[wrong]).__name__}, not a tensor")
    return dict(weights)

"""What the server hands to a method each round (:class:`ServerContext`) and to each client (:class:`ClientContext`).

These two objects are the only channel between the federation and a method: server-side state such as FedSSD's
credibility matrix or FedKA's shared set is returned by the method's ``on_round_start`` and delivered to every
client of the round in ``ClientContext.server``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


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
        clients: the clients sampled this round.
        aux_x: the server's held-out images (uint8), ``holdout_per_class`` per class; never given to clients.
        aux_y: their labels.
        num_classes: number of classes C.
        client_class_counts: int64 ``[N, C]`` label counts of every client.
        transform: maps a uint8 batch to the normalised float batch the model expects (``transform(x, train)``).
        device: the training device.
    """

    round: int
    clients: tuple[int, ...]
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
        steps: local optimizer steps it will take this round.
        lr: its learning rate this round.
        server: what the method's ``on_round_start`` returned this round (same object for every client).
        state: this client's persistent state, kept by the server between rounds and in checkpoints.
        x: the client's raw training images (uint8, on the CPU).
        y: their labels.
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
    server: dict[str, Any]
    state: dict[str, Any]
    x: Tensor
    y: Tensor
    transform: Callable[[Tensor, bool], Tensor]
    device: torch.device
    generator: torch.Generator = field(default_factory=torch.Generator)

    def batches(self, batch_size: int = 1024) -> Iterator[tuple[Tensor, Tensor]]:
        """The client's own data, normalised and not augmented, as batches on the training device."""
        return _batches(self.x, self.y, self.transform, self.device, batch_size)

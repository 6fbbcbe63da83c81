"""One round's training data as Lightning's training loop receives it: each planned client's local batches.

:class:`RoundBatches` is the round's iterable: one :class:`ClientBatches` per client (its data and the positions of
its local batches), a :class:`StreamedClientBatches` when the data is read from a dataset, a :class:`ClientGroup` of
several clients for the batched engine, or every local ``(x, y)`` batch in turn. A client's batches are shuffled by a
generator seeded by (seed, round, client), so a round's batches do not depend on what ran before it.

>>> import torch
>>> from fl_lightning.core.rounds import RoundPlan
>>> x, y = torch.arange(10.0).unsqueeze(1), torch.arange(10) % 2
>>> plan = RoundPlan(round=0, clients=(1,), steps=(2,), local_epochs=1, lr_scale=1.0)
>>> batches = RoundBatches(x, y, [torch.arange(0, 6), torch.arange(6, 10)], plan, batch_size=2, drop_last=False, seed=0)
>>> [len(client) for client in batches]
[2]
>>> sorted(int(v) for client in batches for xb, _ in client for v in xb)
[6, 7, 8, 9]
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from fl_lightning.core.rounds import RoundPlan, client_steps, round_seed
from fl_lightning.core.sources import DatasetReader

__all__ = ["AUGMENT_STREAM", "ClientBatches", "ClientGroup", "RoundBatches", "StreamedClientBatches"]

#: The last-but-one part of a local batch's augmentation seed, (seed, round, client, AUGMENT_STREAM, position): a stream
#: apart from a client's own (1) and its context's generator (2).
AUGMENT_STREAM = 3


class ClientBatches:
    """One client's local batches of a round, in training order; iterating yields ``(x, y)`` after ``transform``.

    It is one item of :class:`RoundBatches`: the client's data (``x``, ``y``, stored once) and the positions of
    each local batch in it (``batches``). Lightning moves it to the device as a whole and one ``training_step``
    trains on all of it, so the per-batch cost of Lightning's loop is paid once per client instead of once per local
    step. Batches are gathered and transformed (augmentation, normalisation) lazily, just before each step, in the
    same order as a per-batch loop would.
    """

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        batches: list[Tensor],
        transform: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        self.x, self.y, self.batches, self.transform = x, y, batches, transform

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        for pos in self.batches:
            x = self.x[pos]
            yield (self.transform(x) if self.transform is not None else x), self.y[pos]

    def to(self, device: torch.device | str, **kwargs: Any) -> ClientBatches:
        """The same batches on ``device`` (Lightning's batch transfer calls this); the positions in one copy."""
        batches, target = self.batches, torch.device(device)
        at = batches[0].device if batches else target
        if at.type != target.type or target.index not in (None, at.index):
            batches = list(torch.cat(batches).to(device, **kwargs).split([len(b) for b in batches]))
        return ClientBatches(self.x.to(device, **kwargs), self.y.to(device, **kwargs), batches, self.transform)

    def with_transform(self, transform: Callable[[Tensor], Tensor]) -> ClientBatches:
        """The same batches, each passed through ``transform`` when iterated."""
        return ClientBatches(self.x, self.y, self.batches, transform)


class _RoundStream:
    """One round's local batches of all its clients, read once, in order, through one loader."""

    def __init__(self, reader: DatasetReader, index_batches: list[list[int]]) -> None:
        self.reader, self.index_batches = reader, index_batches
        self._it: Iterator[tuple[Tensor, Tensor]] | None = None
        self._pos = 0

    def take(self, start: int, count: int) -> Iterator[tuple[Tensor, Tensor]]:
        """Batches ``start .. start + count - 1`` of the round (a client's); clients must be read in order."""
        if self._it is None:
            self._it = self.reader.batches(self.index_batches)
        if self._pos > start:
            raise RuntimeError("a streamed round's clients are read once each, in order; this one was already read")
        while self._pos < start:  # the previous client stopped early: skip the rest of its batches
            next(self._it)
            self._pos += 1
        for _ in range(count):
            batch = next(self._it)
            self._pos += 1
            yield batch


class StreamedClientBatches:
    """A :class:`ClientBatches` whose batches are read from the dataset as they are trained on.

    Items are read through the round's ``DataLoader`` (workers, pinned memory), moved to ``device`` batch by batch,
    then transformed; the positions are those of the in-memory path.
    """

    def __init__(
        self,
        stream: _RoundStream,
        start: int,
        count: int,
        transform: Callable[[Tensor], Tensor] | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        self.stream, self.start, self.count = stream, start, count
        self.transform, self.device = transform, device

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        non_blocking = self.stream.reader.pin_memory
        for x, y in self.stream.take(self.start, self.count):
            if self.device is not None:
                x, y = x.to(self.device, non_blocking=non_blocking), y.to(self.device, non_blocking=non_blocking)
            yield (self.transform(x) if self.transform is not None else x), y

    def to(self, device: torch.device | str, **kwargs: Any) -> StreamedClientBatches:
        """The same batches, each moved to ``device`` when read (Lightning's batch transfer calls this)."""
        return StreamedClientBatches(self.stream, self.start, self.count, self.transform, device)

    def with_transform(self, transform: Callable[[Tensor], Tensor]) -> StreamedClientBatches:
        """The same batches, each passed through ``transform`` when iterated."""
        return StreamedClientBatches(self.stream, self.start, self.count, transform, self.device)


class ClientGroup:
    """Several clients' local batches of a round, trained together by the batched engine as one training batch.

    ``run`` is attached by the engine when the batch starts (:class:`~fl_lightning.batched.BatchedClients`); the
    method's ``training_step`` calls it.
    """

    def __init__(self, clients: list[ClientBatches]) -> None:
        self.clients = clients
        self.run: Callable[..., Tensor | None] | None = None

    def __len__(self) -> int:
        return len(self.clients)

    def to(self, device: torch.device | str, **kwargs: Any) -> ClientGroup:
        """The same clients' batches on ``device`` (Lightning's batch transfer calls this)."""
        return ClientGroup([c.to(device, **kwargs) for c in self.clients])

    def with_transform(self, transform: Callable[[Tensor], Tensor]) -> ClientGroup:
        """The same batches, each passed through ``transform`` when iterated."""
        return ClientGroup([c.with_transform(transform) for c in self.clients])


class RoundBatches:
    """Iterable over one round's clients: each planned client in turn, as a :class:`ClientBatches`.

    A client's batches are its ``local_epochs`` shuffled passes over its data. With ``flat=True`` it yields every
    local ``(x, y)`` batch of every client in order instead (for modules that train one Lightning batch per step);
    with ``group=n``, a :class:`ClientGroup` of up to ``n`` consecutive clients per item (the batched engine).

    Shuffling uses a generator seeded by (seed, round, client), so a round's batches do not depend on what ran
    before it; that is what makes an interrupted run resume bit-for-bit. With ``flat=True`` each yielded batch also
    queues its own augmentation seed, (seed, round, client, its position) in :attr:`augment_seeds`: batches are
    transformed after Lightning moves them, before the step's hooks, where the global generator still holds the
    previous client's draws, so the datamodule takes the batch's seed from the queue (Lightning transfers batches in
    the order it fetched them, whatever it fetches ahead). When ``x`` is a :class:`DatasetReader`
    (data too large for memory) the same positions are read through its ``DataLoader``, only for the round's clients.

    Args:
        x: the training inputs, as a tensor or a reader of the training items (positions as in ``y``).
        y: the training labels.
        client_indices: each client's positions in ``x``.
        plan: the round.
        batch_size: local batch size.
        drop_last: drop each client's last incomplete batch of an epoch.
        seed: seed of the shuffling.
        flat: iterate over single local batches rather than over clients.
        group: iterate over groups of this many clients (``None``: one client per item).
    """

    def __init__(
        self,
        x: Tensor | DatasetReader,
        y: Tensor,
        client_indices: list[Tensor],
        plan: RoundPlan,
        batch_size: int,
        drop_last: bool,
        seed: int,
        flat: bool = False,
        group: int | None = None,
    ) -> None:
        if group is not None and (flat or isinstance(x, DatasetReader) or group < 1):
            raise ValueError("client groups need in-memory data, whole clients per item and a group size >= 1")
        self.group = group
        self.x, self.y = x, y
        self.client_indices = client_indices
        self.plan = plan
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.seed = seed
        self.flat = flat
        #: With ``flat``, the augmentation seed of each batch yielded and not yet taken, oldest first.
        self.augment_seeds: collections.deque[int] = collections.deque()

    def __len__(self) -> int:
        if self.group is not None:
            return -(-len(self.plan.clients) // self.group)
        if not self.flat:
            return len(self.plan.clients)
        return sum(
            client_steps(self.client_indices[c].numel(), self.batch_size, self.plan.local_epochs, self.drop_last)
            for c in self._trained()
        )

    def __iter__(self) -> Iterator[ClientGroup | ClientBatches | StreamedClientBatches | tuple[Tensor, Tensor]]:
        if self.group is not None:  # one group's clients in memory at a time
            clients = self._clients()
            while group := list(itertools.islice(clients, self.group)):
                yield ClientGroup(group)
        elif self.flat:
            self.augment_seeds.clear()
            for seed, batch in zip(self._batch_seeds(), self.batches(), strict=True):
                self.augment_seeds.append(seed)
                yield batch
        elif isinstance(self.x, DatasetReader):
            # client -1: an empty update that keeps processes in step (Federation.local_plan)
            per_client = [self._index_batches(c) if c >= 0 else [] for c in self.plan.clients]
            stream = _RoundStream(self.x, [b for client in per_client for b in client])
            start = 0
            for batches in per_client:
                yield StreamedClientBatches(stream, start, len(batches))
                start += len(batches)
        else:
            yield from self._clients()

    def _clients(self) -> Iterator[ClientBatches]:
        assert isinstance(self.x, Tensor)
        for client in self.plan.clients:
            if client < 0:  # padding that keeps processes in step (Federation.local_plan)
                yield ClientBatches(self.x[:0], self.y[:0], [])
                continue
            idx = self.client_indices[client]
            yield ClientBatches(self.x[idx], self.y[idx], list(self._positions(client)))

    def _positions(self, client: int) -> Iterator[Tensor]:
        """Positions, within the client's data, of each of its local batches this round, in training order."""
        bs = self.batch_size
        n = self.client_indices[client].numel()
        gen = torch.Generator().manual_seed(round_seed(self.seed, self.plan.round, client))
        stop = n - n % bs if self.drop_last else n
        for _ in range(self.plan.local_epochs):
            perm = torch.randperm(n, generator=gen)
            for start in range(0, stop, bs):
                yield perm[start : start + bs]

    def _trained(self) -> list[int]:
        """The plan's clients that train, without the padding (client -1) that keeps processes in step."""
        return [client for client in self.plan.clients if client >= 0]

    def _batch_seeds(self) -> Iterator[int]:
        """The augmentation seed of every local batch of the round, in :meth:`batches`' order."""
        for client in self._trained():
            n = self.client_indices[client].numel()
            for pos in range(client_steps(n, self.batch_size, self.plan.local_epochs, self.drop_last)):
                yield round_seed(self.seed, self.plan.round, client, AUGMENT_STREAM, pos)

    def _index_batches(self, client: int) -> list[list[int]]:
        """The client's local batches as lists of positions in ``x``."""
        idx = self.client_indices[client]
        return [idx[pos].tolist() for pos in self._positions(client)]

    def batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        """Every local batch of the round, client after client, gathered from the full data (for hand-written loops)."""
        if isinstance(self.x, DatasetReader):
            yield from self.x.batches([b for c in self._trained() for b in self._index_batches(c)])
            return
        for client in self._trained():
            idx = self.client_indices[client]
            for pos in self._positions(client):
                batch = idx[pos]
                yield self.x[batch], self.y[batch]

"""Server-side arithmetic on model state dicts: weighted averaging and its accumulating form."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

StateDict = Mapping[str, Tensor]


def aggregation_weights(num_samples: Sequence[int], scheme: str = "weighted") -> list[float]:
    """Client weights for averaging: ``n_k / Σn`` (``"weighted"``, FedAvg) or ``1/K`` (``"uniform"``).

    >>> aggregation_weights([1, 3])
    [0.25, 0.75]
    >>> aggregation_weights([1, 3], "uniform")
    [0.5, 0.5]
    """
    if not num_samples:
        raise ValueError("aggregation needs at least one client")
    if scheme == "weighted":
        total = float(sum(num_samples))
        if total <= 0:
            raise ValueError("weighted aggregation needs clients with samples")
        return [n / total for n in num_samples]
    if scheme == "uniform":
        return [1.0 / len(num_samples)] * len(num_samples)
    raise ValueError(f"unknown aggregation {scheme!r}; choose 'weighted' or 'uniform'")


def weighted_average(states: Sequence[StateDict], weights: Sequence[float]) -> dict[str, Tensor]:
    """``w = Σ_k weights[k] · w_k`` for every floating-point entry; integer entries are taken from the first state.

    Integer buffers such as BatchNorm's ``num_batches_tracked`` are counters, not parameters, so they are not
    averaged (docs/source/methods.md, "Shared server round").

    >>> a = {"w": torch.tensor([0.0, 2.0]), "n": torch.tensor(3)}
    >>> b = {"w": torch.tensor([4.0, 6.0]), "n": torch.tensor(5)}
    >>> out = weighted_average([a, b], [0.25, 0.75])
    >>> out["w"].tolist(), int(out["n"])
    ([3.0, 5.0], 3)
    """
    if len(states) != len(weights) or not states:
        raise ValueError(f"need one weight per state, got {len(states)} states and {len(weights)} weights")
    acc = StateAccumulator()
    for state, weight in zip(states, weights, strict=True):
        acc.add(state, weight)
    return acc.result()


class StateAccumulator:
    """Running ``Σ_k weight_k · w_k`` that never holds more than one extra copy of the model.

    Sums are kept in float64 so that the result does not depend on the order clients are added in (or on how they
    are split across processes) beyond float64 rounding; :meth:`result` casts back to each entry's dtype. Integer
    entries (BatchNorm's ``num_batches_tracked``) are counters, not parameters: the first client's are kept, where
    "first" is the lowest ``order`` passed to :meth:`add`.
    """

    def __init__(self) -> None:
        self._sums: dict[str, Tensor] = {}
        self._first: dict[str, Tensor] = {}
        self._first_order: float = float("inf")
        self.count = 0

    def add(self, state: StateDict, weight: float, order: int | None = None) -> None:
        """Add ``weight · state`` (``order``: the client's position in the round, for the integer entries)."""
        order = self.count if order is None else order
        keep_ints = order < self._first_order
        if keep_ints:
            self._first_order = order
        with torch.no_grad():
            for name, value in state.items():
                if not torch.is_floating_point(value):
                    if keep_ints:
                        self._first[name] = value.detach().clone()
                    continue
                if name not in self._sums:
                    self._sums[name] = value.detach().to(torch.float64) * weight
                else:
                    self._sums[name].add_(value.detach().to(torch.float64), alpha=weight)
        self.count += 1

    def result(self, dtypes: Mapping[str, torch.dtype] | None = None) -> dict[str, Tensor]:
        """The accumulated sum, cast back to each entry's original dtype when ``dtypes`` is given (else float32)."""
        out: dict[str, Tensor] = {}
        for name, value in self._sums.items():
            out[name] = value.to(dtypes[name] if dtypes is not None else torch.float32)
        out.update(self._first)
        return out

    def all_reduce(self) -> None:
        """Sum the accumulators of every process (no-op in a single process); keep the first client's integers."""
        from fl_lightning.core import distributed

        if not distributed.is_distributed():
            return
        distributed.all_reduce_sum_(self._sums)
        firsts = distributed.all_gather_object((self._first_order, {k: v.cpu() for k, v in self._first.items()}))
        order, ints = min(firsts, key=lambda item: item[0])
        device = next(iter(self._sums.values())).device if self._sums else torch.device("cpu")
        self._first_order = order
        self._first = {k: v.to(device) for k, v in ints.items()}


class UploadAccumulator:
    """The round's uploads reduced over clients: ``Σ_k p_k·u_k`` per key, or ``Σ_k u_k`` for ``"sum"`` keys.

    >>> acc = UploadAccumulator({"n": "sum"})
    >>> acc.add({"d": torch.tensor([2.0]), "n": torch.tensor(1.0)}, 0.25)
    >>> acc.add({"d": torch.tensor([6.0]), "n": torch.tensor(1.0)}, 0.75)
    >>> {k: v.tolist() for k, v in acc.result().items()}
    {'d': [5.0], 'n': 2.0}
    """

    def __init__(self, reduce: Mapping[str, str] | None = None) -> None:
        self.reduce = dict(reduce or {})
        for key, mode in self.reduce.items():
            if mode not in ("mean", "sum"):
                raise ValueError(f"upload {key!r}: reduce must be 'mean' or 'sum', got {mode!r}")
        self._sums: dict[str, Tensor] = {}
        self._dtypes: dict[str, torch.dtype] = {}

    def add(self, upload: Mapping[str, Tensor], weight: float) -> None:
        """Add one client's upload with its aggregation weight."""
        with torch.no_grad():
            for name, value in upload.items():
                value = torch.as_tensor(value).detach()
                scale = 1.0 if self.reduce.get(name, "mean") == "sum" else weight
                term = value.to(torch.float64) * scale
                if name in self._sums:
                    self._sums[name].add_(term.to(self._sums[name].device))
                else:
                    self._sums[name] = term
                    self._dtypes[name] = value.dtype if torch.is_floating_point(value) else torch.float32

    def all_reduce(self) -> None:
        """Sum over processes (no-op in a single process); every process must have uploaded the same keys."""
        from fl_lightning.core import distributed

        distributed.all_reduce_sum_(self._sums)

    def result(self) -> dict[str, Tensor]:
        """The reduced uploads, in each key's original floating dtype."""
        return {name: value.to(self._dtypes[name]) for name, value in self._sums.items()}

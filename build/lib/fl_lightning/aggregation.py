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
    averaged (METHODS.md, "Shared server round").

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

    Sums are kept in float32 (float64 for float64 entries) so that half-precision weights average exactly enough.
    """

    def __init__(self) -> None:
        self._sums: dict[str, Tensor] = {}
        self._first: dict[str, Tensor] = {}
        self.count = 0
        self.total_weight = 0.0

    def add(self, state: StateDict, weight: float) -> None:
        """Add ``weight · state``."""
        with torch.no_grad():
            for name, value in state.items():
                if not torch.is_floating_point(value):
                    if self.count == 0:
                        self._first[name] = value.detach().clone()
                    continue
                dtype = torch.float64 if value.dtype == torch.float64 else torch.float32
                if self.count == 0:
                    self._sums[name] = value.detach().to(dtype) * weight
                else:
                    self._sums[name].add_(value.detach().to(dtype), alpha=weight)
        self.count += 1
        self.total_weight += weight

    def result(self, dtypes: Mapping[str, torch.dtype] | None = None) -> dict[str, Tensor]:
        """The accumulated average, cast back to each entry's original dtype when ``dtypes`` is given."""
        out: dict[str, Tensor] = {}
        for name, value in self._sums.items():
            out[name] = value.to(dtypes[name]) if dtypes is not None else value
        out.update(self._first)
        return out

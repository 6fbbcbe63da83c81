"""GPU memory of stacked clients: what one stacked client costs, and the group size that fits a budget.

The batched engine stacks a group of clients into one model; its memory grows with the group (each client's
weights, gradients, momentum, activations and static inputs). :class:`PeakMemory` measures the peak a block of work
allocates on a CUDA device; :class:`StackedMemory` keeps the largest cost per client seen; :func:`fitting_group`
turns a budget into a group size.

>>> fitting_group(budget=8 * 2**30, base=2**30, per_client=2**30, clients=10)
7
>>> fitting_group(budget=2**30, base=2**30, per_client=2**30, clients=10)
1
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import TracebackType

import torch

MIB = 2**20
GIB = 2**30


def fitting_group(budget: float, base: float, per_client: float, clients: int) -> int:
    """The most clients (at least 1, at most ``clients``) whose ``base + n · per_client`` bytes fit in ``budget``."""
    if per_client <= 0:
        return max(1, clients)
    return max(1, min(clients, math.floor((budget - base) / per_client)))


def memory_budget(device: torch.device, budget_gb: float | None, share: float = 0.9) -> float:
    """Bytes the stacked clients may use on ``device``: ``budget_gb`` GiB, or ``share`` of its free memory now."""
    if budget_gb is not None:
        return budget_gb * GIB
    free, _ = torch.cuda.mem_get_info(device)
    return share * free


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.bytes``: the most the block held above its start.

    On a device other than CUDA it measures nothing (``bytes`` stays 0).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.start = 0
        self.bytes = 0

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if self.cuda:
            self.bytes = max(0, torch.cuda.max_memory_allocated(self.device) - self.start)


@dataclass
class StackedMemory:
    """The largest peak per stacked client measured so far (bytes; 0 before the first, or off CUDA)."""

    per_client: float = 0.0
    #: The group whose peak gave :attr:`per_client`: its size and its peak (bytes).
    group: int = 0
    peak: float = 0.0

    def record(self, clients: int, peak: float) -> None:
        """A stack of ``clients`` clients peaked at ``peak`` bytes above its start."""
        if clients > 0 and peak / clients > self.per_client:
            self.per_client, self.group, self.peak = peak / clients, clients, peak

    def describe(self) -> str:
        """One line for the run's output."""
        return (
            f"peak GPU memory {self.per_client / MIB:.1f} MiB per stacked client "
            f"({self.peak / MIB:.0f} MiB for a stack of {self.group})"
        )

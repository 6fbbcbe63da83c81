"""Evaluating a model on labelled batches: test loss, accuracy and class-wise accuracy from summed counts.

One definition serves the federation's global evaluation, its per-client ``eval_local`` and ``test_step``: counts are
summed (in float64) over batches, and over processes when the batches are shared, so the result does not depend on
how the test set is batched or split.

>>> import torch
>>> counts = batch_counts(torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]]), torch.tensor([0, 1, 1]), 2)
>>> result = Evaluation.from_counts(counts)
>>> round(result.acc, 4), result.class_acc.tolist()
(0.6667, [1.0, 0.5])
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DistributedSampler

from fl_lightning.core.distributed import all_reduce_sum_
from fl_lightning.core.models import in_mode

Counts = dict[str, Tensor]


def batch_counts(logits: Tensor, y: Tensor, num_classes: int) -> Counts:
    """Summed cross-entropy ``loss``, and per-class ``correct`` and ``total`` counts, of one batch (float64)."""
    logits = logits.float()
    hit = (logits.argmax(1) == y).double()
    correct = torch.zeros(num_classes, device=logits.device, dtype=torch.float64).index_add_(0, y, hit)
    total = torch.zeros(num_classes, device=logits.device, dtype=torch.float64).index_add_(0, y, torch.ones_like(hit))
    return {"loss": F.cross_entropy(logits, y, reduction="sum").double(), "correct": correct, "total": total}


def add_counts(into: Counts | None, counts: Counts) -> Counts:
    """``into + counts`` key by key (``counts`` itself when ``into`` is None)."""
    if into is None:
        return counts
    for key, value in counts.items():
        into[key] += value
    return into


@dataclass(frozen=True)
class Evaluation:
    """Mean loss, accuracy and class-wise accuracy (0 for a class absent from the data)."""

    loss: float
    acc: float
    class_acc: np.ndarray

    @classmethod
    def from_counts(cls, counts: Counts) -> Evaluation:
        """The evaluation that summed :func:`batch_counts` describe."""
        correct, total = counts["correct"], counts["total"]
        n = float(total.sum())
        class_acc = (correct / total.clamp_min(1)).cpu().numpy()
        return cls(float(counts["loss"]) / n, float(correct.sum()) / n, class_acc)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, Tensor]],
    num_classes: int,
    transform: Callable[[Tensor], Tensor] | None = None,
    device: torch.device | str | None = None,
    context: contextlib.AbstractContextManager | None = None,
    shard: tuple[int, int] = (0, 1),
) -> Evaluation:
    """Evaluate ``model`` (in eval mode, restored afterwards) on raw ``(x, y)`` batches.

    Args:
        model: returns class logits.
        batches: the data, e.g. the test set's raw CPU batches.
        num_classes: number of classes C.
        transform: maps a raw batch on the device to the model's input (e.g. normalisation).
        device: where to evaluate (default: the model's first parameter's device).
        context: wraps the forward passes (e.g. the Trainer's autocast), default none.
        shard: ``(rank, world)``: this process evaluates every ``world``-th batch and the counts are summed over
            processes (every process must call it together); ``(0, 1)`` evaluates every batch here.
    """
    rank, world = shard
    if device is None:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    counts = {
        "loss": torch.zeros((), device=device, dtype=torch.float64),
        "correct": torch.zeros(num_classes, device=device, dtype=torch.float64),
        "total": torch.zeros(num_classes, device=device, dtype=torch.float64),
    }
    with in_mode(model, training=False), context if context is not None else contextlib.nullcontext():
        for i, (xb, yb) in enumerate(batches):
            if i % world != rank:
                continue
            x = xb.to(device)
            x = transform(x) if transform is not None else x
            add_counts(counts, batch_counts(model(x), yb.to(device), num_classes))
    if world > 1:
        all_reduce_sum_(counts)
    return Evaluation.from_counts(counts)


def unpadded(sampler: Any, seen: int, size: int) -> int:
    """How many of the next ``size`` samples a process evaluates, ``seen`` already: its share without the padding.

    Lightning shards a validation or test set over processes with a ``DistributedSampler``, which pads the shares to
    equal size by repeating the first samples; counted, those would be counted twice. With any other sampler (one
    process, or a sampler of your own) every sample counts.

    >>> from torch.utils.data import DistributedSampler
    >>> shares = [DistributedSampler(range(5), num_replicas=2, rank=r, shuffle=False) for r in (0, 1)]
    >>> [list(s) for s in shares], [unpadded(s, 0, 3) for s in shares]
    ([[0, 2, 4], [1, 3, 0]], [3, 2])
    """
    if not isinstance(sampler, DistributedSampler) or sampler.shuffle or sampler.drop_last:
        return size
    own = len(range(sampler.rank, len(sampler.dataset), sampler.num_replicas))  # type: ignore[arg-type]
    return max(0, min(size, own - seen))

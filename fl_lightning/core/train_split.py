"""How the training set is divided: the server's holdout, taken per class, then the rest split across clients.

>>> import numpy as np, torch
>>> from fl_lightning.core.partitions import IID
>>> labels = np.array([0, 1, 2] * 4)
>>> kept, holdout = holdout_split(labels, num_classes=3, per_class=1, seed=0)
>>> len(kept), sorted(labels[holdout.numpy()].tolist())
(9, [0, 1, 2])
>>> indices, counts = split_clients(torch.from_numpy(labels[kept.numpy()]), 3, IID(), 3, seed=0, label="iid")
>>> sorted(len(i) for i in indices), counts.sum(axis=1).tolist()
([3, 3, 3], [3, 3, 3])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fl_lightning.core.messages import option
from fl_lightning.core.partitions import Given, Partitioner, class_counts

__all__ = ["given_after_holdout", "holdout_split", "split_clients"]


def holdout_split(labels: np.ndarray, num_classes: int, per_class: int, seed: int) -> tuple[Tensor, Tensor]:
    """Positions of the kept training samples and of the server's holdout (``per_class`` samples of each class).

    The holdout is drawn by ``np.random.default_rng(seed)``, class after class, and sorted within each class.

    Args:
        labels: every training sample's class.
        num_classes: the number of classes C.
        per_class: samples of each class held out (0: none).
        seed: seed of the draw.

    Raises:
        ValueError: a class has no more than ``per_class`` samples.
    """
    rng = np.random.default_rng(seed)
    keep = np.ones(len(labels), dtype=bool)
    aux: list[np.ndarray] = []
    if per_class:
        for c in range(num_classes):
            members = np.flatnonzero(labels == c)
            if len(members) <= per_class:
                raise ValueError(
                    f"holdout_per_class={per_class} would take every training sample of class {c} "
                    f"({len(members)} samples); lower {option('data.holdout_per_class')}"
                )
            aux.append(np.sort(rng.choice(members, per_class, replace=False)))
        aux_idx = np.concatenate(aux)
        keep[aux_idx] = False
    else:
        aux_idx = np.zeros(0, dtype=np.int64)
    return torch.from_numpy(np.flatnonzero(keep)), torch.from_numpy(aux_idx)


def given_after_holdout(client_ids: np.ndarray, kept: Tensor, num_samples: int) -> Given:
    """A ``given`` partition of the samples left after the holdout.

    Args:
        client_ids: the client of each of the ``num_samples`` training samples.
        kept: positions of the samples left after the holdout.
        num_samples: the number of training samples.
    """
    if len(client_ids) != num_samples:
        raise ValueError(
            f"client_ids has {len(client_ids)} entries for {num_samples} training samples; give one id per sample"
        )
    return Given(client_ids[kept.numpy()])


def split_clients(
    labels: Tensor, num_clients: int, partitioner: Partitioner, num_classes: int, seed: int, label: str
) -> tuple[list[Tensor], np.ndarray]:
    """Each client's positions in ``labels`` and its label counts, as ``partitioner`` splits them.

    Args:
        labels: the class of each sample to split.
        num_clients: the number of clients N.
        partitioner: the split (its ``seed`` argument is ``seed``).
        num_classes: the number of classes C.
        seed: seed of the split.
        label: the partition's name, for error messages.

    Returns:
        The clients' positions (int64 tensors) and their label counts, int64 ``[N, C]``.

    Raises:
        ValueError: the split is not one array of distinct in-range indices per client, or left a client without
            samples. Samples no client holds are allowed (``#C=k`` leaves out the classes no client draws).
    """
    parts = partitioner(labels.numpy(), num_clients, seed=seed)
    check_partition(parts, num_clients, len(labels), label)
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ValueError(
            f"the {label} partition left clients {empty[:10]} without samples; "
            "use fewer clients or a less skewed partition"
        )
    return [torch.as_tensor(p, dtype=torch.long) for p in parts], class_counts(labels.numpy(), parts, num_classes)


def check_partition(parts: Sequence[Any], num_clients: int, num_samples: int, label: str) -> None:
    """Check a partitioner's result: ``num_clients`` integer index arrays into ``num_samples`` samples, disjoint.

    The contract of :class:`~fl_lightning.core.partitions.Partitioner`; a one-line ``ValueError`` says what broke it.

    >>> check_partition([np.array([0, 2]), np.array([1])], 2, 3, "mine")
    >>> check_partition([np.array([0, 2]), np.array([2])], 2, 3, "mine")
    Traceback (most recent call last):
    ...
    ValueError: the mine partition gave sample 2 to more than one client; a partitioner's index arrays must not overlap
    """
    where = f"the {label} partition"
    if isinstance(parts, np.ndarray) and parts.ndim == 2:  # equal-sized clients as the rows of one array
        parts = list(parts)
    if not isinstance(parts, Sequence) or len(parts) != num_clients:
        got = f"{len(parts)} index arrays" if isinstance(parts, Sequence) else type(parts).__name__
        raise ValueError(f"{where} returned {got} for {num_clients} clients; it must return one index array per client")
    arrays = [np.asarray(p) for p in parts]
    bad = next((i for i, a in enumerate(arrays) if a.ndim != 1 or (a.size and a.dtype.kind not in "iu")), None)
    if bad is not None:
        a = arrays[bad]
        raise ValueError(
            f"{where} gave client {bad} a {a.dtype} array of shape {a.shape}; it must be 1-d integer indices"
        )
    flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= num_samples):
        wrong = int(flat.min()) if flat.min() < 0 else int(flat.max())
        raise ValueError(f"{where} gave index {wrong}, outside the {num_samples} training samples [0, {num_samples})")
    seen, counts = np.unique(flat, return_counts=True)
    if (counts > 1).any():
        raise ValueError(
            f"{where} gave sample {int(seen[counts > 1][0])} to more than one client; "
            "a partitioner's index arrays must not overlap"
        )

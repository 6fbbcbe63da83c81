"""Metrics the papers report, and when a global model has collapsed, as pure functions of accuracies and losses."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def forgetting(class_acc_history: Sequence[Sequence[float]] | np.ndarray) -> float:
    """Forgetting F of FedNTD (Lee et al., NeurIPS 2022, arXiv:2106.03097, eq. 5).

    F = (1/C) Σ_c max_{t<T} (A_c(t) − A_c(T)), with A_c(t) the global model's test accuracy on class c at the
    t-th evaluation and T the last one. It is 0 with fewer than two evaluations, and can be negative when every
    class only improved.

    Args:
        class_acc_history: ``[T, C]`` class-wise accuracies, one row per evaluated round, oldest first.

    >>> forgetting([[0.9, 0.5], [0.6, 0.7]])
    0.05
    """
    hist = np.asarray(class_acc_history, dtype=np.float64)
    if hist.ndim != 2:
        raise ValueError(f"class_acc_history must be [T, C], got shape {hist.shape}")
    if len(hist) < 2:
        return 0.0
    return float(np.round(np.mean(np.max(hist[:-1] - hist[-1], axis=0)), 12))


#: How far (relatively) below ln C a test loss must be to count as better than a uniform guess: well above the float32
#: rounding of a mean cross-entropy, whose value for equal logits is ln C.
UNIFORM_LOSS_RTOL = 1e-4


def collapsed(class_acc: Sequence[float] | np.ndarray, test_loss: float) -> bool:
    """Whether a global model has collapsed: right on at most one class, its test loss no lower than a uniform guess's.

    Collapsed: at most one class c has A_c > 0 (the model predicts one class for everything, the papers' "Failed")
    and the mean test cross-entropy is at least ln C, the loss of equal logits over the C classes (within
    :data:`UNIFORM_LOSS_RTOL`). A model that still predicts one class but whose loss has fallen below ln C knows
    something of the labels: it is learning (a slow start), not failed. A non-finite loss counts as collapsed.

    Args:
        class_acc: ``[C]`` the model's test accuracy per class.
        test_loss: its mean test cross-entropy.

    >>> collapsed([0.0, 1.0, 0.0], 1.0986)  # one class, loss ln 3: no better than a uniform guess
    True
    >>> collapsed([0.0, 1.0, 0.0], 1.05)  # one class, but the loss has fallen below ln 3
    False
    >>> collapsed([0.5, 1.0, 0.0], 3.0)  # right on two classes
    False
    """
    accs = np.asarray(class_acc, dtype=np.float64)
    if accs.ndim != 1 or len(accs) < 2:
        raise ValueError(f"class_acc must be [C] with C >= 2, got shape {accs.shape}")
    one_class = int((accs > 0).sum()) <= 1
    return one_class and not test_loss < np.log(len(accs)) * (1 - UNIFORM_LOSS_RTOL)


def rounds_to_target(rounds: Sequence[int], accs: Sequence[float], target: float) -> int | None:
    """The first round whose accuracy reaches ``target`` (None if it never does)."""
    for r, acc in zip(rounds, accs, strict=True):
        if acc >= target:
            return int(r)
    return None


def forgetting_degree(global_acc: np.ndarray, local_acc: np.ndarray, xi: float = 1e-3) -> np.ndarray:
    """Class-wise forgetting degree of FedKA (Chen, Zhu & Zheng, arXiv:2312.02416, §3.1).

    τ_k = (acc(θ_g; k) − acc(θ_local; k)) / (acc(θ_g; k) + ξ), per class k.
    """
    global_acc = np.asarray(global_acc, dtype=np.float64)
    return (global_acc - np.asarray(local_acc, dtype=np.float64)) / (global_acc + xi)

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


#: How far (relatively) below the test labels' entropy a test loss must be to count as better than ignoring the input:
#: well above the float32 rounding of a mean cross-entropy.
PRIOR_LOSS_RTOL = 1e-4


def label_entropy(counts: Sequence[float] | np.ndarray) -> float:
    """H(p) = −Σ_c p_c·ln p_c of the label frequencies p = counts / Σ counts (ln C for C balanced classes).

    The lowest mean cross-entropy a prediction that ignores its input reaches on these labels (by predicting p).

    >>> round(label_entropy([5, 5, 5, 5]), 4)  # ln 4
    1.3863
    >>> label_entropy([3, 0, 0])
    0.0
    """
    n = np.asarray(counts, dtype=np.float64)
    if n.ndim != 1 or (n < 0).any() or n.sum() <= 0:
        raise ValueError(f"counts must be [C] non-negative with a positive sum, got {n.tolist()}")
    p = n[n > 0] / n.sum()
    return max(0.0, float(-(p * np.log(p)).sum()))  # one class: 0.0, not -0.0


def collapsed(
    class_acc: Sequence[float] | np.ndarray, test_loss: float, test_counts: Sequence[float] | np.ndarray
) -> bool:
    """Whether a global model has collapsed: right on at most one class, its loss no better than ignoring the input.

    Collapsed: at most one class c has A_c > 0 (the model predicts one class for everything, the papers' "Failed")
    and the mean test cross-entropy is at least the entropy of the test labels, H(p) (:func:`label_entropy`; ln C
    for balanced classes), within :data:`PRIOR_LOSS_RTOL`. Any prediction that ignores its input scores
    H(p) + KL(p‖q) ≥ H(p) on these labels, so a model that still predicts one class but scores below H(p) reads
    its input: it is learning (a slow start), not failed. A non-finite loss counts as collapsed.

    Args:
        class_acc: ``[C]`` the model's test accuracy per class.
        test_loss: its mean test cross-entropy.
        test_counts: ``[C]`` test samples per class.

    >>> balanced = [10, 10, 10]  # H = ln 3 = 1.0986
    >>> collapsed([0.0, 1.0, 0.0], 1.0986, balanced)  # one class, no better than a uniform guess
    True
    >>> collapsed([0.0, 1.0, 0.0], 1.05, balanced)  # one class, but below what ignoring the input reaches
    False
    >>> collapsed([0.0, 1.0, 0.0], 1.05, [20, 5, 5])  # skewed labels: H = 0.8676, reached by predicting them
    True
    >>> collapsed([0.5, 1.0, 0.0], 3.0, balanced)  # right on two classes
    False
    """
    accs = np.asarray(class_acc, dtype=np.float64)
    if accs.ndim != 1 or len(accs) < 2 or len(accs) != len(test_counts):
        raise ValueError(f"class_acc must be [C] with C >= 2, as test_counts, got {accs.shape} and {len(test_counts)}")
    one_class = int((accs > 0).sum()) <= 1
    return one_class and not test_loss < label_entropy(test_counts) * (1 - PRIOR_LOSS_RTOL)


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

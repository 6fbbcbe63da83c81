"""Metrics the papers report, as pure functions of accuracy histories."""

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

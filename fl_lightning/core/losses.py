"""The methods' losses as pure functions of tensors (the math of ``docs/source/methods.md``).

Conventions: ``logits`` z and ``teacher_logits`` z_g are ``[B, C]``, ``targets`` y are int64 ``[B]``, class masks are
bool ``[C]``. Teacher logits are constants (detached here). Every distillation term uses batch-mean reduction (sum over
classes, mean over samples) and is computed in float32 whatever the input dtype (inputs are cast with ``.float()``),
so that it stays accurate under float16/bfloat16 mixed precision; the losses return float32 scalars. Classes are
removed by gathering columns or with finite masks (a large negative finite fill, or ``torch.where`` on
probabilities), never with ``-inf``, and 0·log 0 is taken as 0 explicitly, so no loss or gradient can become NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.core.models import in_mode

# A finite stand-in for −∞ in float32 logits: exp(_VERY_NEGATIVE − anything reasonable) is exactly 0, and neither it
# nor a logsumexp over a row made only of it overflows.
_VERY_NEGATIVE = -1e30


def _check_tau(tau: float) -> None:
    if not tau > 0:
        raise ValueError(f"temperature tau must be positive, got {tau}")


def _kl_rows(p: Tensor, log_p: Tensor, log_q: Tensor) -> Tensor:
    """Σ_i p_i (log p_i − log q_i) for each row, with the convention 0·log 0 = 0 (entries with p_i = 0 give 0)."""
    return torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(dim=1)


def _masked_log_softmax(x: Tensor, keep: Tensor) -> Tensor:
    """Log-softmax of each row over the entries where ``keep`` is True, and 0 elsewhere.

    Entries that are not kept are filled with a large negative finite number before the normaliser, so they get
    probability exactly 0 and no gradient. A row with no kept entry comes back all zeros (its probabilities must then
    be zeroed by the caller, as :func:`lmd_loss` does).
    """
    masked = x.masked_fill(~keep, _VERY_NEGATIVE)
    out = masked - torch.logsumexp(masked, dim=1, keepdim=True)
    return out.masked_fill(~keep, 0.0)


def _not_true(x: Tensor, targets: Tensor) -> Tensor:
    """The C−1 columns of each row other than its target's, in class order, gathered (``[B, C−1]``)."""
    b, c = x.shape
    idx = torch.arange(c - 1, device=x.device).expand(b, c - 1)
    idx = idx + (idx >= targets.to(x.device)[:, None]).long()  # skip the target column
    return x.gather(1, idx)


def _not_target_mask(targets: Tensor, num_classes: int, device: torch.device) -> Tensor:
    """Bool ``[B, C]``: True at every column except each row's target."""
    cols = torch.arange(num_classes, device=device)
    return cols[None, :] != targets.to(device)[:, None]


def kd_loss(logits: Tensor, teacher_logits: Tensor, tau: float = 1.0) -> Tensor:
    """Knowledge distillation (Hinton et al., arXiv:1503.02531), the KD/FedLSD baseline's distillation term.

    L_KD = τ² · KL(softmax_τ(z_g) ‖ softmax_τ(z)) = τ² · mean_x Σ_c p_g(c) · log(p_g(c) / p(c)),
    p = softmax(z/τ), p_g = softmax(z_g/τ). KD/FedLSD trains with L = (1 − β)·CE(z, y) + β·L_KD.

    Args:
        logits: Student logits z, ``[B, C]``.
        teacher_logits: Teacher logits z_g, ``[B, C]`` (detached).
        tau: Temperature τ > 0.

    Returns:
        The float32 scalar loss.

    >>> z = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    >>> zg = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 3.0]])
    >>> round(float(kd_loss(z, z)), 6)
    0.0
    >>> round(float(kd_loss(z, zg)), 4)  # row 1: 0; row 2: KL(softmax([0, 0, 3]) ‖ uniform) = 0.7319; mean
    0.366
    """
    _check_tau(tau)
    z, zg = logits.float(), teacher_logits.detach().float()
    log_q = F.log_softmax(z / tau, dim=1)
    log_p = F.log_softmax(zg / tau, dim=1)
    return tau**2 * _kl_rows(log_p.exp(), log_p, log_q).mean()


def ntd_loss(logits: Tensor, teacher_logits: Tensor, targets: Tensor, tau: float = 1.0) -> Tensor:
    """Not-true distillation of FedNTD (Lee et al., NeurIPS 2022, arXiv:2106.03097, eq. 10–11).

    With the true class y removed from both logit vectors (the C−1 other columns are gathered),
    q̃ = softmax_τ(z without y), q̃_g = softmax_τ(z_g without y) and
    L_NTD = τ² · KL(q̃_g ‖ q̃) = τ² · mean_x Σ_{c≠y} q̃_g(c) · log(q̃_g(c) / q̃(c)).
    The true-class logit z_y gets no gradient. FedNTD trains with L = CE(z, y) + β·L_NTD (the τ² is the authors' code).

    Args:
        logits: Student logits z, ``[B, C]``.
        teacher_logits: Global-model logits z_g, ``[B, C]`` (detached).
        targets: True labels y, int64 ``[B]``.
        tau: Temperature τ > 0.

    Returns:
        The float32 scalar loss.

    >>> z = torch.tensor([[5.0, 1.0, 2.0], [0.0, 0.0, 9.0]])
    >>> zg = torch.tensor([[0.0, 1.0, 2.0], [0.0, 1.0, -3.0]])
    >>> y = torch.tensor([0, 2])
    >>> # row 1: the not-true logits agree -> 0; row 2: KL(softmax([0, 1]) ‖ [1/2, 1/2]) = 0.1110; mean
    >>> round(float(ntd_loss(z, zg, y)), 4)
    0.0555
    """
    _check_tau(tau)
    z = _not_true(logits.float(), targets)
    zg = _not_true(teacher_logits.detach().float(), targets)
    log_q = F.log_softmax(z / tau, dim=1)
    log_p = F.log_softmax(zg / tau, dim=1)
    return tau**2 * _kl_rows(log_p.exp(), log_p, log_q).mean()


def majority_mask(class_counts: Tensor) -> Tensor:
    """FedLMD's majority labels Y_k of a client (Lu et al., ACM MM 2023): the classes with n_{k,c} > n_k / C.

    The paper's rule is garbled; this is the authors' code (docs/source/methods.md): strictly more than the mean count
    over all C classes, zeros included. Every other class is a minority label.

    Args:
        class_counts: The client's count of each class, ``[C]``.

    Returns:
        Bool ``[C]``, True for majority labels.

    >>> majority_mask(torch.tensor([5, 1, 0, 4])).tolist()  # mean 2.5
    [True, False, False, True]
    """
    counts = class_counts.float()
    return counts > counts.sum() / counts.numel()


def _lmd_teacher_keep(targets: Tensor, majority: Tensor, num_classes: int, device: torch.device) -> Tensor:
    """Bool ``[B, C]``: the classes the FedLMD teacher keeps, i ∉ Y_k ∪ {y}."""
    return _not_target_mask(targets, num_classes, device) & ~majority.to(device=device, dtype=torch.bool)[None, :]


def _lmd_kl(logits: Tensor, p: Tensor, log_p: Tensor, targets: Tensor, tau: float) -> Tensor:
    """τ² · mean_x KL(p ‖ p'_k) with the student p'_k = softmax_τ(z) over the classes ≠ y."""
    z = logits.float()
    log_q = _masked_log_softmax(z / tau, _not_target_mask(targets, z.shape[1], z.device))
    return tau**2 * _kl_rows(p, log_p, log_q).mean()


def lmd_loss(logits: Tensor, teacher_logits: Tensor, targets: Tensor, majority: Tensor, tau: float = 1.0) -> Tensor:
    """Label-masking distillation of FedLMD (Lu et al., ACM MM 2023, eq. 3–6, with the fixes of docs/source/methods.md).

    Teacher p'_g(i) = softmax_τ(z_g) renormalised over the classes i ∉ Y_k ∪ {y} (0 elsewhere; y is masked in the
    teacher too so that the loss is finite when y is a minority label); student p'_k(i) = softmax_τ(z) over i ≠ y
    (0 at y). L_LMD = τ² · mean_x Σ_i p'_g(i) · log(p'_g(i) / p'_k(i)), terms with p'_g(i) = 0 vanishing. A sample
    whose teacher has no class left contributes 0 (it still counts in the batch mean). FedLMD trains with
    L = CE(z, y) + β·L_LMD.

    Args:
        logits: Student logits z, ``[B, C]``.
        teacher_logits: Global-model logits z_g, ``[B, C]`` (detached).
        targets: True labels y, int64 ``[B]``.
        majority: The client's majority labels, bool ``[C]`` (:func:`majority_mask`).
        tau: Temperature τ > 0.

    Returns:
        The float32 scalar loss.

    >>> z = torch.tensor([[2.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    >>> majority = torch.tensor([True, False, True])
    >>> # row 1 (y = 0): teacher all on class 1, student q(1) = 1/(1 + e): log(1 + e) = 1.3133; row 2 (y = 1): 0
    >>> round(float(lmd_loss(z, z, torch.tensor([0, 1]), majority)), 4)
    0.6566
    """
    _check_tau(tau)
    zg = teacher_logits.detach().float()
    keep = _lmd_teacher_keep(targets, majority, zg.shape[1], zg.device)
    log_p = _masked_log_softmax(zg / tau, keep)
    p = torch.where(keep, log_p.exp(), torch.zeros_like(log_p))  # all-zero rows when nothing is kept
    return _lmd_kl(logits, p, log_p, targets, tau)


def lmd_tf_target(targets: Tensor, majority: Tensor, num_classes: int) -> Tensor:
    """FedLMD-Tf's teacher-free target μ (Lu et al., ACM MM 2023, eq. 8), float32 ``[B, C]``.

    μ(i) = 1 / |{j ∉ Y_k ∪ {y}}| for i ∉ Y_k ∪ {y}, and 0 elsewhere. Rows with no such class are all zeros.

    Args:
        targets: True labels y, int64 ``[B]``.
        majority: The client's majority labels, bool ``[C]``.
        num_classes: C.

    Returns:
        The target distribution of each sample.

    >>> lmd_tf_target(torch.tensor([0, 2]), torch.tensor([False, True, False]), 3).tolist()
    [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    >>> lmd_tf_target(torch.tensor([0]), torch.tensor([False, True, True]), 3).tolist()  # nothing left
    [[0.0, 0.0, 0.0]]
    """
    keep = _lmd_teacher_keep(targets, majority, num_classes, targets.device).float()
    return keep / keep.sum(dim=1, keepdim=True).clamp_min(1.0)


def lmd_tf_loss(logits: Tensor, targets: Tensor, majority: Tensor, tau: float = 1.0) -> Tensor:
    """FedLMD-Tf (Lu et al., ACM MM 2023, eq. 7–8): τ² · KL(μ ‖ p'_k), batch mean, with μ = :func:`lmd_tf_target`.

    The teacher is the fixed uniform vector over the classes that are neither majority labels nor y, so no teacher
    forward pass is needed; p'_k is the student softmax_τ over the classes ≠ y, as in :func:`lmd_loss`.

    Args:
        logits: Student logits z, ``[B, C]``.
        targets: True labels y, int64 ``[B]``.
        majority: The client's majority labels, bool ``[C]``.
        tau: Temperature τ > 0.

    Returns:
        The float32 scalar loss.

    >>> z = torch.tensor([[9.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    >>> round(float(lmd_tf_loss(z, torch.tensor([0, 1]), torch.tensor([False, False, False]))), 6)  # μ = p'_k
    0.0
    """
    _check_tau(tau)
    target = lmd_tf_target(targets.to(logits.device), majority, logits.shape[1])
    log_target = torch.where(target > 0, target.clamp_min(1e-30).log(), torch.zeros_like(target))
    return _lmd_kl(logits, target, log_target, targets, tau)


def credibility_matrix(preds: Tensor, targets: Tensor, num_classes: int) -> Tensor:
    """FedSSD's credibility matrix (He et al., "Learning Critically", IEEE Trans. Big Data 2022, §4.2).

    The row-normalised confusion matrix of the global model on the auxiliary set: A[k1, k2] = P(predict k2 | true k1)
    = #{true k1, predicted k2} / #{true k1}. A class with no auxiliary sample gets a row of zeros (so it has
    M_class = 0: the model is not trusted on it).

    Args:
        preds: Predicted classes, int ``[N]``.
        targets: True classes, int ``[N]``.
        num_classes: C.

    Returns:
        Float32 ``[C, C]``.

    >>> credibility_matrix(torch.tensor([0, 1, 1]), torch.tensor([0, 0, 1]), 3).tolist()
    [[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    """
    idx = targets.long() * num_classes + preds.long().to(targets.device)
    counts = torch.bincount(idx, minlength=num_classes * num_classes).view(num_classes, num_classes).float()
    return counts / counts.sum(dim=1, keepdim=True).clamp_min(1.0)


def ssd_weights(teacher_logits: Tensor, targets: Tensor, credibility: Tensor, m_max: float) -> Tensor:
    """FedSSD's selective distillation weights M(x)[k] (He et al., IEEE Trans. Big Data 2022, eq. 2–5).

    M_class[k] = A[k, k] · (1 − max_{k'≠k} A[k', k]);  M_sample(x) = 1 − (1 − softmax(z_g)[y])^0.5;
    M(x)[k] = M_max · max(0, M_class[k] · M_sample(x) − 0.1) ∈ [0, M_max]. A constant: computed without gradient.

    Args:
        teacher_logits: Global-model logits z_g, ``[B, C]``.
        targets: True labels y, int64 ``[B]``.
        credibility: The matrix A of :func:`credibility_matrix`, ``[C, C]``.
        m_max: M_max (0.01 for 10 classes, 0.001 for 100/200 in the paper).

    Returns:
        Float32 ``[B, C]`` with ``requires_grad`` False.

    >>> zg = torch.tensor([[50.0, 0.0, 0.0], [0.0, 50.0, 0.0]])  # confident and right: M_sample = 1
    >>> a = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    >>> m = ssd_weights(zg, torch.tensor([0, 2]), a, m_max=1.0)  # M_class = [0.5, 0.5, 1]; row 2: M_sample = 0
    >>> [[round(v, 4) for v in row] for row in m.tolist()]
    [[0.4, 0.4, 0.9], [0.0, 0.0, 0.0]]
    """
    with torch.no_grad():
        zg = teacher_logits.detach().float()
        a = credibility.detach().float().to(zg.device)
        c = a.shape[0]
        # A ≥ 0, so filling the diagonal with 0 leaves the column maxima over k' ≠ k unchanged (and C = 1 gives 0).
        off_diag = a.masked_fill(torch.eye(c, dtype=torch.bool, device=a.device), 0.0)
        m_class = a.diagonal() * (1.0 - off_diag.max(dim=0).values)
        p_true = F.softmax(zg, dim=1).gather(1, targets.to(zg.device)[:, None]).squeeze(1)
        m_sample = 1.0 - (1.0 - p_true).clamp_min(0.0).sqrt()
        return m_max * (m_class[None, :] * m_sample[:, None] - 0.1).clamp_min(0.0)


def ssd_loss(logits: Tensor, teacher_logits: Tensor, weights: Tensor) -> Tensor:
    """FedSSD's selective self-distillation on logits (He et al., IEEE Trans. Big Data 2022, eq. 6).

    L_SSD = mean_x Σ_k (M(x)[k] · z_g[k] − M(x)[k] · z[k])², M from :func:`ssd_weights` (constant). FedSSD trains
    with L = CE(z, y) + L_SSD.

    Args:
        logits: Student logits z, ``[B, C]``.
        teacher_logits: Global-model logits z_g, ``[B, C]`` (detached).
        weights: M, ``[B, C]`` (detached).

    Returns:
        The float32 scalar loss.

    >>> z, zg = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]), torch.tensor([[1.0, 0.0, 3.0], [1.0, 1.0, 1.0]])
    >>> m = torch.tensor([[0.5, 0.5, 0.5], [1.0, 0.0, 2.0]])
    >>> float(ssd_loss(z, zg, m))  # row 1: (0.5·2)² = 1; row 2: 1² + 0 + 2² = 5; mean 3
    3.0
    """
    m = weights.detach().float()
    diff = m * teacher_logits.detach().float() - m * logits.float()
    return diff.pow(2).sum(dim=1).mean()


def cad_class_weights(
    teacher_logits: Tensor, targets: Tensor, num_classes: int, beta: float = 0.25, gamma: float = 0.5
) -> Tensor:
    """FedCAD's class-wise distillation weights α_c ∈ [β, γ] (He et al., AAAI 2022 student abstract, eq. 1–2).

    φ(y, p_g(x)) = p_g(x)[y] − Σ_{k≠y} p_g(x)[k] = 2·p_g(x)[y] − 1 ∈ [−1, 1], p_g = softmax(z_g);
    α_c = ½(γ − β) · E_{x|y=c}[φ] + ½(γ + β), the mean over all the client's samples of class c (pass the logits of
    the whole local dataset). Classes absent from ``targets`` get α = β (as if φ = −1, the teacher not trusted); they
    never occur in the client's batches, so the value is never used.

    Args:
        teacher_logits: Global-model logits on the client's samples, ``[N, C]``.
        targets: Their labels, int64 ``[N]``.
        num_classes: C.
        beta: β, the lower bound of α.
        gamma: γ, the upper bound of α.

    Returns:
        Float32 ``[C]``, computed without gradient.

    >>> zg = torch.tensor([[10.0, -10.0, 0.0], [-10.0, 10.0, 0.0]])
    >>> [round(a, 4) for a in cad_class_weights(zg, torch.tensor([0, 0]), 3).tolist()]  # class 0: φ ≈ ±1, mean 0
    [0.375, 0.25, 0.25]
    """
    with torch.no_grad():
        p = F.softmax(teacher_logits.detach().float(), dim=1)
        y = targets.to(p.device)
        phi = 2.0 * p.gather(1, y[:, None]).squeeze(1) - 1.0
        total = torch.zeros(num_classes, device=p.device).index_add_(0, y, phi)
        count = torch.zeros(num_classes, device=p.device).index_add_(0, y, torch.ones_like(phi))
        mean_phi = torch.where(count > 0, total / count.clamp_min(1.0), torch.full_like(total, -1.0))
        return 0.5 * (gamma - beta) * mean_phi + 0.5 * (gamma + beta)


def cad_loss(logits: Tensor, teacher_logits: Tensor, targets: Tensor, alpha: Tensor, tau: float = 1.0) -> Tensor:
    """FedCAD's class-adaptive self-distillation loss (He et al., AAAI 2022 student abstract, eq. 3).

    L = mean_x [(1 − α_y)·CE(z, y) + α_y·L_d],  L_d = −Σ_k softmax_T(z_g)[k] · log softmax_T(z)[k] (no T² factor,
    as in the paper). α from :func:`cad_class_weights`; γ = β = 0 is FedAvg.

    Args:
        logits: Student logits z, ``[B, C]``.
        teacher_logits: Global-model logits z_g, ``[B, C]`` (detached).
        targets: True labels y, int64 ``[B]``.
        alpha: α_c for each class, ``[C]``.
        tau: Temperature T > 0.

    Returns:
        The float32 scalar loss.

    >>> z = torch.zeros(2, 3)
    >>> zg = torch.tensor([[0.0, 0.0, 0.0], [5.0, 1.0, 2.0]])
    >>> round(float(cad_loss(z, zg, torch.tensor([0, 1]), torch.tensor([0.5, 0.0, 0.0]))), 4)  # every term is ln 3
    1.0986
    """
    _check_tau(tau)
    z, zg = logits.float(), teacher_logits.detach().float()
    y = targets.to(z.device)
    a = alpha.detach().float().to(z.device)[y]
    ce = F.cross_entropy(z, y, reduction="none")
    soft = -(F.softmax(zg / tau, dim=1) * F.log_softmax(z / tau, dim=1)).sum(dim=1)
    return ((1.0 - a) * ce + a * soft).mean()


def ka_class_groups(class_counts: Tensor, gamma: float) -> tuple[Tensor, Tensor, Tensor]:
    """FedKA's client class groups (Chen et al., arXiv:2312.02416, Definition 1).

    From the label fractions f_c = n_{k,c} / n_k and the threshold γ: missing C_m = {f_c = 0}, non-dominant
    C_n = {0 < f_c < γ}, dominant C_d = {f_c ≥ γ}. The three masks partition the classes (γ ≤ 0 makes every held
    class dominant).

    Args:
        class_counts: The client's count of each class, ``[C]``.
        gamma: The threshold γ (docs/source/methods.md default 1/(2C)).

    Returns:
        Bool masks ``(missing, non_dominant, dominant)``, each ``[C]``.

    >>> [m.tolist() for m in ka_class_groups(torch.tensor([0, 1, 9]), 0.5)]
    [[True, False, False], [False, True, False], [False, False, True]]
    """
    counts = class_counts.float()
    frac = counts / counts.sum().clamp_min(1.0)
    missing = counts <= 0
    dominant = (frac >= gamma) & ~missing
    return missing, ~missing & ~dominant, dominant


def ka_loss(
    anchor_logits: Tensor, anchor_teacher_logits: Tensor, dominant: Tensor, anchor_weight: Tensor | None = None
) -> Tensor:
    """FedKA's knowledge-anchor loss (Chen et al., arXiv:2312.02416, Definition 2, Algorithm 1).

    L_KA = (1/|T|) · Σ_{x∈T} ‖Φ(z_g(x), C_d) − Φ(z(x), C_d)‖², where Φ drops the logits of the dominant classes
    (they are zeroed with ``torch.where``, so even infinite dominant logits are ignored). 0 for an empty anchor set T.

    Args:
        anchor_logits: Local-model logits on the anchor set, ``[|T|, C]``.
        anchor_teacher_logits: Global-model logits on the anchor set, ``[|T|, C]`` (detached).
        dominant: The client's dominant classes, bool ``[C]``.
        anchor_weight: 1 for the rows of T, 0 for padding rows (no other values), ``[rows]``: an anchor set padded
            to a common size, as the batched engine stacks clients; the loss is then Σ w_x·‖·‖² / Σ w_x, the same
            L_KA.

    Returns:
        The float32 scalar loss.

    >>> z, zg = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]), torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    >>> float(ka_loss(z, zg, torch.tensor([False, True, False])))  # row 1: 0 + 3² = 9; row 2: 1 + 1 = 2; mean
    5.5
    >>> float(ka_loss(z[[0, 1, 0]], zg[[0, 1, 0]], torch.tensor([False, True, False]), torch.tensor([1.0, 1.0, 0.0])))
    5.5
    """
    z = anchor_logits.float()
    if z.shape[0] == 0:
        return z.sum() * 0.0  # keeps the graph (and the device) of the logits
    keep = ~dominant.to(device=z.device, dtype=torch.bool)[None, :]
    diff = anchor_teacher_logits.detach().float() - z
    diff = torch.where(keep, diff, torch.zeros_like(diff))
    per_anchor = diff.pow(2).sum(dim=1)
    if anchor_weight is None:
        return per_anchor.mean()
    weight = anchor_weight.to(per_anchor)
    weighted = torch.where(weight > 0, per_anchor * weight, torch.zeros_like(per_anchor))  # 0·inf is NaN, not 0
    return weighted.sum() / weight.sum().clamp_min(1.0)


def prox_term(params: Sequence[Tensor], global_params: Sequence[Tensor]) -> Tensor:
    """FedProx's proximal term Σ ‖w − w_g‖² over all parameters (Li et al., MLSys 2020, arXiv:1812.06127).

    The module adds (μ/2) times it to the cross-entropy. The global parameters are constants.

    Args:
        params: The local parameters w.
        global_params: The global parameters w_g, in the same order.

    Returns:
        The float32 scalar Σ_j ‖w_j − w_{g,j}‖².

    >>> float(prox_term([torch.tensor([1.0, 2.0]), torch.ones(2, 3)], [torch.zeros(2), torch.zeros(2, 3)]))
    11.0
    """
    params, global_params = list(params), list(global_params)
    if len(params) != len(global_params):
        raise ValueError(f"{len(params)} parameters but {len(global_params)} global ones")
    total = torch.zeros((), device=params[0].device if params else "cpu")
    for w, wg in zip(params, global_params, strict=True):
        total = total + (w.float() - wg.detach().float().to(w.device)).pow(2).sum()
    return total


def moon_loss(h: Tensor, h_global: Tensor, h_prev: Tensor, tau: float = 0.5) -> Tensor:
    """MOON's model-contrastive loss (Li et al., CVPR 2021, arXiv:2103.16257), batch mean.

    ℓ_con = −log( e^{sim(h, h_g)/τ} / (e^{sim(h, h_g)/τ} + e^{sim(h, h_prev)/τ}) ), sim the cosine similarity,
    h the local projection, h_g the global model's and h_prev the client's previous model's (both constants).

    Args:
        h: Local representations, ``[B, D]``.
        h_global: Global-model representations (positive pairs), ``[B, D]``.
        h_prev: Previous-local-model representations (negative pairs), ``[B, D]``.
        tau: Temperature τ > 0.

    Returns:
        The float32 scalar loss.

    >>> h = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    >>> round(float(moon_loss(h, h, -h, tau=1.0)), 4)  # −log(e / (e + 1/e)) = log(1 + e^−2)
    0.1269
    """
    _check_tau(tau)
    h = h.float()
    pos = F.cosine_similarity(h, h_global.detach().float(), dim=1) / tau
    neg = F.cosine_similarity(h, h_prev.detach().float(), dim=1) / tau
    return (torch.logsumexp(torch.stack([pos, neg], dim=1), dim=1) - pos).mean()


def restricted_logits(logits: Tensor, present: Tensor, alpha: float = 0.5) -> Tensor:
    """FedRS's restricted softmax input (Li & Zhan, KDD 2021): the logits of classes the client lacks times α.

    The module takes the cross-entropy of the result. Keeps the logits' dtype.

    Args:
        logits: Logits z, ``[B, C]``.
        present: The classes the client holds, bool ``[C]``.
        alpha: The scaling α of the absent classes' logits.

    Returns:
        ``[B, C]``: z_c for present classes, α·z_c for absent ones.

    >>> z = torch.tensor([[2.0, 4.0, -2.0], [1.0, 1.0, 1.0]])
    >>> restricted_logits(z, torch.tensor([True, False, False])).tolist()
    [[2.0, 2.0, -1.0], [1.0, 0.5, 0.5]]
    """
    keep = present.to(device=logits.device, dtype=torch.bool)
    scale = torch.where(keep, torch.ones((), device=logits.device), torch.full((), alpha, device=logits.device))
    return logits * scale.to(logits.dtype)[None, :]


# ---- the stateful baselines' client-side terms (SCAFFOLD, FedNova, FedDyn, FedCurv) ----------------------------------


def fednova_a(steps: int, momentum: float = 0.0) -> float:
    """FedNova's a_k: how many plain gradient steps K heavy-ball steps with momentum ρ add up to.

    a_k = (K − ρ(1 − ρ^K)/(1 − ρ)) / (1 − ρ), which is K for ρ = 0 (Wang et al., NeurIPS 2020, arXiv:2007.07481,
    §5). With a constant gradient g, K steps of PyTorch's SGD move the weights by lr·a_k·g. SCAFFOLD uses lr·a_k as its
    effective step sum in place of K·lr.

    Args:
        steps: The local optimizer steps K (>= 1).
        momentum: The local SGD momentum ρ in [0, 1).

    Returns:
        a_k as a float.

    >>> fednova_a(5)
    5.0
    >>> fednova_a(2, 0.5)  # steps move by g, then by 0.5·g + g
    2.5
    """
    if steps < 1 or not 0 <= momentum < 1:
        raise ValueError(f"fednova_a needs steps >= 1 and momentum in [0, 1), got {steps}, {momentum}")
    if momentum == 0:
        return float(steps)
    rho = float(momentum)
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


def scaffold_control_update(c_k: Tensor, c: Tensor, w_global: Tensor, w_local: Tensor, step_sum: float) -> Tensor:
    """SCAFFOLD's new client control variate, option II (Karimireddy et al., ICML 2020, arXiv:1910.06378, eq. 4).

    c_k⁺ = c_k − c + (w_g − w_k)/(K·lr), with ``step_sum`` = K·lr (lr·a_k with local momentum, see :func:`fednova_a`).

    Args:
        c_k: The client's control variate before the round.
        c: The server's control variate received this round.
        w_global: The global weights w_g the client started from.
        w_local: The client's weights w_k after its local steps.
        step_sum: The effective step sum K·lr (> 0).

    Returns:
        c_k⁺, shaped like ``c_k``.

    >>> scaffold_control_update(torch.tensor([1.0]), torch.tensor([3.0]), torch.tensor([2.0]), torch.tensor([1.0]), 0.5)
    tensor([0.])
    """
    if not step_sum > 0:
        raise ValueError(f"step_sum must be positive, got {step_sum}")
    return c_k - c + (w_global - w_local) / step_sum


def feddyn_linear_term(params: Sequence[Tensor], h: Sequence[Tensor]) -> Tensor:
    """FedDyn's linear term −⟨h_k, w⟩ (Acar et al., ICLR 2021, arXiv:2111.04263, Algorithm 1).

    The module adds it and (α/2)·:func:`prox_term` to the cross-entropy; h_k is a constant.

    Args:
        params: The local parameters w.
        h: The client's state h_k, one tensor per parameter.

    Returns:
        The float32 scalar −Σ_j ⟨h_j, w_j⟩.

    >>> float(feddyn_linear_term([torch.tensor([1.0, 2.0])], [torch.tensor([3.0, -1.0])]))
    -1.0
    """
    params, h = list(params), list(h)
    if len(params) != len(h):
        raise ValueError(f"{len(params)} parameters but {len(h)} state tensors")
    total = torch.zeros((), device=params[0].device if params else "cpu")
    for w, hj in zip(params, h, strict=True):
        total = total - (w.float() * hj.detach().float().to(w.device)).sum()
    return total


def fedcurv_penalty(
    params: Sequence[Tensor],
    fisher_sum: Sequence[Tensor],
    fisher_w_sum: Sequence[Tensor],
    fisher_w2_sum: Sequence[Tensor],
) -> Tensor:
    """FedCurv's penalty Σ_j F_j ⊙ (w − w_j)², summed over entries (Shoham et al., 2019, arXiv:1910.07796, eq. 8).

    Computed from the server's sums, expanded as w²·ΣF_j − 2w·Σ(F_j ⊙ w_j) + Σ(F_j ⊙ w_j²), so that the client needs
    three model-sized sums rather than every other client's Fisher and weights. The module multiplies it by λ.

    Args:
        params: The local parameters w.
        fisher_sum: Σ_j F_j per parameter (the other clients' diagonal Fishers).
        fisher_w_sum: Σ_j F_j ⊙ w_j per parameter.
        fisher_w2_sum: Σ_j F_j ⊙ w_j² per parameter.

    Returns:
        The float32 scalar penalty (λ not applied).

    >>> w, f, wj = torch.tensor([1.0, 2.0]), torch.tensor([2.0, 0.5]), torch.tensor([0.0, 4.0])
    >>> float(fedcurv_penalty([w], [f], [f * wj], [f * wj * wj]))  # 2·1² + 0.5·2²
    4.0
    """
    params = list(params)
    sums = [list(fisher_sum), list(fisher_w_sum), list(fisher_w2_sum)]
    if any(len(s) != len(params) for s in sums):
        raise ValueError(f"{len(params)} parameters but sums of lengths {[len(s) for s in sums]}")
    total = torch.zeros((), device=params[0].device if params else "cpu")
    for w, f, fw, fw2 in zip(params, *sums, strict=True):
        w = w.float()
        dev = w.device
        total = total + (w * w * f.detach().float().to(dev) - 2 * w * fw.detach().float().to(dev)).sum()
        total = total + fw2.detach().float().to(dev).sum()
    return total


def diagonal_fisher(net: nn.Module, x: Tensor, y: Tensor, batch_size: int = 64) -> dict[str, Tensor]:
    """The empirical diagonal Fisher of ``net``: the mean over samples of each per-sample CE gradient squared.

    F = (1/n)·Σ_i (∂ CE(net(x_i), y_i)/∂w)², FedCurv's curvature estimate (Shoham et al., 2019, arXiv:1910.07796).
    The network runs in evaluation mode (BatchNorm uses its running statistics), per-sample gradients come from
    ``torch.func.vmap`` over chunks of ``batch_size`` samples, and the result is float32.

    Args:
        net: The network (logits from ``forward``).
        x: Its (normalised) inputs, ``[n, ...]``, n >= 1.
        y: Their labels, int64 ``[n]``.
        batch_size: Samples per vmapped chunk.

    Returns:
        Parameter name -> F, shaped like the parameter (trainable parameters only).

    >>> net = nn.Linear(1, 2, bias=False)
    >>> _ = net.weight.data.zero_()  # logits 0, p = (½, ½): ∂CE/∂W = (p − onehot(y))·x = (−½, ½)
    >>> diagonal_fisher(net, torch.ones(3, 1), torch.zeros(3, dtype=torch.long))["weight"].flatten().tolist()
    [0.25, 0.25]
    """
    if len(y) == 0 or len(x) != len(y):
        raise ValueError(f"diagonal_fisher needs as many inputs as labels (at least one), got {len(x)} and {len(y)}")
    params = {n: p.detach() for n, p in net.named_parameters() if p.requires_grad}
    buffers = {n: b.detach() for n, b in net.named_buffers()}

    def sample_loss(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        logits = torch.func.functional_call(net, (p, buffers), (xi[None],))
        return F.cross_entropy(logits.float(), yi[None])

    per_sample = torch.func.vmap(torch.func.grad(sample_loss), in_dims=(None, 0, 0))
    total = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}
    with in_mode(net, training=False):
        for start in range(0, len(y), batch_size):
            grads = per_sample(params, x[start : start + batch_size], y[start : start + batch_size])
            for n, g in grads.items():
                total[n] += g.float().pow(2).sum(0)
    return {n: t / len(y) for n, t in total.items()}

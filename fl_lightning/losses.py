"""The methods' losses as pure functions of tensors.

Conventions: ``logits`` z and ``teacher_logits`` z_g are ``[B, C]``, ``targets`` y are int64 ``[B]``, class masks are
bool ``[C]``. Teacher logits are constants (detached here). Distillation terms use batch-mean reduction (sum over
classes, mean over samples) and are computed in float32 whatever the input dtype, so that they stay exact under mixed
precision. Classes are removed by gathering columns or by finite masks, never with ``-inf``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def _f32(x: Tensor) -> Tensor:
    return x.float()


def _kl_rows(p: Tensor, log_p: Tensor, log_q: Tensor) -> Tensor:
    """Σ_i p_i (log p_i − log q_i) per row, with 0·log 0 = 0."""
    return torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(dim=1)


def _masked_log_softmax(logits: Tensor, keep: Tensor) -> Tensor:
    """Log softmax over the entries where ``keep`` is True (rows of ``keep`` may be all False: then all zeros)."""
    very_negative = torch.finfo(logits.dtype).min / 4
    masked = logits.masked_fill(~keep, very_negative)
    out = masked - torch.logsumexp(masked, dim=1, keepdim=True)
    return out.masked_fill(~keep, 0.0)


def kd_loss(logits: Tensor, teacher_logits: Tensor, tau: float = 1.0) -> Tensor:
    """Knowledge distillation (Hinton et al., 2015): τ² · KL(softmax_τ(z_g) ‖ softmax_τ(z)), batch mean.

    KD/FedLSD uses L = (1 − β)·CE(z, y) + β·kd_loss.

    >>> z = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    >>> round(float(kd_loss(z, z)), 6)
    0.0
    """
    z, zg = _f32(logits), _f32(teacher_logits).detach()
    log_q = F.log_softmax(z / tau, dim=1)
    log_p = F.log_softmax(zg / tau, dim=1)
    return tau**2 * _kl_rows(log_p.exp(), log_p, log_q).mean()


def _not_true(x: Tensor, targets: Tensor) -> Tensor:
    """The C−1 columns of each row other than its target's, in class order."""
    b, c = x.shape
    cols = torch.arange(c, device=x.device).expand(b, c)
    keep = cols != targets[:, None]
    return x[keep].view(b, c - 1)


def ntd_loss(logits: Tensor, teacher_logits: Tensor, targets: Tensor, tau: float = 1.0) -> Tensor:
    """Not-true distillation of FedNTD (Lee et al., NeurIPS 2022, arXiv:2106.03097, eq. 10–11).

    q̃ = softmax_τ(z without y), q̃_g = softmax_τ(z_g without y);
    L_NTD = τ² · KL(q̃_g ‖ q̃) = τ² · Σ_{c≠y} q̃_g(c) · log(q̃_g(c) / q̃(c)), batch mean. The true-class logit gets no
    gradient. FedNTD trains with L = CE(z, y) + β·ntd_loss.

    >>> z, zg, y = torch.tensor([[5.0, 1.0, 2.0]]), torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([0])
    >>> round(float(ntd_loss(z, zg, y)), 6)  # the other classes agree, only z_y differs
    0.0
    """
    z = _not_true(_f32(logits), targets)
    zg = _not_true(_f32(teacher_logits).detach(), targets)
    log_q = F.log_softmax(z / tau, dim=1)
    log_p = F.log_softmax(zg / tau, dim=1)
    return tau**2 * _kl_rows(log_p.exp(), log_p, log_q).mean()


def majority_mask(class_counts: Tensor) -> Tensor:
    """FedLMD's majority labels: n_{k,c} > n_k / C (the authors' rule; METHODS.md).

    >>> majority_mask(torch.tensor([5, 1, 0, 4])).tolist()
    [True, False, False, True]
    """
    counts = class_counts.float()
    return counts > counts.sum() / counts.numel()


def _lmd_kl(logits: Tensor, teacher_probs: Tensor, teacher_log: Tensor, targets: Tensor, tau: float) -> Tensor:
    z = _f32(logits)
    b, c = z.shape
    not_y = torch.arange(c, device=z.device).expand(b, c) != targets[:, None]
    log_q = _masked_log_softmax(z / tau, not_y)
    return tau**2 * _kl_rows(teacher_probs, teacher_log, log_q).mean()


def _lmd_teacher_keep(targets: Tensor, majority: Tensor, num_classes: int) -> Tensor:
    cols = torch.arange(num_classes, device=targets.device).expand(len(targets), num_classes)
    return (cols != targets[:, None]) & ~majority.to(targets.device)[None, :]


def lmd_loss(logits: Tensor, teacher_logits: Tensor, targets: Tensor, majority: Tensor, tau: float = 1.0) -> Tensor:
    """Label-masking distillation of FedLMD (Lu et al., ACM MM 2023, eq. 3–6, with METHODS.md's fixes).

    Teacher p'_g = softmax_τ(z_g) over the classes that are neither majority labels nor y (0 elsewhere); student
    p'_k = softmax_τ(z) over the classes ≠ y (0 at y). L_LMD = τ² · KL(p'_g ‖ p'_k), batch mean; a sample whose
    teacher has no class left contributes 0. FedLMD trains with L = CE(z, y) + β·lmd_loss.

    >>> z = torch.tensor([[2.0, 0.0, 1.0]])
    >>> round(float(lmd_loss(z, z, torch.tensor([0]), torch.tensor([True, False, True]))), 4)  # log(1 + e)
    1.3133
    """
    zg = _f32(teacher_logits).detach()
    keep = _lmd_teacher_keep(targets, majority, zg.shape[1])
    log_p = _masked_log_softmax(zg / tau, keep)
    p = torch.where(keep, log_p.exp(), torch.zeros_like(log_p))
    return _lmd_kl(logits, p, log_p, targets, tau)


def lmd_tf_target(targets: Tensor, majority: Tensor, num_classes: int) -> Tensor:
    """FedLMD-Tf's teacher-free target (eq. 8): uniform over the classes that are neither majority labels nor y.

    Rows with no such class are all zeros.

    >>> lmd_tf_target(torch.tensor([0]), torch.tensor([False, True, False, False]), 4).tolist()
    [[0.0, 0.0, 0.5, 0.5]]
    """
    keep = _lmd_teacher_keep(targets, majority, num_classes).float()
    return keep / keep.sum(dim=1, keepdim=True).clamp_min(1.0)


def lmd_tf_loss(logits: Tensor, targets: Tensor, majority: Tensor, tau: float = 1.0) -> Tensor:
    """FedLMD-Tf (eq. 7–8): τ² · KL(μ ‖ p'_k) with μ = :func:`lmd_tf_target`; no teacher forward pass."""
    target = lmd_tf_target(targets, majority, logits.shape[1])
    log_target = torch.where(target > 0, target.clamp_min(1e-30).log(), torch.zeros_like(target))
    return _lmd_kl(logits, target, log_target, targets, tau)


def credibility_matrix(preds: Tensor, targets: Tensor, num_classes: int) -> Tensor:
    """FedSSD's credibility matrix: the row-normalised confusion matrix A[k1, k2] = P(predict k2 | true k1).

    Rows of classes with no sample are all zeros.

    >>> credibility_matrix(torch.tensor([0, 1, 1]), torch.tensor([0, 0, 1]), 2).tolist()
    [[0.5, 0.5], [0.0, 1.0]]
    """
    idx = targets.long() * num_classes + preds.long()
    counts = torch.bincount(idx, minlength=num_classes * num_classes).view(num_classes, num_classes).float()
    return counts / counts.sum(dim=1, keepdim=True).clamp_min(1.0)


def ssd_weights(teacher_logits: Tensor, targets: Tensor, credibility: Tensor, m_max: float) -> Tensor:
    """FedSSD's distillation weights M(x)[k] (eq. 2–5), a constant ``[B, C]`` tensor in [0, M_max].

    M_class[k] = A[k, k] · (1 − max_{k'≠k} A[k', k]);  M_sample(x) = 1 − (1 − softmax(z_g)[y])^0.5;
    M(x)[k] = M_max · max(0, M_class[k] · M_sample(x) − 0.1).
    """
    with torch.no_grad():
        a = credibility.float().to(teacher_logits.device)
        c = a.shape[0]
        off_diag = a.masked_fill(torch.eye(c, dtype=torch.bool, device=a.device), float("-inf"))
        worst_into = off_diag.max(dim=0).values.clamp_min(0.0) if c > 1 else torch.zeros(c, device=a.device)
        m_class = a.diagonal() * (1.0 - worst_into)
        p_true = F.softmax(_f32(teacher_logits), dim=1).gather(1, targets[:, None]).squeeze(1)
        m_sample = 1.0 - (1.0 - p_true).clamp_min(0.0).sqrt()
        return m_max * (m_class[None, :] * m_sample[:, None] - 0.1).clamp_min(0.0)


def ssd_loss(logits: Tensor, teacher_logits: Tensor, weights: Tensor) -> Tensor:
    """FedSSD's selective self-distillation on logits (eq. 6): mean_x Σ_k (M[k]·z_g[k] − M[k]·z[k])²."""
    m = weights.detach().float()
    diff = m * _f32(teacher_logits).detach() - m * _f32(logits)
    return diff.pow(2).sum(dim=1).mean()


def cad_class_weights(
    teacher_logits: Tensor, targets: Tensor, num_classes: int, beta: float = 0.25, gamma: float = 0.5
) -> Tensor:
    """FedCAD's class-wise distillation weights α_c ∈ [β, γ] (eq. 1–2).

    φ(y, p_g(x)) = p_g(x)[y] − Σ_{k≠y} p_g(x)[k] ∈ [−1, 1];  α_c = ½(γ − β)·E_{x|y=c}[φ] + ½(γ + β).
    Classes absent from ``targets`` get β: they never occur in the client's batches, so the value is unused.

    >>> cad_class_weights(torch.tensor([[10.0, -10.0], [-10.0, 10.0]]), torch.tensor([0, 0]), 2).tolist()
    [0.375, 0.25]
    """
    with torch.no_grad():
        p = F.softmax(_f32(teacher_logits), dim=1)
        p_true = p.gather(1, targets[:, None]).squeeze(1)
        phi = 2.0 * p_true - 1.0  # p_y − (1 − p_y)
        total = torch.zeros(num_classes, device=p.device).index_add_(0, targets, phi)
        count = torch.zeros(num_classes, device=p.device).index_add_(0, targets, torch.ones_like(phi))
        mean_phi = torch.where(count > 0, total / count.clamp_min(1.0), torch.full_like(total, -1.0))
        return 0.5 * (gamma - beta) * mean_phi + 0.5 * (gamma + beta)


def cad_loss(logits: Tensor, teacher_logits: Tensor, targets: Tensor, alpha: Tensor, tau: float = 1.0) -> Tensor:
    """FedCAD's loss (eq. 3): mean_x (1 − α_y)·CE(z, y) + α_y·L_d,  L_d = −Σ_k softmax_T(z_g)[k]·log softmax_T(z)[k]."""
    z, zg = _f32(logits), _f32(teacher_logits).detach()
    a = alpha.float().to(z.device)[targets]
    ce = F.cross_entropy(z, targets, reduction="none")
    soft = -(F.softmax(zg / tau, dim=1) * F.log_softmax(z / tau, dim=1)).sum(dim=1)
    return ((1.0 - a) * ce + a * soft).mean()


def ka_class_groups(class_counts: Tensor, gamma: float) -> tuple[Tensor, Tensor, Tensor]:
    """FedKA's class groups (Definition 1) from label fractions f_c = n_c / n with threshold γ.

    Returns bool masks (missing: f = 0, non_dominant: 0 < f < γ, dominant: f ≥ γ).

    >>> [m.tolist() for m in ka_class_groups(torch.tensor([0, 1, 9]), 0.5)]
    [[True, False, False], [False, True, False], [False, False, True]]
    """
    counts = class_counts.float()
    frac = counts / counts.sum().clamp_min(1.0)
    missing = counts == 0
    dominant = (frac >= gamma) & ~missing
    return missing, ~missing & ~dominant, dominant


def ka_loss(anchor_logits: Tensor, anchor_teacher_logits: Tensor, dominant: Tensor) -> Tensor:
    """FedKA's anchor loss (Definition 2): (1/|T|) Σ_{x∈T} ‖Φ(z_g(x)) − Φ(z(x))‖², Φ dropping dominant-class logits.

    0 for an empty anchor set.
    """
    z = _f32(anchor_logits)
    if z.shape[0] == 0:
        return z.sum() * 0.0
    keep = (~dominant.to(z.device)).float()[None, :]
    diff = (_f32(anchor_teacher_logits).detach() - z) * keep
    return diff.pow(2).sum(dim=1).mean()


def prox_term(params: Sequence[Tensor], global_params: Sequence[Tensor]) -> Tensor:
    """FedProx's proximal term Σ ‖w − w_g‖² (Li et al., MLSys 2020); the loss adds (μ/2) times it."""
    if len(params) != len(global_params):
        raise ValueError(f"{len(params)} parameters but {len(global_params)} global ones")
    total = torch.zeros((), device=params[0].device if params else "cpu")
    for w, wg in zip(params, global_params, strict=True):
        total = total + (w.float() - wg.detach().float()).pow(2).sum()
    return total


def moon_loss(h: Tensor, h_global: Tensor, h_prev: Tensor, tau: float = 0.5) -> Tensor:
    """MOON's model-contrastive loss (Li et al., CVPR 2021), batch mean, with cosine similarity sim.

    ℓ = −log( e^{sim(h, h_g)/τ} / (e^{sim(h, h_g)/τ} + e^{sim(h, h_prev)/τ}) ).
    """
    h = _f32(h)
    pos = F.cosine_similarity(h, _f32(h_global).detach(), dim=1) / tau
    neg = F.cosine_similarity(h, _f32(h_prev).detach(), dim=1) / tau
    return (torch.logsumexp(torch.stack([pos, neg], dim=1), dim=1) - pos).mean()


def restricted_logits(logits: Tensor, present: Tensor, alpha: float = 0.5) -> Tensor:
    """FedRS's restricted softmax input (Li & Zhan, KDD 2021): logits of classes the client lacks scaled by α."""
    scale = torch.where(present.to(logits.device), 1.0, alpha).to(logits.dtype)
    return logits * scale[None, :]

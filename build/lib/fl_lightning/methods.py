"""The methods: each a small subclass of :class:`~fl_lightning.module.FedAvg` overriding its local loss.

Losses come from :mod:`fl_lightning.losses`; this module only wires each one to the data and server state it needs.
See ``METHODS.md`` (shared with the project) for the exact equations.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fl_lightning import losses
from fl_lightning.context import ClientContext, ServerContext
from fl_lightning.module import FedAvg


class KD(FedAvg):
    """Plain distillation from the global model (FedLSD): L = (1−β)·CE + β·τ²·KL(softmax_τ(z_g) ‖ softmax_τ(z)).

    Args:
        beta: distillation weight β in [0, 1].
        tau: temperature τ.
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "kd"
    uses_teacher = True

    def __init__(self, beta: float = 0.3, tau: float = 1.0, **kwargs: Any) -> None:
        if not 0 <= beta <= 1 or tau <= 0:
            raise ValueError(f"KD needs beta in [0, 1] and tau > 0, got beta={beta}, tau={tau}")
        super().__init__(**kwargs)
        self.beta, self.tau = beta, tau

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """(1−β)·CE + β·kd_loss."""
        z, z_g = self(x), self.teacher_logits(x)
        return (1 - self.beta) * F.cross_entropy(z, y) + self.beta * losses.kd_loss(z, z_g, self.tau)


class FedNTD(FedAvg):
    """FedNTD (Lee et al., NeurIPS 2022, arXiv:2106.03097): L = CE + β·τ²·KL over the not-true classes.

    Args:
        beta: weight β of the not-true distillation.
        tau: temperature τ.
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "fedntd"
    uses_teacher = True

    def __init__(self, beta: float = 1.0, tau: float = 1.0, **kwargs: Any) -> None:
        if beta < 0 or tau <= 0:
            raise ValueError(f"FedNTD needs beta >= 0 and tau > 0, got beta={beta}, tau={tau}")
        super().__init__(**kwargs)
        self.beta, self.tau = beta, tau

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """CE + β·ntd_loss."""
        z, z_g = self(x), self.teacher_logits(x)
        return F.cross_entropy(z, y) + self.beta * losses.ntd_loss(z, z_g, y, self.tau)


class FedLMD(FedAvg):
    """FedLMD ("Federated Learning with Label-Masking Distillation", Lu et al., ACM MM 2023): distil minority labels.

    L = CE + β·τ²·KL(p'_g ‖ p'_k), the teacher masked on the majority labels Y_k (n_{k,c} > n_k/C) and y, the student
    on y. With ``teacher_free=True`` this is FedLMD-Tf (the teacher is a uniform target over the unmasked classes and
    no teacher forward runs); ``switch_round`` runs FedLMD-Tf before that round and FedLMD from it on (paper §5.4).

    Args:
        beta: distillation weight β.
        tau: temperature τ.
        teacher_free: FedLMD-Tf for the whole run.
        switch_round: with ``teacher_free``, switch to FedLMD at this 0-based round (``None``: never).
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "fedlmd"
    uses_teacher = True

    def __init__(
        self,
        beta: float = 1.0,
        tau: float = 1.0,
        teacher_free: bool = False,
        switch_round: int | None = None,
        **kwargs: Any,
    ) -> None:
        if beta < 0 or tau <= 0:
            raise ValueError(f"FedLMD needs beta >= 0 and tau > 0, got beta={beta}, tau={tau}")
        if switch_round is not None and (switch_round < 0 or not teacher_free):
            raise ValueError("switch_round needs teacher_free=true and a round >= 0 (FedLMD-Tf until then)")
        super().__init__(**kwargs)
        self.beta, self.tau = beta, tau
        self.teacher_free = teacher_free
        self.switch_round = switch_round
        self.majority: Tensor | None = None
        self._use_teacher = not teacher_free

    def on_client_start(self, client: ClientContext) -> None:
        """Majority labels from the client's counts; decide FedLMD or FedLMD-Tf for this round."""
        self._use_teacher = not self.teacher_free or (
            self.switch_round is not None and client.round >= self.switch_round
        )
        self.uses_teacher = self._use_teacher
        super().on_client_start(client)
        self.majority = losses.majority_mask(client.class_counts).to(self.device)

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """CE + β·lmd_loss (or lmd_tf_loss)."""
        assert self.majority is not None
        z = self(x)
        if self._use_teacher:
            distill = losses.lmd_loss(z, self.teacher_logits(x), y, self.majority, self.tau)
        else:
            distill = losses.lmd_tf_loss(z, y, self.majority, self.tau)
        return F.cross_entropy(z, y) + self.beta * distill


class FedLMDTf(FedLMD):
    """FedLMD-Tf: FedLMD with a teacher-free uniform target over the minority labels (FedLMD eq. 7–8).

    Args:
        beta: distillation weight β.
        tau: temperature τ.
        switch_round: switch to FedLMD (with the teacher) at this 0-based round (``None``: never).
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "fedlmd_tf"
    uses_teacher = False

    def __init__(self, beta: float = 1.0, tau: float = 1.0, switch_round: int | None = None, **kwargs: Any) -> None:
        super().__init__(beta=beta, tau=tau, teacher_free=True, switch_round=switch_round, **kwargs)


class FedSSD(FedAvg):
    """FedSSD ("Learning Critically: Selective Self Distillation in FL on Non-IID Data", He et al.).

    The server computes the credibility matrix A of the global model on its auxiliary holdout each round and sends it
    with the weights; the client adds L_SSD = mean_x Σ_k (M(x)[k]·z_g[k] − M(x)[k]·z[k])².

    Args:
        m_max: maximum distillation weight M_max (0.01 for 10 classes, 0.001 for 100/200 in the paper).
        aux_per_class: auxiliary samples per class the server uses (needs ``--data.holdout_per_class`` at least this).
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "fedssd"
    uses_teacher = True

    def __init__(self, m_max: float = 0.01, aux_per_class: int = 64, **kwargs: Any) -> None:
        if m_max < 0 or aux_per_class < 1:
            raise ValueError(f"FedSSD needs m_max >= 0 and aux_per_class >= 1, got {m_max}, {aux_per_class}")
        super().__init__(**kwargs)
        self.m_max = m_max
        self.aux_per_class = aux_per_class
        self.holdout_per_class_required = aux_per_class
        self.credibility: Tensor | None = None

    @torch.no_grad()
    def on_round_start(self, server: ServerContext) -> dict[str, Any]:
        """Credibility matrix of the global model on (up to ``aux_per_class`` per class of) the holdout."""
        keep = _first_per_class(server.aux_y, self.aux_per_class)
        aux = ServerContext(**{**server.__dict__, "aux_x": server.aux_x[keep], "aux_y": server.aux_y[keep]})
        was_training = self.training
        self.eval()
        preds, targets = [], []
        for xb, yb in aux.aux_batches():
            preds.append(self(xb).argmax(1))
            targets.append(yb)
        self.train(was_training)
        matrix = losses.credibility_matrix(torch.cat(preds), torch.cat(targets), server.num_classes)
        return {"credibility": matrix}

    def on_client_start(self, client: ClientContext) -> None:
        """Receive the round's credibility matrix."""
        super().on_client_start(client)
        self.credibility = client.server["credibility"].to(self.device)

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """CE + ssd_loss with weights M from the credibility matrix."""
        assert self.credibility is not None
        z, z_g = self(x), self.teacher_logits(x)
        weights = losses.ssd_weights(z_g, y, self.credibility, self.m_max)
        return F.cross_entropy(z, y) + losses.ssd_loss(z, z_g, weights)


class FedCAD(FedAvg):
    """FedCAD ("Class-Wise Adaptive Self Distillation for FL on Non-IID Data", He et al., AAAI 2022 student abstract).

    At the start of its round the client scores the global model on its own data per class,
    α_c = ½(γ−β)·E_{x|y=c}[p_g(x)_y − Σ_{k≠y} p_g(x)_k] + ½(γ+β), and trains with
    L = (1−α_y)·CE + α_y·(−Σ_k softmax_T(z_g)_k log softmax_T(z)_k).

    Args:
        beta: lower bound β of α.
        gamma: upper bound γ of α.
        tau: temperature T.
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "fedcad"
    uses_teacher = True

    def __init__(self, beta: float = 0.25, gamma: float = 0.5, tau: float = 1.0, **kwargs: Any) -> None:
        if not 0 <= beta <= gamma <= 1 or tau <= 0:
            raise ValueError(f"FedCAD needs 0 <= beta <= gamma <= 1 and tau > 0, got {beta}, {gamma}, {tau}")
        super().__init__(**kwargs)
        self.beta, self.gamma, self.tau = beta, gamma, tau
        self.alpha: Tensor | None = None

    def on_client_start(self, client: ClientContext) -> None:
        """Class weights α from the global model's predictions on the client's own data."""
        super().on_client_start(client)
        logits, targets = [], []
        for xb, yb in client.batches():
            logits.append(self.teacher_logits(xb).float())
            targets.append(yb)
        self.alpha = losses.cad_class_weights(
            torch.cat(logits), torch.cat(targets), self.num_classes, self.beta, self.gamma
        ).to(self.device)

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """cad_loss with the client's α."""
        assert self.alpha is not None
        return losses.cad_loss(self(x), self.teacher_logits(x), y, self.alpha, self.tau)


class FedKA(FedAvg):
    """FedKA (Chen, Zhu & Zheng, arXiv:2312.02416): knowledge anchors for missing and non-dominant classes.

    The anchor set T holds the shared sample of every class the client misses and one random local sample of each
    non-dominant class (at most μ in all); L = CE + β·(1/|T|)·Σ_{x∈T} ‖Φ(z_g(x)) − Φ(z(x))‖², Φ dropping the
    dominant classes' logits.

    L_KA is an unbounded squared-logit penalty: its curvature (2β/|T|)·σ_max(J)², J the Jacobian of the anchors'
    logits, grows with the network's scale, and once lr times it exceeds 2(1 + momentum) local SGD diverges. With
    LeNet on Fashion-MNIST at the paper's lr 0.01 that happens by round 30 for β = 0.1 (``bench/fedka_stability.py``
    measures it); ``clip_grad_norm`` keeps such runs finite.

    Args:
        beta: anchor-loss weight β.
        gamma: dominance threshold γ on label fractions (default 1/(2C)).
        mu: maximum anchor-set size μ.
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "fedka"
    uses_teacher = True
    holdout_per_class_required = 1

    def __init__(self, beta: float = 0.1, gamma: float | None = None, mu: int = 10, **kwargs: Any) -> None:
        if beta < 0 or mu < 1 or (gamma is not None and not 0 < gamma <= 1):
            raise ValueError(f"FedKA needs beta >= 0, mu >= 1 and gamma in (0, 1], got {beta}, {mu}, {gamma}")
        super().__init__(**kwargs)
        self.beta, self.mu = beta, mu
        self.gamma = gamma if gamma is not None else 1.0 / (2 * self.num_classes)
        self.dominant: Tensor | None = None
        self.anchor_x: Tensor | None = None
        self.anchor_zg: Tensor | None = None

    def on_round_start(self, server: ServerContext) -> dict[str, Any]:
        """The shared minimal set S: the first holdout sample of every class."""
        keep = _first_per_class(server.aux_y, 1)
        return {"shared_x": server.aux_x[keep], "shared_y": server.aux_y[keep]}

    def on_client_start(self, client: ClientContext) -> None:
        """Build this round's anchor set and its teacher logits."""
        super().on_client_start(client)
        missing, non_dominant, dominant = losses.ka_class_groups(client.class_counts, self.gamma)
        self.dominant = dominant.to(self.device)
        shared_x, shared_y = client.server["shared_x"], client.server["shared_y"]
        pieces = [shared_x[torch.isin(shared_y, torch.nonzero(missing).flatten())]]
        for c in torch.nonzero(non_dominant).flatten().tolist():
            members = torch.nonzero(client.y == c).flatten()
            pick = members[torch.randint(len(members), (1,), generator=client.generator)]
            pieces.append(client.x[pick])
        anchors = torch.cat(pieces)
        if len(anchors) > self.mu:
            anchors = anchors[torch.randperm(len(anchors), generator=client.generator)[: self.mu]]
        if len(anchors) == 0:
            self.anchor_x = self.anchor_zg = None
            return
        self.anchor_x = client.transform(anchors.to(self.device), False)
        self.anchor_zg = self.teacher_logits(self.anchor_x)

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """CE on the batch + β·ka_loss on the anchors."""
        loss = F.cross_entropy(self(x), y)
        if self.anchor_x is None or self.beta == 0:
            return loss
        assert self.dominant is not None and self.anchor_zg is not None
        return loss + self.beta * losses.ka_loss(self(self.anchor_x), self.anchor_zg, self.dominant)


class FedProx(FedAvg):
    """FedProx (Li et al., MLSys 2020, arXiv:1812.06127): L = CE + (μ/2)·‖w − w_g‖².

    Args:
        mu: proximal weight μ.
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "fedprox"
    needs_exact_steps = True

    def __init__(self, mu: float = 0.01, **kwargs: Any) -> None:
        if mu < 0:
            raise ValueError(f"FedProx needs mu >= 0, got {mu}")
        super().__init__(**kwargs)
        self.mu = mu
        self._global_params: list[Tensor] = []

    def on_client_start(self, client: ClientContext) -> None:
        """Keep a copy of the global parameters."""
        super().on_client_start(client)
        self._global_params = [p.detach().clone() for p in self.parameters()]

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """CE + (μ/2)·prox_term."""
        loss = F.cross_entropy(self(x), y)
        return loss + 0.5 * self.mu * losses.prox_term(list(self.parameters()), self._global_params)


class FedRS(FedAvg):
    """FedRS (Li & Zhan, KDD 2021): restricted softmax, logits of classes the client lacks scaled by α.

    Args:
        alpha: scaling α of the absent classes' logits.
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "fedrs"

    def __init__(self, alpha: float = 0.5, **kwargs: Any) -> None:
        if not 0 <= alpha <= 1:
            raise ValueError(f"FedRS needs alpha in [0, 1], got {alpha}")
        super().__init__(**kwargs)
        self.alpha = alpha
        self.present: Tensor | None = None

    def on_client_start(self, client: ClientContext) -> None:
        """The classes this client holds."""
        super().on_client_start(client)
        self.present = (client.class_counts > 0).to(self.device)

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """CE on the restricted logits."""
        assert self.present is not None
        return F.cross_entropy(losses.restricted_logits(self(x), self.present, self.alpha), y)


def _first_per_class(labels: Tensor, k: int) -> Tensor:
    """Indices of the first ``k`` samples of every class in ``labels``."""
    keep = []
    for c in torch.unique(labels).tolist():
        keep.append(torch.nonzero(labels == c).flatten()[:k])
    return torch.cat(keep) if keep else torch.zeros(0, dtype=torch.long)


METHODS: dict[str, type[FedAvg]] = {
    cls.method_name: cls for cls in (FedAvg, KD, FedNTD, FedLMD, FedLMDTf, FedSSD, FedCAD, FedKA, FedProx, FedRS)
}

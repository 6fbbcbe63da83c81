"""The methods: each a small subclass of :class:`~fl_lightning.module.FedAvg` overriding its local loss.

Losses come from :mod:`fl_lightning.core.losses`; this module only wires each one to the data and server state it needs.
See ``docs/source/methods.md`` (the project's specification) for the exact equations.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fl_lightning.core import losses
from fl_lightning.core.context import ClientContext, ServerContext
from fl_lightning.core.messages import require, require_bool, require_integer, require_number
from fl_lightning.core.models import in_mode, require_features, trainable
from fl_lightning.core.registry import Registry, named_subclass
from fl_lightning.module import FedAvg, frozen_forward, has_batch_norm


class KD(FedAvg):
    """Plain distillation from the global model (FedLSD): L = (1−β)·CE + β·τ²·KL(softmax_τ(z_g) ‖ softmax_τ(z)).

    Args:
        beta: distillation weight β in [0, 1].
        tau: temperature τ.
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "kd"
    sample_mean_loss = True
    uses_teacher = True

    def __init__(self, beta: float = 0.3, tau: float = 1.0, **kwargs: Any) -> None:
        owner = type(self).__name__
        beta, tau = require_number(f"{owner}: beta", beta, "[0, 1]"), require_number(f"{owner}: tau", tau, "> 0")
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
    sample_mean_loss = True
    uses_teacher = True

    def __init__(self, beta: float = 1.0, tau: float = 1.0, **kwargs: Any) -> None:
        owner = type(self).__name__
        beta, tau = require_number(f"{owner}: beta", beta, ">= 0"), require_number(f"{owner}: tau", tau, "> 0")
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
    sample_mean_loss = True
    uses_teacher = True
    client_attributes = ("majority", "_use_teacher")

    def __init__(
        self,
        beta: float = 1.0,
        tau: float = 1.0,
        teacher_free: bool = False,
        switch_round: int | None = None,
        **kwargs: Any,
    ) -> None:
        owner = type(self).__name__
        beta, tau = require_number(f"{owner}: beta", beta, ">= 0"), require_number(f"{owner}: tau", tau, "> 0")
        teacher_free = require_bool(f"{owner}: teacher_free", teacher_free)
        switch_round = require_integer(f"{owner}: switch_round", switch_round, least=0, optional=True)
        require(
            switch_round is None or teacher_free,
            f"{owner}: switch_round={switch_round} needs teacher_free=True (FedLMD-Tf until that round, then FedLMD)",
        )
        super().__init__(**kwargs)
        self.beta, self.tau = beta, tau
        self.teacher_free = teacher_free
        self.switch_round = switch_round
        self.majority: Tensor | None = None
        self._use_teacher = not teacher_free

    def teacher_needed(self, client: ClientContext) -> bool:
        """FedLMD uses the teacher; FedLMD-Tf only from ``switch_round`` on."""
        return not self.teacher_free or (self.switch_round is not None and client.round >= self.switch_round)

    def on_client_start(self, client: ClientContext) -> None:
        """Majority labels from the client's counts; decide FedLMD or FedLMD-Tf for this round."""
        self._use_teacher = self.teacher_needed(client)
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
        m_max: maximum distillation weight M_max (default, as in the paper: 0.01 for up to 10 classes, 0.001 above).
        aux_per_class: auxiliary samples per class the server uses (needs ``--data.holdout_per_class`` at least this).
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "fedssd"
    sample_mean_loss = True
    uses_teacher = True
    client_attributes = ("credibility",)

    def __init__(self, m_max: float | None = None, aux_per_class: int = 64, **kwargs: Any) -> None:
        owner = type(self).__name__
        m_max = require_number(f"{owner}: m_max", m_max, ">= 0", optional=True)
        aux_per_class = require_integer(f"{owner}: aux_per_class", aux_per_class, least=1)
        super().__init__(**kwargs)
        self._m_max = m_max
        self.aux_per_class = aux_per_class
        self.credibility: Tensor | None = None

    @property
    @torch.jit.unused
    def m_max(self) -> float:
        """M_max (default 0.01 for up to 10 classes, 0.001 above, known once the number of classes is)."""
        if self._m_max is not None:
            return self._m_max
        return 0.01 if self.num_classes <= 10 else 0.001

    @property
    def holdout_per_class_required(self) -> int:
        """FedSSD's auxiliary set: ``aux_per_class`` held-out samples per class."""
        return self.aux_per_class

    @torch.no_grad()
    def on_round_start(self, server: ServerContext) -> dict[str, Any]:
        """Credibility matrix of the global model on (up to ``aux_per_class`` per class of) the holdout."""
        keep = _first_per_class(server.aux_y, self.aux_per_class)
        aux = ServerContext(**{**server.__dict__, "aux_x": server.aux_x[keep], "aux_y": server.aux_y[keep]})
        preds, targets = [], []
        with in_mode(self, training=False):
            for xb, yb in aux.aux_batches():
                preds.append(self(xb).argmax(1))
                targets.append(yb)
        matrix = losses.credibility_matrix(torch.cat(preds), torch.cat(targets), server.num_classes)
        return {"credibility": matrix}

    def on_client_start(self, client: ClientContext) -> None:
        """Receive the round's credibility matrix."""
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
    sample_mean_loss = True
    uses_teacher = True
    client_attributes = ("alpha",)

    def __init__(self, beta: float = 0.25, gamma: float = 0.5, tau: float = 1.0, **kwargs: Any) -> None:
        owner = type(self).__name__
        beta = require_number(f"{owner}: beta", beta, "[0, 1]")
        gamma = require_number(f"{owner}: gamma", gamma, "[0, 1]")
        tau = require_number(f"{owner}: tau", tau, "> 0")
        require(beta <= gamma, f"{owner} needs beta <= gamma (the bounds of alpha), got beta={beta}, gamma={gamma}")
        super().__init__(**kwargs)
        self.beta, self.gamma, self.tau = beta, gamma, tau
        self.alpha: Tensor | None = None

    def on_client_start(self, client: ClientContext) -> None:
        """Class weights α from the global model's predictions on the client's own data."""
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
    logits, grows with the network's scale, and once lr times it exceeds 2(1 + momentum) local SGD diverges
    (``bench/fedka_stability.py`` measures when); ``clip_grad_norm`` keeps such runs finite.

    Args:
        beta: anchor-loss weight β.
        gamma: dominance threshold γ on label fractions (default 1/(2C)).
        mu: maximum anchor-set size μ.
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "fedka"
    sample_mean_loss = True  # L_KA does not depend on the batch: under the per-sample vmap its forward runs once
    uses_teacher = True
    holdout_per_class_required = 1
    client_attributes = ("dominant", "anchor_x", "anchor_zg", "anchor_w")

    def __init__(self, beta: float = 0.1, gamma: float | None = None, mu: int = 10, **kwargs: Any) -> None:
        owner = type(self).__name__
        beta, mu = require_number(f"{owner}: beta", beta, ">= 0"), require_integer(f"{owner}: mu", mu, least=1)
        gamma = require_number(f"{owner}: gamma", gamma, "(0, 1]", optional=True)
        super().__init__(**kwargs)
        self.beta, self.mu = beta, mu
        self._gamma = gamma
        self.dominant: Tensor | None = None
        self.anchor_x: Tensor | None = None
        self.anchor_zg: Tensor | None = None
        self.anchor_w: Tensor | None = None  # 1 per anchor, 0 per padding row; only where anchor sets were padded

    @property
    @torch.jit.unused
    def gamma(self) -> float:
        """Dominance threshold γ (default 1/(2C), known once the number of classes is)."""
        return self._gamma if self._gamma is not None else 1.0 / (2 * self.num_classes)

    def on_round_start(self, server: ServerContext) -> dict[str, Any]:
        """The shared minimal set S: the first holdout sample of every class."""
        keep = _first_per_class(server.aux_y, 1)
        return {"shared_x": server.aux_x[keep], "shared_y": server.aux_y[keep]}

    def on_client_start(self, client: ClientContext) -> None:
        """Build this round's anchor set and its teacher logits."""
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
        self.anchor_w = None
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
        return loss + self.beta * losses.ka_loss(self(self.anchor_x), self.anchor_zg, self.dominant, self.anchor_w)

    def align_client_attributes(self, attributes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Anchor sets of different sizes, padded to the largest (:func:`pad_anchor_sets`), the padding weighted 0.

        L_KA is unchanged (Σ w·‖·‖² / Σ w). The sets stay as they are (one stack per size) where that would not hold:
        on a network that normalizes with batch statistics, which the repeated rows would move, and in a subclass
        that overrides ``client_loss`` (it may not pass ``anchor_w`` to :func:`~fl_lightning.core.losses.ka_loss`; one
        that does can override this hook to return ``pad_anchor_sets(attributes)``).
        """
        if has_batch_norm(self) or type(self).client_loss is not FedKA.client_loss:
            return super().align_client_attributes(attributes)
        return pad_anchor_sets(attributes)


class FedProx(FedAvg):
    """FedProx (Li et al., MLSys 2020, arXiv:1812.06127): L = CE + (μ/2)·‖w − w_g‖².

    Args:
        mu: proximal weight μ.
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "fedprox"
    sample_mean_loss = True
    needs_exact_steps = True
    client_attributes = ("_global_params",)

    def __init__(self, mu: float = 0.01, **kwargs: Any) -> None:
        mu = require_number(f"{type(self).__name__}: mu", mu, ">= 0")
        super().__init__(**kwargs)
        self.mu = mu
        self._global_params: list[Tensor] = []

    def on_client_start(self, client: ClientContext) -> None:
        """Keep a copy of the global parameters."""
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
    sample_mean_loss = True
    client_attributes = ("present",)

    def __init__(self, alpha: float = 0.5, **kwargs: Any) -> None:
        alpha = require_number(f"{type(self).__name__}: alpha", alpha, "[0, 1]")
        super().__init__(**kwargs)
        self.alpha = alpha
        self.present: Tensor | None = None

    def on_client_start(self, client: ClientContext) -> None:
        """The classes this client holds."""
        self.present = (client.class_counts > 0).to(self.device)

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """CE on the restricted logits."""
        assert self.present is not None
        return F.cross_entropy(losses.restricted_logits(self(x), self.present, self.alpha), y)


def pad_anchor_sets(attributes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """FedKA's client attributes with every anchor set repeated up to the largest one, the padding weighted 0.

    ``anchor_w`` is 1 per anchor and 0 per padding row. Unchanged where the sets already have one size; a client
    without anchors keeps ``None``.
    """
    aligned = [dict(item) for item in attributes]
    anchored = [item for item in aligned if item["anchor_x"] is not None]
    largest = max((len(item["anchor_x"]) for item in anchored), default=0)
    if all(len(item["anchor_x"]) == largest for item in anchored):
        return aligned
    for item in anchored:
        size = len(item["anchor_x"])
        rows = torch.arange(largest, device=item["anchor_x"].device)
        item["anchor_w"] = (rows < size).float()
        item["anchor_x"], item["anchor_zg"] = item["anchor_x"][rows % size], item["anchor_zg"][rows % size]
    return aligned


def _first_per_class(labels: Tensor, k: int) -> Tensor:
    """Indices of the first ``k`` samples of every class in ``labels``."""
    keep = []
    for c in torch.unique(labels).tolist():
        keep.append(torch.nonzero(labels == c).flatten()[:k])
    return torch.cat(keep) if keep else torch.zeros(0, dtype=torch.long)


# ---- the stateful baselines -------------------------------------------------------------------------------------
# Their states and uploads are flat vectors over the trainable parameters in ``named_parameters()`` order (one tensor
# per state: cheap to checkpoint, to reduce over clients, and to split into per-parameter views).


def _named(module: nn.Module, names: Iterable[str]) -> list[Tensor]:
    """``module``'s parameters of these ``names``, in their order.

    Inside a stacked step ``requires_grad`` of a bound parameter does not say whether it is trained: a loss takes the
    names :func:`~fl_lightning.core.models.trainable` chose outside it, in ``on_client_start``.
    """
    params = dict(module.named_parameters())
    return [params[name] for name in names]


def _param_vector(module: nn.Module) -> Tensor:
    """The module's trainable parameters, flattened and concatenated (detached)."""
    return torch.cat([p.detach().reshape(-1) for _, p in trainable(module)])


def _state_vector(state: Mapping[str, Tensor], module: nn.Module) -> Tensor:
    """The entries of a state dict that are ``module``'s trainable parameters, flattened in ``trainable`` order."""
    return torch.cat([state[name].detach().reshape(-1) for name, _ in trainable(module)])


def _param_views(vector: Tensor, module: nn.Module) -> list[Tensor]:
    """``vector`` split into views shaped like ``module``'s trainable parameters (no copy)."""
    shapes = [p.shape for _, p in trainable(module)]
    return [v.view(shape) for v, shape in zip(vector.split([s.numel() for s in shapes]), shapes, strict=True)]


def _trainable_part(vector: Tensor, module: nn.Module) -> Tensor:
    """``vector`` over ``module``'s trainable parameters, also when it comes from a checkpoint that held frozen ones.

    Such a vector (written before frozen parameters were left out) covers every parameter in ``named_parameters()``
    order; its frozen entries, never trained, are dropped.
    """
    kept = {name for name, _ in trainable(module)}
    named = list(module.named_parameters())
    size = sum(p.numel() for name, p in named if name in kept)
    if vector.numel() == size:
        return vector
    if vector.numel() != sum(p.numel() for _, p in named):
        raise ValueError(
            f"a parameter-space state of {vector.numel()} entries does not fit this network's {size} trainable "
            "parameters: was the checkpoint written for another network?"
        )
    parts = vector.split([p.numel() for _, p in named])
    return torch.cat([part for part, (name, _) in zip(parts, named, strict=True) if name in kept])


def _with_params(state: Mapping[str, Tensor], vector: Tensor, module: nn.Module) -> dict[str, Tensor]:
    """A copy of ``state`` whose trainable parameters' entries are taken from ``vector`` (the rest kept)."""
    out = dict(state)
    for (name, _), value in zip(trainable(module), _param_views(vector, module), strict=True):
        out[name] = value.to(state[name].dtype)
    return out


class SCAFFOLD(FedAvg):
    """SCAFFOLD, option II (Karimireddy et al., ICML 2020, arXiv:1910.06378): drift correction by control variates.

    Every local step descends g + c − c_k; after K steps the client's control becomes
    c_k⁺ = c_k − c + (w_g − w_k)/(lr·a_k) (a_k = K without momentum, FedNova's a_k with it) and it uploads
    Δc_k = c_k⁺ − c_k. The server moves w_g ← w_g + η_g·(Σ_k p_k w_k − w_g) on the parameters and
    c ← c + (1/N)·Σ_{k∈S} Δc_k, which keeps c the mean of all N client controls. η_g is the federation's one server
    learning rate (``--federation.server_lr``, or a ``server_optimizer``), applied after this method's
    ``server_update``. The server-state example of the
    hooks: c lives in ``server.state["c"]``, goes down in ``on_round_start``'s payload and is updated in
    ``server_update``; each c_k lives in its client's ``state``. Memory: one model-sized control per client that has
    trained (CPU) and one on the server.

    Args:
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "scaffold"
    needs_exact_steps = True
    client_attributes = ("_c", "_c_k", "_correction")
    # Σ_k Δc_k (not a weighted mean): the paper's (|S|/N)·mean(Δc_k) = (1/N)·Σ_{k∈S} Δc_k, whatever the aggregation.
    upload_reduce: ClassVar[Mapping[str, str]] = {"delta_c": "sum"}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._c: Tensor | None = None
        self._c_k: Tensor | None = None
        self._correction: list[Tensor] = []

    def on_round_start(self, server: ServerContext) -> dict[str, Any]:
        """Send the server control c (zeros before the first round)."""
        if "c" not in server.state:
            server.state["c"] = torch.zeros_like(_param_vector(self))
        return {"c": server.state["c"]}

    def on_client_start(self, client: ClientContext) -> None:
        """Load c and this client's c_k (zeros the first time) and precompute the correction c − c_k."""
        self._c = client.server["c"].to(self.device)
        c_k = client.state.get("c")
        self._c_k = torch.zeros_like(self._c) if c_k is None else c_k.to(self.device)
        self._correction = _param_views(self._c - self._c_k, self)

    def local_gradient(self, grads: list[Tensor]) -> list[Tensor]:
        """Correct the gradient: g ← g + c − c_k on every parameter."""
        return [g + correction for g, correction in zip(grads, self._correction, strict=True)]

    def on_client_end(self, client: ClientContext) -> dict[str, Tensor]:
        """Update c_k (option II) and upload Δc_k."""
        assert self._c is not None and self._c_k is not None
        step_sum = client.lr * losses.fednova_a(client.steps, self.hparams["momentum"])
        w_g, w_k = _state_vector(client.global_weights, self), _param_vector(self)
        c_k_new = losses.scaffold_control_update(self._c_k, self._c, w_g, w_k, step_sum)
        client.state["c"] = c_k_new
        return {"delta_c": c_k_new - self._c_k}

    def server_update(
        self, server: ServerContext, average: dict[str, Tensor], uploads: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """C ← c + Σ Δc_k / N; the weights are the average (the server optimizer then applies η_g)."""
        server.state["c"] = server.state["c"] + uploads["delta_c"].to(server.state["c"]) / server.num_clients
        return average


class FedNova(FedAvg):
    """FedNova (Wang et al., NeurIPS 2020, arXiv:2007.07481): normalized averaging of the local updates.

    A client that took K steps with momentum ρ uploads a_k (:func:`~fl_lightning.core.losses.fednova_a`) and its
    normalized update d_k = (w_g − w_k)/a_k; the server steps w_g ← w_g − τ_eff·Σ_k p_k d_k with τ_eff = Σ_k p_k a_k
    (p_k the aggregation weights: sample sizes, as in the paper, unless ``--federation.aggregation uniform``), so that
    clients with more local steps do not pull the global model towards their own objective. Buffers are averaged. With
    equal K and no momentum this is FedAvg. Stateless: no memory per client.

    Args:
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "fednova"
    needs_exact_steps = True

    def on_client_end(self, client: ClientContext) -> dict[str, Tensor]:
        """Upload a_k and d_k (both reduced as Σ_k p_k·u_k)."""
        a_k = losses.fednova_a(client.steps, self.hparams["momentum"])
        d_k = (_state_vector(client.global_weights, self) - _param_vector(self)) / a_k
        return {"a": torch.tensor(a_k, dtype=d_k.dtype, device=d_k.device), "d": d_k}

    def server_update(
        self, server: ServerContext, average: dict[str, Tensor], uploads: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """w_g ← w_g − τ_eff·Σ_k p_k d_k on the parameters."""
        w_g = _state_vector(server.global_weights, self)
        return _with_params(average, w_g - uploads["a"].to(w_g) * uploads["d"].to(w_g), self)


class FedDyn(FedAvg):
    """FedDyn (Acar et al., ICLR 2021, arXiv:2111.04263): dynamic regularization towards a stationary point.

    Client: L = CE − ⟨h_k, w⟩ + (α/2)·‖w − w_g‖², then h_k ← h_k − α·(w_k − w_g) (h_k starts at 0; client state).
    Server: h ← h − α·(1/N)·Σ_{k∈S}(w_k − w_g) (h starts at 0), w_g ← Σ_k p_k w_k − h/α on the parameters. Each client
    uploads Δh_k = −α·(w_k − w_g), summed, so that h stays the mean of all N client states whatever the aggregation.

    As α → 0 the client's update becomes FedAvg's (both added terms vanish), but the server's does not: h/α =
    −(1/N)·Σ(w_k − w_g) accumulated over the rounds does not depend on α, so even the first round returns
    average + (1/N)·Σ_{k∈S}(w_k − w_g), not the average. Memory: one model-sized h_k per client that has trained
    (CPU) and one h on the server.

    Args:
        alpha: regularization weight α (> 0).
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "feddyn"
    sample_mean_loss = True
    needs_exact_steps = True
    client_attributes = ("_global_params", "_h_k")
    upload_reduce: ClassVar[Mapping[str, str]] = {"delta_h": "sum"}

    def __init__(self, alpha: float = 0.01, **kwargs: Any) -> None:
        alpha = require_number(f"{type(self).__name__}: alpha", alpha, "> 0")
        super().__init__(**kwargs)
        self.alpha = alpha
        # By trainable parameter's name (set outside the step, where requires_grad tells which are trainable).
        self._global_params: dict[str, Tensor] = {}
        self._h_k: dict[str, Tensor] | None = None

    def on_client_start(self, client: ClientContext) -> None:
        """Keep w_g and this client's h_k (``None`` before its first round: no linear term)."""
        names = [name for name, _ in trainable(self)]
        self._global_params = {name: client.global_weights[name] for name in names}
        h_k = client.state.get("h")
        if h_k is not None:
            h_k = client.state["h"] = _trainable_part(h_k, self)
        self._h_k = None if h_k is None else dict(zip(names, _param_views(h_k.to(self.device), self), strict=True))

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """CE − ⟨h_k, w⟩ + (α/2)·‖w − w_g‖²."""
        params = _named(self, self._global_params)
        loss = F.cross_entropy(self(x), y)
        loss = loss + 0.5 * self.alpha * losses.prox_term(params, list(self._global_params.values()))
        if self._h_k is not None:
            loss = loss + losses.feddyn_linear_term(params, list(self._h_k.values()))
        return loss

    def on_client_end(self, client: ClientContext) -> dict[str, Tensor]:
        """h_k ← h_k − α·(w_k − w_g); upload the change."""
        delta_h = -self.alpha * (_param_vector(self) - _state_vector(client.global_weights, self))
        h_k = None if self._h_k is None else torch.cat([v.reshape(-1) for v in self._h_k.values()])
        client.state["h"] = delta_h if h_k is None else h_k + delta_h
        return {"delta_h": delta_h}

    def server_update(
        self, server: ServerContext, average: dict[str, Tensor], uploads: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """Server state h ← h + Σ_k Δh_k / N; w_g ← average − h/α on the parameters."""
        delta = uploads["delta_h"]
        h = _trainable_part(server.state.get("h", torch.zeros_like(delta)), self).to(delta) + delta / server.num_clients
        server.state["h"] = h
        avg = _state_vector(average, self)
        return _with_params(average, avg - h.to(avg) / self.alpha, self)


def _features(net: nn.Module, x: Tensor) -> Tensor:
    """``net.features(x)``: the penultimate features of a network :func:`require_features` accepts."""
    features = cast(Callable[[Tensor], Tensor], net.features)
    return features(x)


class _Projection(nn.Module):
    """A frozen model's projection head(net.features(x)) (MOON's global and previous models)."""

    def __init__(self, net: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.net, self.head = net, head

    def forward(self, x: Tensor) -> Tensor:
        """The projection head(net.features(x))."""
        return self.head(_features(self.net, x))


class MOON(FedAvg):
    """MOON (Li, He & Song, CVPR 2021, arXiv:2103.16257): model-contrastive learning on a projection head.

    A projection head (feature_dim → feature_dim → ``proj_dim`` MLP) on the network's features is part of the model
    (trained and averaged; not used for prediction). L = CE + μ·ℓ_con with ℓ_con pulling the local projection h towards
    the global model's h_g and away from this client's previous local model's h_prev
    (:func:`~fl_lightning.core.losses.moon_loss`). The per-client-state example of the hooks: ``on_client_end`` saves
    the local model (net and head) in ``client.state["prev"]``, which ``on_client_start`` hands to the loss (a
    per-client attribute: the batched engine stacks the clients' previous models) the next time the client is sampled
    (the global model the first time). Memory: one model-plus-head state per client that has trained (CPU), its copy on
    the device while the client trains, and a frozen copy of the global model.

    Args:
        mu: weight μ of the contrastive term.
        tau: temperature τ of the cosine similarities.
        proj_dim: output size of the projection head.
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "moon"
    sample_mean_loss = True
    client_attributes = ("_prev_weights",)

    def __init__(self, mu: float = 1.0, tau: float = 0.5, proj_dim: int = 256, **kwargs: Any) -> None:
        owner = type(self).__name__
        mu, tau = require_number(f"{owner}: mu", mu, ">= 0"), require_number(f"{owner}: tau", tau, "> 0")
        proj_dim = require_integer(f"{owner}: proj_dim", proj_dim, least=1)
        super().__init__(**kwargs)
        self.mu, self.tau, self.proj_dim = mu, tau, proj_dim
        self.head: nn.Module | None = None
        if self.net is not None:
            self.head = self._build_head()
        # [global, previous]: frozen copies of net + head, kept in a list so that they are not submodules; the previous
        # model's weights are the client's own (_prev_weights, None the first time: h_prev is h_g, computed once).
        self._frozen: list[nn.Module] = []
        self._prev_weights: dict[str, Tensor] | None = None

    def _build_head(self) -> nn.Module:
        """A new projection head for the network's features (the network exists)."""
        assert self.net is not None
        require_features(self.net, "MOON")
        dim = cast(int, self.net.feature_dim)
        return nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, self.proj_dim))

    def configure_model(self) -> None:
        """Build the projection head once a network built at fit start exists."""
        super().configure_model()
        if self.head is None:
            self.head = self._build_head()
            self.head.to(self.device)

    def project(self, x: Tensor) -> Tensor:
        """The projection h = head(features(x)) of the local model."""
        assert self.net is not None and self.head is not None
        return self.head(_features(self.net, x))

    def on_client_start(self, client: ClientContext) -> None:
        """Load the global model into a frozen copy; take this client's previous model (none the first time)."""
        assert self.net is not None and self.head is not None
        if not self._frozen:
            for _ in range(2):
                copy_ = _Projection(copy.deepcopy(self.net), copy.deepcopy(self.head))
                copy_.requires_grad_(False)
                self._frozen.append(copy_)
        self._frozen[0].load_state_dict(client.global_weights)
        self._prev_weights = client.state.get("prev")
        for frozen in self._frozen:
            frozen.to(self.device).eval()

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """CE + μ·moon_loss(h, h_g, h_prev)."""
        assert self.net is not None and self.head is not None
        features = _features(self.net, x)
        # The built-in networks' forward is classifier(features(x)): reuse the features when the net says so.
        classifier = getattr(self.net, "classifier", None)
        logits = classifier(features) if isinstance(classifier, nn.Module) else self(x)
        h = self.head(features)
        with torch.no_grad():
            h_global = frozen_forward(self._frozen[0], x)
            h_prev = h_global if self._prev_weights is None else functional_call(self._frozen[1], self._prev_weights, x)
        return F.cross_entropy(logits, y) + self.mu * losses.moon_loss(h, h_global, h_prev, self.tau)

    def on_client_end(self, client: ClientContext) -> None:
        """Keep the local model as this client's previous model."""
        # Copied straight to the CPU, where the callback keeps client states: no second copy on the device.
        client.state["prev"] = {k: v.detach().to("cpu", copy=True) for k, v in self.state_dict().items()}


class FedCurv(FedAvg):
    """FedCurv (Shoham et al., 2019, arXiv:1910.07796): an EWC-style penalty towards the other clients' models.

    After its local steps a client estimates its diagonal Fisher F_k on ``fisher_samples`` of its samples
    (:func:`~fl_lightning.core.losses.diagonal_fisher`) and uploads F_k, F_k ⊙ w_k and F_k ⊙ w_k², summed over the
    round's clients. The server keeps the sums and sends the previous round's down; a client trains with
    L = CE + λ·Σ_{j≠k} F_j ⊙ (w − w_j)² (:func:`~fl_lightning.core.losses.fedcurv_penalty`), removing its own
    contribution when it was in the previous round. Round 0 is FedAvg. Memory: the client's last F_k and w_k (two
    model sizes, CPU) per client that has trained, and three model-sized sums on the server.

    Args:
        lam: penalty weight λ.
        fisher_samples: samples s of the client's data the Fisher is estimated on (all when it holds fewer).
        **kwargs: see :class:`~fl_lightning.module.FedAvg`.
    """

    method_name = "fedcurv"
    sample_mean_loss = True
    needs_exact_steps = True
    client_attributes = ("_sums",)
    upload_reduce: ClassVar[Mapping[str, str]] = {"fisher": "sum", "fisher_w": "sum", "fisher_w2": "sum"}

    def __init__(self, lam: float = 1e-3, fisher_samples: int = 500, **kwargs: Any) -> None:
        owner = type(self).__name__
        lam = require_number(f"{owner}: lam", lam, ">= 0")
        fisher_samples = require_integer(f"{owner}: fisher_samples", fisher_samples, least=1)
        super().__init__(**kwargs)
        self.lam = lam
        self.fisher_samples = fisher_samples
        self._sums: list[dict[str, Tensor]] | None = None  # by trainable parameter's name, as FedDyn's

    def on_round_start(self, server: ServerContext) -> dict[str, Any]:
        """Send the previous round's sums (``None`` in round 0)."""
        return {"sums": server.state.get("sums")}

    def on_client_start(self, client: ClientContext) -> None:
        """The other clients' sums: the previous round's, minus this client's own contribution if it had one."""
        sums = client.server.get("sums")
        if sums is None or self.lam == 0:
            self._sums = None
            return
        f, fw, fw2 = (sums[key].to(self.device) for key in ("fisher", "fisher_w", "fisher_w2"))
        if client.state.get("round") == client.round - 1:
            f_k, w_k = client.state["fisher"].to(self.device), client.state["weights"].to(self.device)
            f, fw, fw2 = f - f_k, fw - f_k * w_k, fw2 - f_k * w_k * w_k
        names = [name for name, _ in trainable(self)]
        self._sums = [dict(zip(names, _param_views(s, self), strict=True)) for s in (f, fw, fw2)]

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """CE + λ·fedcurv_penalty."""
        loss = F.cross_entropy(self(x), y)
        if self._sums is None:
            return loss
        sums = [list(s.values()) for s in self._sums]
        return loss + self.lam * losses.fedcurv_penalty(_named(self, self._sums[0]), *sums)

    def on_client_end(self, client: ClientContext) -> dict[str, Tensor]:
        """Estimate F_k on s local samples; keep F_k and w_k; upload F_k, F_k ⊙ w_k, F_k ⊙ w_k²."""
        assert self.net is not None
        n = len(client.y)
        pick = torch.randperm(n, generator=client.generator)[: self.fisher_samples] if n > self.fisher_samples else None
        x, y = (client.x, client.y) if pick is None else (client.x[pick], client.y[pick])
        inputs = client.transform(x.to(self.device), False)
        # Per-sample gradients take chunk x model size: at most 64 samples and about 2^28 floats (1 GiB) at a time.
        chunk = max(1, min(64, 2**28 // max(1, sum(p.numel() for p in self.net.parameters()))))
        fisher = losses.diagonal_fisher(self.net, inputs, y.to(self.device), batch_size=chunk)
        f_k = torch.cat([fisher[name[len("net.") :]].reshape(-1) for name, _ in trainable(self)])
        w_k = _param_vector(self).float()
        client.state.update(fisher=f_k, weights=w_k, round=client.round)
        return {"fisher": f_k, "fisher_w": f_k * w_k, "fisher_w2": f_k * w_k * w_k}

    def server_update(
        self, server: ServerContext, average: dict[str, Tensor], uploads: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """Keep this round's sums for the next round; the global model is the average."""
        server.state["sums"] = {key: uploads[key] for key in ("fisher", "fisher_w", "fisher_w2")}
        return average


METHODS: Registry[type[FedAvg]] = Registry(
    "METHODS",
    named_subclass(FedAvg, "method_name"),
    {
        cls.method_name: cls
        for cls in (
            FedAvg,
            KD,
            FedNTD,
            FedLMD,
            FedLMDTf,
            FedSSD,
            FedCAD,
            FedKA,
            FedProx,
            FedRS,
            SCAFFOLD,
            FedDyn,
            MOON,
            FedNova,
            FedCurv,
        )
    },
)

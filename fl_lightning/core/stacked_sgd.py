"""``torch.optim.SGD``'s local step on clients stacked along a first axis, each client with its own momentum.

The batched engine (:mod:`fl_lightning.batched`) trains a group of clients as one model whose every parameter is
``[K, ...]``; these functions take one optimizer step for all of them at once, per client exactly as
``torch.optim.SGD`` (momentum, dampening, Nesterov, weight decay, maximize) and ``clip_grad_norm_`` compute it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SGDSettings:
    """The local optimizer, read from the module's ``torch.optim.SGD`` (its one parameter group)."""

    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    maximize: bool = False

    @classmethod
    def from_optimizer(cls, optimizer: torch.optim.Optimizer) -> SGDSettings:
        """The settings of ``optimizer``'s first parameter group."""
        group = optimizer.param_groups[0]
        return cls(
            lr=float(group["lr"]),
            momentum=float(group.get("momentum", 0.0)),
            dampening=float(group.get("dampening", 0.0)),
            weight_decay=float(group.get("weight_decay", 0.0)),
            nesterov=bool(group.get("nesterov", False)),
            maximize=bool(group.get("maximize", False)),
        )


def clip_per_client(grads: list[Tensor], max_norm: float) -> None:
    """Scale each client's gradient to total L2 norm at most ``max_norm`` (``clip_grad_norm_``'s arithmetic)."""
    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads], dim=1)
    total = torch.linalg.vector_norm(norms, dim=1)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))).to(g.dtype))


def sgd_step(
    params: list[Tensor],
    grads: list[Tensor],
    buffers: list[Tensor | None],
    sgd: SGDSettings,
    mask: Tensor | None,
    first: Tensor | None = None,
) -> None:
    """``torch.optim.SGD``'s update on stacked clients; a client whose ``mask`` is false keeps its weights.

    Its arithmetic, op for op, in foreach ops (one dispatch per operation for all parameters). ``buffers`` holds each
    parameter's momentum buffer (``None`` before its first step), updated in place. With ``first`` (a ``()`` bool
    tensor) every buffer is allocated and ``first`` says on the device whether this is their first step: no value is
    read on the host, so the update can be recorded in a CUDA graph.
    """
    d = torch._foreach_neg(grads) if sgd.maximize else list(grads)
    if sgd.weight_decay != 0:
        d = torch._foreach_add(d, params, alpha=sgd.weight_decay)
    if sgd.momentum != 0 and first is not None:
        allocated = [b for b in buffers if b is not None]
        later = torch._foreach_mul(allocated, sgd.momentum)
        torch._foreach_add_(later, d, alpha=1 - sgd.dampening)
        for buf, di, li in zip(allocated, d, later, strict=True):
            buf.copy_(torch.where(first, di, li))
        d = torch._foreach_add(d, allocated, alpha=sgd.momentum) if sgd.nesterov else allocated
    elif sgd.momentum != 0:
        fresh = [i for i, b in enumerate(buffers) if b is None]
        held = [i for i, b in enumerate(buffers) if b is not None]
        for i in fresh:
            buffers[i] = torch.clone(d[i]).detach()
        if held:
            old = [buffers[i] for i in held]
            torch._foreach_mul_(old, sgd.momentum)  # type: ignore[arg-type]
            torch._foreach_add_(old, [d[i] for i in held], alpha=1 - sgd.dampening)  # type: ignore[arg-type]
        bufs = [b for b in buffers if b is not None]
        d = torch._foreach_add(d, bufs, alpha=sgd.momentum) if sgd.nesterov else bufs
    if mask is not None:  # where, not a product: a finished client keeps its weights whatever its gradient holds
        zero = torch.zeros((), dtype=params[0].dtype, device=params[0].device)
        d = [torch.where(mask.view(-1, *([1] * (t.dim() - 1))), t, zero) for t in d]
    torch._foreach_add_(params, d, alpha=-sgd.lr)

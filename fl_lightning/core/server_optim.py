"""Server optimizers: the last step of a federated round, from the averaged weights to the new global weights.

After the clients' weights are averaged, and a method's own ``server_update`` has turned the average into its
*target* global weights, a server optimizer treats the pseudo-gradient Δ = target − w (w: the current global weights)
like a gradient step's direction and returns the new global weights. It composes with any method: it only sees the
method's new weights as ``target``, never how they were made. With :class:`ServerSGD` at ``lr=1, momentum=0`` it is
the identity and the round is plain FedAvg (McMahan et al., 2017).

Only the entries the caller names in ``keys`` (the trainable parameters) are stepped. Every other entry, buffers
such as BatchNorm's running statistics and its integer ``num_batches_tracked``, takes the target's value unchanged.

The per-parameter state (momentum buffers, first and second moments) is part of a run's state: the Federation
callback checkpoints it through :meth:`ServerOptimizer.state_dict` and restores it with
:meth:`ServerOptimizer.load_state_dict`.

>>> opt = SERVER_OPTIMIZERS["sgd"](lr=0.5)
>>> out = opt.step({"w": torch.tensor([1.0])}, {"w": torch.tensor([3.0])})
>>> out["w"].tolist()
[2.0]
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch
from torch import Tensor

from fl_lightning.core.messages import require_number
from fl_lightning.core.registry import Registry, named_subclass

StateDict = Mapping[str, Tensor]

__all__ = [
    "SERVER_OPTIMIZERS",
    "FedAdagrad",
    "FedAdam",
    "FedYogi",
    "ServerOptimizer",
    "ServerSGD",
    "StateDict",
    "server_optimizer_class",
]


def _check_positive(owner: str, name: str, value: float) -> float:
    """``value`` as a float if it is a finite number > 0, else a ValueError naming ``owner`` and ``name``."""
    return require_number(f"{owner}: {name}", value, "> 0")


def _check_unit(owner: str, name: str, value: float) -> float:
    """``value`` as a float if it is a number in [0, 1), else a ValueError naming ``owner`` and ``name``."""
    return require_number(f"{owner}: {name}", value, "[0, 1)")


class ServerOptimizer:
    """Base class: turns the current global weights w and a target into the new global weights.

    For every stepped entry the pseudo-gradient is Δ = target − w, computed in float32, and the subclass's
    :meth:`_update` maps (w, Δ) to the new value, which is cast back to w's dtype (:class:`ServerSGD` gets −Δ, a
    gradient's sign). Subclasses keep their per-entry tensors in ``self.state[key]`` (float32, on the weights'
    device).

    Args:
        lr: The server learning rate η (> 0).

    Attributes:
        lr: The server learning rate η.
        state: Per state-dict key, the optimizer's tensors for it, e.g. ``{"conv.weight": {"m": ..., "v": ...}}``.
        steps: How many times :meth:`step` has run since construction or :meth:`reset`.
    """

    _hparam_names: tuple[str, ...] = ("lr",)

    def __init__(self, lr: float = 1.0) -> None:
        self.lr = _check_positive(type(self).__name__, "lr", lr)
        self.state: dict[str, dict[str, Tensor]] = {}
        self.steps = 0

    def __repr__(self) -> str:
        args = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._hparam_names)
        return f"{type(self).__name__}({args})"

    @property
    def is_identity(self) -> bool:
        """Whether :meth:`step` returns the target unchanged (then it does no arithmetic at all)."""
        return False

    def step(self, weights: StateDict, target: StateDict, keys: Collection[str] | None = None) -> dict[str, Tensor]:
        """The new global weights.

        Each key in ``keys`` whose value in ``weights`` is floating point becomes
        ``_update(key, weights[key], Δ).to(weights[key].dtype)`` with Δ = target[key] − weights[key] in float32. Every
        other entry of ``target`` (integer entries, and floating entries not in ``keys``) is returned unchanged.

        Args:
            weights: The current global weights w.
            target: The weights the round produced (the average, or the method's ``server_update`` of it).
            keys: The entries to step, normally the trainable parameters; ``None`` steps every floating-point entry.

        Returns:
            A new dict with the keys of ``target``; ``weights`` and ``target`` are not modified.

        Raises:
            KeyError: A key to step is missing from ``weights`` or ``target``.
        """
        if self.is_identity:
            self.steps += 1
            return dict(target)
        names = [k for k, w in weights.items() if torch.is_floating_point(w)] if keys is None else list(keys)
        missing = [k for k in names if k not in weights or k not in target]
        if missing:
            raise KeyError(f"{type(self).__name__}.step: keys missing from the weights or the target: {missing[:5]}")
        out = dict(target)
        with torch.no_grad():
            for k in names:
                w = weights[k]
                if not torch.is_floating_point(w):
                    continue
                entry = self.state.get(k)
                if entry is not None:  # restored from a checkpoint on another device: move it lazily
                    for name, t in entry.items():
                        if t.device != w.device:
                            entry[name] = t.to(w.device)
                out[k] = self._update(k, w, self._pseudo_gradient(w, target[k])).to(w.dtype)
        self.steps += 1
        return out

    def _pseudo_gradient(self, w: Tensor, target: Tensor) -> Tensor:
        """Δ = target − w in float32 on w's device: the direction :meth:`_update` gets."""
        return target.to(device=w.device, dtype=torch.float32) - w.float()

    def _update(self, name: str, w: Tensor, delta: Tensor) -> Tensor:
        """The new value of entry ``name`` (float32) from its current value ``w`` and ``delta``.

        Args:
            name: The state-dict key, for ``self.state``.
            w: The current value, in its own dtype.
            delta: The float32 pseudo-gradient from :meth:`_pseudo_gradient` (target − w unless overridden).
        """
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state as CPU copies, for a checkpoint: ``{"optimizer", "steps", "state"}``."""
        return {
            "optimizer": type(self).__name__,
            "steps": self.steps,
            "state": {
                k: {name: t.detach().to("cpu", copy=True) for name, t in entry.items()}
                for k, entry in self.state.items()
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; tensors move to the weights' device at the next :meth:`step`.

        Raises:
            ValueError: The state has no ``"state"`` entry or was saved by another optimizer class.
        """
        if "state" not in state:
            raise ValueError(f"{type(self).__name__}.load_state_dict: no 'state' entry in {sorted(state)}")
        saved_by = state.get("optimizer", type(self).__name__)
        if saved_by != type(self).__name__:
            raise ValueError(f"{type(self).__name__}.load_state_dict: the state was saved by {saved_by}")
        self.state = {k: {name: t.detach().clone() for name, t in entry.items()} for k, entry in state["state"].items()}
        self.steps = int(state.get("steps", 0))

    def reset(self) -> None:
        """Forget all state, as if just constructed."""
        self.state = {}
        self.steps = 0


class ServerSGD(ServerOptimizer):
    """Server SGD with optional momentum: FedAvg, server learning rate, FedAvgM.

    With the buffer v holding the descent direction w − target (a gradient's sign, like ``torch.optim.SGD``)::

        v ← β_s·v + (w − target)        (v = w − target at the first step)
        w ← w − η_s·v

    ``lr=1, momentum=0`` is plain averaging, FedAvg (McMahan et al., "Communication-Efficient Learning of Deep
    Networks from Decentralized Data", 2017), and :meth:`step` then returns the target without arithmetic. A
    momentum β_s > 0 is FedAvgM (Hsu et al., "Measuring the Effects of Non-Identical Data Distribution for Federated
    Visual Classification", 2019). The arithmetic is float32; the state key ``"momentum_buffer"`` holds v for each
    entry.

    Args:
        lr: The server learning rate η_s (> 0).
        momentum: The server momentum β_s in [0, 1).

    >>> opt = ServerSGD(lr=1.0, momentum=0.5)
    >>> w, t = {"w": torch.tensor([0.0])}, {"w": torch.tensor([1.0])}
    >>> w = opt.step(w, t)  # v = -1, w = 0 + 1 = 1
    >>> opt.step(w, {"w": torch.tensor([2.0])})["w"].tolist()  # v = 0.5·(-1) - 1 = -1.5, w = 1 + 1.5
    [2.5]
    >>> ServerSGD().is_identity
    True
    """

    _hparam_names = ("lr", "momentum")

    def __init__(self, lr: float = 1.0, momentum: float = 0.0) -> None:
        super().__init__(lr)
        self.momentum = _check_unit(type(self).__name__, "momentum", momentum)

    @property
    def is_identity(self) -> bool:
        """True for ``lr == 1`` and ``momentum == 0``: plain averaging."""
        return self.lr == 1.0 and self.momentum == 0.0

    def _pseudo_gradient(self, w: Tensor, target: Tensor) -> Tensor:
        """The descent direction w − target (= −Δ), in float32 on w's device."""
        return w.float() - target.to(device=w.device, dtype=torch.float32)

    def _update(self, name: str, w: Tensor, delta: Tensor) -> Tensor:
        """The buffer v ← β_s·v + delta, then w − η_s·v, with ``delta`` = w − target."""
        entry = self.state.setdefault(name, {})
        buf = entry.get("momentum_buffer")
        buf = delta if buf is None else self.momentum * buf + delta
        entry["momentum_buffer"] = buf
        return w.float() - self.lr * buf


class _AdaptiveServerOptimizer(ServerOptimizer):
    """Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2, without bias correction.

    With Δ_t = target − w_t, m_{-1} = 0 and v_{-1} = τ² (the paper requires v_{-1} ≥ τ²; this uses exactly τ²)::

        m_t = β1·m_{t−1} + (1 − β1)·Δ_t
        v_t = (subclass's rule)
        w_{t+1} = w_t + η·m_t / (√v_t + τ)

    Computed in float32; ``m`` and ``v`` live in ``self.state[key]`` on the weights' device. The paper tunes η (and
    τ) per task on a grid of powers of 10^0.5; the default η = 0.01 is only a starting point.
    """

    _hparam_names: tuple[str, ...] = ("lr", "beta1", "tau")

    def __init__(self, lr: float = 0.01, beta1: float = 0.9, tau: float = 1e-3) -> None:
        super().__init__(lr)
        owner = type(self).__name__
        self.beta1 = _check_unit(owner, "beta1", beta1)
        self.tau = _check_positive(owner, "tau", tau)

    def _second_moment_(self, v: Tensor, delta_sq: Tensor) -> None:
        """Update v_{t−1} to v_t in place, given Δ_t²."""
        raise NotImplementedError

    def _update(self, name: str, w: Tensor, delta: Tensor) -> Tensor:
        """m_t, v_t, then w + η·m_t / (√v_t + τ)."""
        entry = self.state.setdefault(name, {})
        if "m" not in entry:
            entry["m"] = torch.zeros_like(delta)
            entry["v"] = torch.full_like(delta, self.tau**2)
        m, v = entry["m"], entry["v"]
        m.mul_(self.beta1).add_(delta, alpha=1.0 - self.beta1)
        self._second_moment_(v, delta * delta)
        return w.float().addcdiv(m, v.sqrt().add_(self.tau), value=self.lr)


class FedAdagrad(_AdaptiveServerOptimizer):
    """FedAdagrad (Reddi et al., ICLR 2021, Algorithm 2): v_t = v_{t−1} + Δ_t².

    The rest is Algorithm 2's: with Δ_t = target − w_t, m_t = β1·m_{t−1} + (1−β1)·Δ_t and
    w_{t+1} = w_t + η·m_t / (√v_t + τ), from m_{-1} = 0 and v_{-1} = τ² (the paper requires v_{-1} ≥ τ²; this uses
    exactly τ²), no bias correction. β1 = 0 by default (plain Adagrad); set ``beta1`` for momentum. The paper tunes η
    on a grid of powers of 10^0.5 per task.

    Args:
        lr: The server learning rate η (> 0).
        beta1: The first-moment decay β1 in [0, 1).
        tau: The adaptivity τ (> 0): v starts at τ² and τ is added to √v.

    >>> opt = FedAdagrad(lr=0.1, tau=1e-3)
    >>> out = opt.step({"w": torch.tensor([0.0])}, {"w": torch.tensor([0.5])})
    >>> round(out["w"].item(), 4)  # 0.1 · 0.5 / (√(1e-6 + 0.25) + 1e-3)
    0.0998
    """

    def __init__(self, lr: float = 0.01, beta1: float = 0.0, tau: float = 1e-3) -> None:
        super().__init__(lr=lr, beta1=beta1, tau=tau)

    def _second_moment_(self, v: Tensor, delta_sq: Tensor) -> None:
        v.add_(delta_sq)


class _DecayingSecondMoment(_AdaptiveServerOptimizer):
    """FedAdam's and FedYogi's common arguments: Algorithm 2 with a second-moment rate β2."""

    _hparam_names = ("lr", "beta1", "beta2", "tau")

    def __init__(self, lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3) -> None:
        super().__init__(lr=lr, beta1=beta1, tau=tau)
        self.beta2 = _check_unit(type(self).__name__, "beta2", beta2)


class FedAdam(_DecayingSecondMoment):
    """FedAdam (Reddi et al., ICLR 2021, Algorithm 2): v_t = β2·v_{t−1} + (1−β2)·Δ_t².

    With Δ_t = target − w_t, m_t = β1·m_{t−1} + (1−β1)·Δ_t, w_{t+1} = w_t + η·m_t / (√v_t + τ), m_{-1} = 0,
    v_{-1} = τ² (the paper requires v_{-1} ≥ τ²; this uses exactly τ²) and no bias correction. The paper tunes η on
    a grid of powers of 10^0.5 per task.

    Args:
        lr: The server learning rate η (> 0).
        beta1: The first-moment decay β1 in [0, 1).
        beta2: The second-moment decay β2 in [0, 1).
        tau: The adaptivity τ (> 0): v starts at τ² and τ is added to √v.

    >>> opt = FedAdam(lr=0.01, beta1=0.9, beta2=0.99, tau=1e-3)
    >>> out = opt.step({"w": torch.tensor([1.0])}, {"w": torch.tensor([1.2])})
    >>> round(out["w"].item(), 5)  # m = 0.02, v = 0.99e-6 + 0.01·0.04, w = 1 + 0.01·m/(√v + τ)
    1.00951
    """

    def _second_moment_(self, v: Tensor, delta_sq: Tensor) -> None:
        v.mul_(self.beta2).add_(delta_sq, alpha=1.0 - self.beta2)


class FedYogi(_DecayingSecondMoment):
    """FedYogi (Reddi et al., ICLR 2021, Algorithm 2): v_t = v_{t−1} − (1−β2)·Δ_t²·sign(v_{t−1} − Δ_t²).

    v moves toward Δ_t² by the additive step (1−β2)·Δ_t² instead of Adam's multiplicative decay. With
    Δ_t = target − w_t, m_t = β1·m_{t−1} + (1−β1)·Δ_t, w_{t+1} = w_t + η·m_t / (√v_t + τ), m_{-1} = 0, v_{-1} = τ²
    (the paper requires v_{-1} ≥ τ²; this uses exactly τ²) and no bias correction. The paper tunes η on a grid of
    powers of 10^0.5 per task.

    Args:
        lr: The server learning rate η (> 0).
        beta1: The first-moment decay β1 in [0, 1).
        beta2: The second-moment step β2 in [0, 1).
        tau: The adaptivity τ (> 0): v starts at τ² and τ is added to √v.

    >>> opt = FedYogi(lr=0.01, beta1=0.9, beta2=0.99, tau=1e-3)
    >>> out = opt.step({"w": torch.tensor([1.0])}, {"w": torch.tensor([1.2])})
    >>> round(opt.state["w"]["v"].item(), 8)  # 1e-6 + 0.01·0.04 (v < Δ², so v grows)
    0.000401
    """

    def _second_moment_(self, v: Tensor, delta_sq: Tensor) -> None:
        v.addcmul_(delta_sq, torch.sign(v - delta_sq), value=-(1.0 - self.beta2))


#: The server optimizers by name (``Federation(server_optimizer="fedadam")``, ``--federation.server_optimizer
#: fedadam``; :func:`server_optimizer_class`). Add an entry to name your own.
SERVER_OPTIMIZERS: Registry[type[ServerOptimizer]] = Registry(
    "SERVER_OPTIMIZERS",
    named_subclass(ServerOptimizer),
    {"sgd": ServerSGD, "fedadagrad": FedAdagrad, "fedadam": FedAdam, "fedyogi": FedYogi},
)


def server_optimizer_class(name: str) -> type[ServerOptimizer]:
    """The server optimizer registered as ``name`` in :data:`SERVER_OPTIMIZERS` (any case; its class's name too).

    >>> server_optimizer_class("FedAdam").__name__, server_optimizer_class("sgd").__name__
    ('FedAdam', 'ServerSGD')
    >>> server_optimizer_class("adam")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown server optimizer 'adam'; choose one of sgd, fedadagrad, fedadam, fedyogi (any case), ...
    """
    by_key: dict[str, type[ServerOptimizer]] = {}
    for short, cls in SERVER_OPTIMIZERS.items():
        by_key.setdefault(short.lower(), cls)
        by_key.setdefault(cls.__name__.lower(), cls)
    if name.lower() not in by_key:
        raise ValueError(
            f"unknown server optimizer {name!r}; choose one of {', '.join(SERVER_OPTIMIZERS)} (any case), "
            "or give a ServerOptimizer (a class path such as mypkg.MyOptimizer on the command line)"
        )
    return by_key[name.lower()]

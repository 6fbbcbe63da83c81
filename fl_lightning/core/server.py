"""The server of a simulated federation, without Lightning: it plans the rounds, keeps its state and steps.

:class:`FederatedServer` holds the settings that plan a run's rounds (checked) and what the server keeps between
rounds (the method's server state, each client's persistent state, the server optimizer), and takes the server step
after each round's clients: the reduce, the clients' new states, the method's server update, then the server
optimizer (:mod:`~fl_lightning.core.server_optim`). The :class:`~fl_lightning.Federation` callback is one, driven by
Lightning's hooks. :func:`upgrade_state` reads the callback's checkpoint state as earlier versions wrote it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from fl_lightning.core.aggregation import aggregation_weights
from fl_lightning.core.context import ServerContext, checked_weights
from fl_lightning.core.distributed import to_device
from fl_lightning.core.messages import require, require_integer, require_number, require_one_of
from fl_lightning.core.rounds import RoundPlan, RoundState, plan_round
from fl_lightning.core.rundir import RunDirError, checkpoint_diff
from fl_lightning.core.server_optim import ServerOptimizer, ServerSGD, server_optimizer_class
from fl_lightning.core.state import ClientStateStore, plain_state, restore_state, weights_only_refuses

#: A method's server update: the new global weights from the server context, the clients' average and uploads.
MethodUpdate = Callable[[ServerContext, dict[str, Tensor], dict[str, Tensor]], dict[str, Tensor]]


class FederatedServer:
    """The settings that plan a run's rounds, the state the server keeps between rounds, and its step.

    Out-of-range settings raise ``ValueError`` naming the first of them.

    Args:
        rounds: communication rounds R.
        sample_ratio: fraction of clients sampled per round, ``round(ratio·N)`` (at least 1), in (0, 1].
        local_epochs: local epochs E each sampled client trains per round.
        aggregation: ``weighted`` (by client sample counts, FedAvg) or ``uniform`` (plain mean).
        lr_decay: the learning rate of round r is ``lr_0 · lr_decay^r``.
        eval_every: evaluate the global model every this many rounds (and always after the last one).
        seed: seed of client sampling (and of the clients' local shuffling and augmentation).
        server_optimizer: the server step applied to the method's new global weights (default: plain averaging).
        client_state_mb: CPU memory for the clients' persistent states before further ones are kept on disk
            (``None``: no limit).

    >>> server = FederatedServer(rounds=4, sample_ratio=0.5, eval_every=3)
    >>> server.plan_for(0, client_sizes=[40, 10, 30, 20], batch_size=10).clients
    (0, 3)
    >>> [r for r in range(1, 5) if server.evaluates(r)]
    [3, 4]
    >>> FederatedServer(sample_ratio=0.0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: sample_ratio must be in (0, 1], got 0.0; give a fraction of the clients (--federation.sample_ratio, ...
    """

    def __init__(
        self,
        rounds: int = 20,
        sample_ratio: float = 1.0,
        local_epochs: int = 1,
        aggregation: str = "weighted",
        lr_decay: float = 1.0,
        eval_every: int = 1,
        seed: int = 0,
        server_optimizer: ServerOptimizer | None = None,
        client_state_mb: float | None = None,
    ) -> None:
        for name, count in (("rounds", rounds), ("local_epochs", local_epochs), ("eval_every", eval_every)):
            require_integer(name, count)
        require_integer("seed", seed, least=0)
        require(rounds >= 1, f"rounds must be at least 1, got {rounds}")
        self.sample_ratio = require_number(
            "sample_ratio",
            sample_ratio,
            "(0, 1]",
            hint="give a fraction of the clients (--federation.sample_ratio, in Python Federation(sample_ratio=...))",
        )
        require(local_epochs >= 1, f"local_epochs must be at least 1, got {local_epochs}")
        require_one_of("aggregation", aggregation, ("weighted", "uniform"))
        self.lr_decay = require_number("lr_decay", lr_decay, "(0, 1]")
        require(eval_every >= 1, f"eval_every must be at least 1, got {eval_every}")
        self.client_state_mb = require_number("client_state_mb", client_state_mb, ">= 0", optional=True)
        self.rounds = int(rounds)
        self.local_epochs = int(local_epochs)
        self.aggregation = aggregation
        self.eval_every = int(eval_every)
        self.seed = int(seed)
        self.server_optimizer = server_optimizer_of(server_optimizer, 1.0, 0.0)
        #: The method's persistent server state (checkpointed).
        self.server_state: dict[str, Any] = {}
        #: Each client's persistent method state (checkpointed).
        self.client_states = ClientStateStore()
        self._warned_weights_only = False

    # ---- planning -----------------------------------------------------------------------------------------------

    def plan_for(
        self, round_idx: int, client_sizes: Sequence[int], batch_size: int, drop_last: bool = False
    ) -> RoundPlan:
        """Round ``round_idx``'s plan (:func:`~fl_lightning.core.rounds.plan_round`) for clients of these sizes."""
        return plan_round(
            round_idx,
            seed=self.seed,
            client_sizes=client_sizes,
            sample_ratio=self.sample_ratio,
            batch_size=batch_size,
            local_epochs=self.local_epochs,
            drop_last=drop_last,
            lr_decay=self.lr_decay,
        )

    def weights_for(self, plan: RoundPlan, client_sizes: Sequence[int]) -> list[float]:
        """``plan``'s clients' weights (:func:`~fl_lightning.core.aggregation.aggregation_weights`) from their sizes."""
        return aggregation_weights([client_sizes[c] for c in plan.clients], self.aggregation)

    def evaluates(self, round_number: int) -> bool:
        """Whether the global model is evaluated after round ``round_number`` (counted from 1)."""
        return round_number % self.eval_every == 0 or round_number >= self.rounds

    # ---- the server's state and step ------------------------------------------------------------------------------

    def start_fit(self, spill_dir: Path) -> None:
        """Start from no state (a checkpoint restores it); with ``client_state_mb``, spill clients' states here."""
        spill = spill_dir if self.client_state_mb is not None else None
        self.client_states = ClientStateStore(self.client_state_mb, spill)
        self.server_state = {}
        self.server_optimizer.reset()

    def server_step(
        self, rnd: RoundState, server: ServerContext, method_update: MethodUpdate | None = None
    ) -> dict[str, Tensor]:
        """The new global weights after round ``rnd``'s clients; their new states are kept.

        The clients' weighted average and reduced uploads (:meth:`RoundState.reduce
        <fl_lightning.core.rounds.RoundState.reduce>`), then the method's ``method_update`` (``None``: the average),
        then the server optimizer's step from the round's global weights towards that target.
        """
        average, uploads = rnd.reduce({k: v.dtype for k, v in rnd.global_weights.items()})
        for client, state in rnd.received_states.items():
            self.client_states.put(client, state)
        new_global = average
        if method_update is not None:
            owner = type(getattr(method_update, "__self__", method_update)).__name__
            new_global = checked_weights(owner, method_update(server, average, uploads), average)
        if not self.server_optimizer.is_identity:
            new_global = self.server_optimizer.step(rnd.global_weights, new_global, server.param_keys)
        return new_global

    def server_state_dict(self) -> dict[str, Any]:
        """The server's state for a checkpoint (tensors on the CPU), with the settings it was made with."""
        # plain_state: a defaultdict or named tuple in a state loads with Lightning's weights_only default
        server_state = plain_state(to_device(self.server_state, "cpu"))
        client_state = {client: plain_state(state) for client, state in self.client_states.items()}
        if not self._warned_weights_only:
            self._warn_weights_only(server_state, client_state)
        return {
            "server_state": server_state,
            "client_state": client_state,
            "server_optimizer": self.server_optimizer.state_dict(),
            "seed": self.seed,
            "settings": self.settings(),
        }

    def _warn_weights_only(self, server_state: Any, client_state: Mapping[int, Any]) -> None:
        """Warn, once a run, that a state holds a value only ``weights_only=False`` loads (the resume must say so)."""
        owned = [("server.state", server_state), *((f"client {c}'s state", s) for c, s in client_state.items())]
        for owner, state in owned:
            found = weights_only_refuses(state)
            if found is not None:
                path, value = found
                keys = "".join(f"[{key!r}]" for key in path)
                kind = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
                warnings.warn(
                    f"{owner}{keys} holds a {kind}, which Lightning's default checkpoint load (weights_only=True) "
                    "refuses: resume with --weights_only false (trainer.fit(..., weights_only=False)), or keep only "
                    "tensors, numbers, strings and containers of them in the state",
                    stacklevel=2,
                )
                self._warned_weights_only = True
                return

    def settings(self) -> dict[str, Any]:
        """The settings that decide what the rounds train, by their ``federation.<key>`` names.

        The server step is ``server_step``, the server optimizer with its hyper-parameters (``ServerSGD(lr=1.0,
        momentum=0.0)``: plain averaging), whichever way it was given.

        >>> FederatedServer(rounds=4).settings()["server_step"]
        'ServerSGD(lr=1.0, momentum=0.0)'
        """
        opt = self.server_optimizer
        step = ", ".join(f"{name}={float(getattr(opt, name))!r}" for name in opt._hparam_names)
        return {
            "rounds": self.rounds,
            "sample_ratio": self.sample_ratio,
            "local_epochs": self.local_epochs,
            "aggregation": self.aggregation,
            "lr_decay": self.lr_decay,
            "eval_every": self.eval_every,
            "seed": self.seed,
            "server_step": f"{type(opt).__name__}({step})",
        }

    def check_resume(
        self, ckpt: Mapping[str, Any], model_hparams: Mapping[str, Any], data_hparams: Mapping[str, Any]
    ) -> None:
        """Refuse to resume from ``ckpt`` with other settings than it was trained with, naming each differing key.

        The new settings are the module's and the datamodule's hyper-parameters and this server's
        :meth:`settings`, compared by :func:`~fl_lightning.core.rundir.checkpoint_diff` (the command line's check);
        the rounds may grow.

        Raises:
            RunDirError: a ``ValueError`` whose one line names each differing key, ``key: old -> new``.
        """
        new = {"model": {"init_args": dict(model_hparams)}, "data": dict(data_hparams), "federation": self.settings()}
        diff = checkpoint_diff(ckpt, new)
        if diff:
            raise RunDirError(
                f"cannot resume: {'; '.join(diff)} (the checkpoint's settings -> this fit's); resume with the run's "
                "own settings, or start a new run in another default_root_dir"
            )

    def check_new_fit(self, rounds_done: int, resuming: bool) -> None:
        """Refuse a second fit by a trainer that already ran ``rounds_done`` rounds, unless it ``resuming`` one.

        >>> FederatedServer(rounds=3).check_new_fit(3, resuming=False)
        Traceback (most recent call last):
        ...
        ValueError: this Trainer already ran a federation (3 of 3 rounds); create a new Trainer for another fit, ...
        """
        if rounds_done > 0 and not resuming:
            raise ValueError(
                f"this Trainer already ran a federation ({rounds_done} of {self.rounds} rounds); create a new Trainer "
                "for another fit, or resume a run with trainer.fit(..., ckpt_path='last')"
            )

    def check_seed(self, state: Mapping[str, Any]) -> None:
        """Refuse a checkpoint state made with another seed (its rounds would not be this run's)."""
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"the checkpoint was made with seed {state['seed']}, this run uses {self.seed}")

    def load_server_state(self, state: Mapping[str, Any]) -> None:
        """Restore the state :meth:`server_state_dict` saved (in the current form: see :func:`upgrade_state`)."""
        self.server_state = dict(restore_state(state.get("server_state") or {}))
        self.client_states.load_state_dict({c: restore_state(s) for c, s in (state.get("client_state") or {}).items()})
        if "server_optimizer" in state:
            self.server_optimizer.load_state_dict(state["server_optimizer"])


def server_optimizer_of(optimizer: ServerOptimizer | str | None, lr: float, momentum: float) -> ServerOptimizer:
    """The server step: ``optimizer``, or ``ServerSGD(lr, momentum)`` when it is ``None`` (give one of the two).

    A name is the server optimizer of :data:`~fl_lightning.core.server_optim.SERVER_OPTIMIZERS` it names, with its
    defaults.

    >>> server_optimizer_of(None, 1.0, 0.0).is_identity
    True
    >>> type(server_optimizer_of("fedadam", 1.0, 0.0)).__name__
    'FedAdam'
    """
    lr = require_number("server_lr", lr, "> 0")
    momentum = require_number("server_momentum", momentum, "[0, 1)")
    if isinstance(optimizer, str):
        optimizer = server_optimizer_class(optimizer)()
    if optimizer is not None and not isinstance(optimizer, ServerOptimizer):
        raise TypeError(f"server_optimizer must be a ServerOptimizer or its name, got {type(optimizer).__name__}")
    if optimizer is not None and (lr != 1.0 or momentum != 0.0):
        raise ValueError(
            "give the server step once: either server_optimizer or server_lr/server_momentum "
            f"(got server_optimizer {type(optimizer).__name__} and server_lr {lr}, "
            f"server_momentum {momentum}); set the learning rate in server_optimizer's init_args"
        )
    return optimizer or ServerSGD(lr=lr, momentum=momentum)


def upgrade_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """The callback's checkpoint state in the current form, from the state of any version.

    Checkpoints written before the run's record was its own entry hold the record's keys at the top level (and no
    client states); checkpoints written before server optimizers hold FedAvgM's buffer as ``momentum_buffer``.

    >>> sorted(upgrade_state({"history": [], "momentum_buffer": {"w": 0}}))
    ['client_state', 'history', 'momentum_buffer', 'record', 'server_optimizer']
    """
    out = dict(state)
    if "history" in out:
        out = {**out, "record": dict(state), "client_state": {}}
    if "server_optimizer" not in out and out.get("momentum_buffer"):
        out["server_optimizer"] = {"state": {k: {"momentum_buffer": v} for k, v in out["momentum_buffer"].items()}}
    return out

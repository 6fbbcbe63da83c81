"""Running a round's local updates: the one step of a round that an executor owns.

:class:`ClientExecutor` is what every executor shares: a client's start (the global weights, a fresh optimizer, its
seed, its :class:`~fl_lightning.core.context.ClientContext`, the teacher and the method's ``on_client_start``) and its
end (the method's ``on_client_end``, then its weights, upload, loss and state to the round's
:class:`~fl_lightning.core.rounds.RoundState`). :class:`SequentialClients` runs the clients in Lightning's training
loop, one after another; :class:`~fl_lightning.batched.BatchedClients` trains a group of them per training batch.
Planning, the reduce, the server step and evaluation are not an executor's business;
:func:`~fl_lightning.engines.choose_executor` picks the executor for a fit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
from torch import Tensor

from fl_lightning.core.context import ClientContext
from fl_lightning.core.distributed import to_device
from fl_lightning.core.evaluation import Evaluation
from fl_lightning.core.rounds import RoundState, round_seed, seed_torch
from fl_lightning.core.state import ClientStateStore
from fl_lightning.data import FederatedDataModule
from fl_lightning.module import FedAvg, FederatedHooks, client_upload


class ClientExecutor:
    """What every executor does for each client: its start and its end; the batch hooks are the executor's own.

    Args:
        datamodule: the federated data (set up).
        client_states: where each client's persistent method state lives between rounds.
        seed: the federation's seed; a client's random draws are seeded by (seed, round, client).
        evaluate_local: evaluates the module's current (local) weights, for ``eval_local``; ``None`` to skip.
    """

    def __init__(
        self,
        datamodule: FederatedDataModule,
        client_states: ClientStateStore,
        seed: int,
        evaluate_local: Callable[[L.LightningModule], Evaluation] | None = None,
    ) -> None:
        self.dm = datamodule
        self.client_states = client_states
        self.seed = seed
        self.evaluate_local = evaluate_local
        self.round: RoundState | None = None
        self.payload: dict[str, Any] = {}

    def start_round(self, rnd: RoundState, payload: dict[str, Any]) -> None:
        """Train ``rnd``'s clients next; every client receives the method's ``payload``."""
        self.round, self.payload = rnd, payload

    def on_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        """Before a training batch (``Callback.on_train_batch_start``)."""
        raise NotImplementedError

    def before_optimizer_step(self, module: L.LightningModule) -> None:
        """Before Lightning's optimizer step (``Callback.on_before_optimizer_step``); nothing by default."""

    def on_batch_end(self, module: L.LightningModule, outputs: Any, batch_idx: int) -> None:
        """After a training batch (``Callback.on_train_batch_end``); nothing by default."""

    # ---- a client's start and end ---------------------------------------------------------------------------------

    def reset(self, trainer: L.Trainer, module: L.LightningModule, load: bool = True) -> None:
        """Back to the round's start: the global weights (unless ``load`` is false) and empty optimizer states."""
        rnd = self.round
        assert rnd is not None
        if load:
            module.load_state_dict(rnd.global_weights)
        for opt in trainer.optimizers:
            opt.state.clear()

    def client_context(self, pos: int, device: torch.device, lr: float) -> ClientContext:
        """The context of the round's client at position ``pos``, training with learning rate ``lr``."""
        rnd = self.round
        assert rnd is not None
        slot = rnd.slots[pos]
        client = rnd.plan.clients[slot]
        return self.dm.client_context(
            rnd.plan.round,
            client,
            steps=rnd.plan.steps[slot],
            lr=lr,
            weight=rnd.weights[slot],
            server=self.payload,
            state=to_device(self.client_states.get(client), device),
            global_weights=rnd.global_weights,
            device=device,
            generator=torch.Generator().manual_seed(round_seed(self.seed, rnd.plan.round, client, 2)),
        )

    def start_client(self, module: L.LightningModule, ctx: ClientContext, refresh_teacher: bool = True) -> None:
        """A client starts on the module's weights: its seed, its context, the teacher and ``on_client_start``.

        ``refresh_teacher``: refresh the teacher when the client needs one (false where the caller refreshed it).
        """
        # Seeded per client, so a client's random draws do not depend on which clients ran before it (or where).
        seed_torch(round_seed(self.seed, ctx.round, ctx.client, 1), module.device)
        if isinstance(module, FedAvg):
            module.client = ctx
        if isinstance(module, FederatedHooks):
            if refresh_teacher and module.teacher_needed(ctx):
                module.refresh_teacher()
            module.on_client_start(ctx)

    def end_client(
        self,
        module: L.LightningModule,
        pos: int,
        ctx: ClientContext,
        loss: float | Tensor,
        weights: Mapping[str, Tensor] | None = None,
        upload: Mapping[str, Tensor] | None = None,
    ) -> None:
        """A client ends: its results go to the round, its state is kept, and ``eval_local`` evaluates it.

        ``weights`` and ``upload`` default to the module's weights and the method's ``on_client_end``; ``module``
        holds the client's local weights whenever ``eval_local`` evaluates it.
        """
        rnd = self.round
        assert rnd is not None
        if upload is None:
            upload = client_upload(module, ctx)
        if weights is None:
            weights = module.state_dict()
        if rnd.add_client(pos, weights, upload, loss, ctx.client, ctx.state):
            self.client_states.put(ctx.client, ctx.state)
            if self.evaluate_local is not None:
                rnd.add_local_eval(pos, self.evaluate_local(module))


class SequentialClients(ClientExecutor):
    """The round's clients trained one after another by Lightning's training loop.

    A client starts at its first training batch and ends after its last; the arguments are :class:`ClientExecutor`'s.
    """

    #: The client training now (``None`` between clients).
    client: ClientContext | None = None

    def start_round(self, rnd: RoundState, payload: dict[str, Any]) -> None:
        """Train ``rnd``'s clients next; every client receives the method's ``payload``."""
        super().start_round(rnd, payload)
        self.client = None

    def on_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        """At a client's first batch: the global weights, a fresh optimizer, its seed, context, teacher and hook."""
        rnd = self.round
        assert rnd is not None
        pos = rnd.client_starting(batch_idx)
        if pos is None:
            return
        self.reset(trainer, module, load=pos > 0)  # the first client starts on the weights the round snapshotted
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else 0.0
        self.client = ctx = self.client_context(pos, module.device, lr)
        self.start_client(module, ctx)

    def before_optimizer_step(self, module: L.LightningModule) -> None:
        """A module that trains one batch per local step (not a method) gets its ``before_local_step`` here."""
        if isinstance(module, FederatedHooks) and not isinstance(module, FedAvg):
            module.before_local_step()

    def on_batch_end(self, module: L.LightningModule, outputs: Any, batch_idx: int) -> None:
        """Record the batch's loss; after a client's last batch, hand its results to the round."""
        rnd, ctx = self.round, self.client
        assert rnd is not None
        rnd.step_loss(outputs.get("loss") if isinstance(outputs, dict) else outputs)
        pos = rnd.client_ending(batch_idx)
        if pos is None or ctx is None:
            return
        self.end_client(module, pos, ctx, rnd.client_loss())

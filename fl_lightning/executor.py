"""Running a round's local updates: the one step of a round that an executor owns.

:class:`SequentialClients` runs them in Lightning's training loop, one client after another: it restarts the module
from the global weights with a fresh optimizer at a client's first training batch, hands the method its
:class:`~fl_lightning.core.context.ClientContext`, and gives the finished client's weights, upload, loss and state to
the
round's :class:`~fl_lightning.core.rounds.RoundState`. Planning, the reduce, the server step and evaluation are not its
business, so another executor (clients trained together, or real devices) can replace it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from fl_lightning.core.context import ClientContext
from fl_lightning.core.distributed import to_device
from fl_lightning.core.evaluation import Evaluation
from fl_lightning.core.rounds import RoundState, round_seed, seed_torch
from fl_lightning.core.state import ClientStateStore
from fl_lightning.data import FederatedDataModule
from fl_lightning.module import FedAvg, FederatedHooks


class SequentialClients:
    """The round's clients trained one after another by Lightning's training loop.

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
        self.client: ClientContext | None = None

    def start_round(self, rnd: RoundState, payload: dict[str, Any]) -> None:
        """Train ``rnd``'s clients next; every client receives the method's ``payload``."""
        self.round, self.payload, self.client = rnd, payload, None

    def on_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        """At a client's first batch: the global weights, a fresh optimizer, its seed, context, teacher and hook."""
        rnd = self.round
        assert rnd is not None
        pos = rnd.client_starting(batch_idx)
        if pos is None:
            return
        slot = rnd.slots[pos]
        client = rnd.plan.clients[slot]
        if pos > 0:
            module.load_state_dict(rnd.global_weights)
        for opt in trainer.optimizers:
            opt.state.clear()
        # Seeded per client, so a client's random draws do not depend on which clients ran before it (or where).
        seed_torch(round_seed(self.seed, rnd.plan.round, client, 1), module.device)
        self.client = ctx = self.dm.client_context(
            rnd.plan.round,
            client,
            steps=rnd.plan.steps[slot],
            lr=trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else 0.0,
            weight=rnd.weights[slot],
            server=self.payload,
            state=to_device(self.client_states.get(client), module.device),
            global_weights=rnd.global_weights,
            device=module.device,
            generator=torch.Generator().manual_seed(round_seed(self.seed, rnd.plan.round, client, 2)),
        )
        if isinstance(module, FedAvg):
            module.client = ctx
        if isinstance(module, FederatedHooks):
            if module.teacher_needed(ctx):
                module.refresh_teacher()
            module.on_client_start(ctx)

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
        upload = (module.on_client_end(ctx) if isinstance(module, FederatedHooks) else None) or {}
        if rnd.add_client(pos, module.state_dict(), upload, rnd.client_loss(), ctx.client, ctx.state):
            self.client_states.put(ctx.client, ctx.state)
            if self.evaluate_local is not None:
                rnd.add_local_eval(pos, self.evaluate_local(module))

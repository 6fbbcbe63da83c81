"""The federation callback: one Lightning epoch is one communication round.

Within a single ``Trainer.fit`` each round is: plan (sample clients, split them over processes) → local updates
(each client restarts from the global weights with a fresh optimizer) → reduce (weighted sums of weights and uploads,
across processes) → server step (the method's ``server_update``, then optional server momentum) → evaluate. What a
round measures goes to a :class:`~fl_lightning.recorder.RunRecorder`, which owns the run's files and logger output.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor
from typing_extensions import override

from fl_lightning.aggregation import StateAccumulator, UploadAccumulator, aggregation_weights
from fl_lightning.context import ClientContext, ServerContext
from fl_lightning.data import FederatedDataModule, RoundPlan, _round_seed, client_steps
from fl_lightning.distributed import all_gather_object, all_reduce_sum_, assign_clients, rank_and_world, to_device
from fl_lightning.metrics import forgetting_degree
from fl_lightning.module import FedAvg, FederatedHooks
from fl_lightning.progress import quiet_lightning
from fl_lightning.recorder import RunRecorder
from fl_lightning.state import ClientStateStore

_CPU_PRECISIONS = ("32-true", "32", "64-true", "64", "bf16-mixed")


@dataclass
class _Round:
    """What one round knows while its clients train (rebuilt every round, never checkpointed)."""

    plan: RoundPlan
    slots: list[int]  # this process's client slots (positions in plan.clients)
    first_batch: list[int]  # per-step batches: the batch index where each of this process's clients starts
    global_weights: dict[str, Tensor]
    weights: list[float]
    server: ServerContext
    payload: dict[str, Any]
    states: StateAccumulator
    uploads: UploadAccumulator
    started_at: float
    received_class_acc: np.ndarray
    done: int = 0
    client: ClientContext | None = None
    step_losses: list[Tensor] = field(default_factory=list)
    losses: dict[int, float] = field(default_factory=dict)
    local_evals: dict[int, tuple[float, np.ndarray]] = field(default_factory=dict)
    updated_states: dict[int, dict[str, Any]] = field(default_factory=dict)
    diverged: list[str] = field(default_factory=list)


class Federation(Callback):
    """Runs federated training inside one ``Trainer.fit``: each training epoch is one communication round.

    Works with any LightningModule: an fl_lightning method (:class:`~fl_lightning.FedAvg` and its subclasses) trains a
    whole client in one training batch; any other module sees its ordinary per-step batches, client after client,
    with its own ``training_step`` and ``configure_optimizers``, and is federated as FedAvg (mix in
    :class:`~fl_lightning.module.FederatedHooks` to take part in the method hooks). With several processes
    (``devices``/``num_nodes`` with a DDP strategy) each process trains its own share of the round's clients with no
    gradient synchronisation, and the weighted sums are reduced once per round.

    Args:
        rounds: communication rounds R (sets the Trainer's ``max_epochs``).
        sample_ratio: fraction of clients sampled per round, ``round(ratio·N)`` (at least 1), in (0, 1].
        local_epochs: local epochs E each sampled client trains per round.
        aggregation: ``weighted`` (by client sample counts, FedAvg) or ``uniform`` (plain mean).
        lr_decay: the learning rate of round r is ``lr_0 · lr_decay^r``.
        eval_every: evaluate the global model every this many rounds (and always after the last one).
        server_lr: server learning rate η_s applied to the averaged update (1 = plain averaging).
        server_momentum: server momentum β_s (FedAvgM; 0 disables). Composes with any method's server step.
        seed: seed of client sampling, local shuffling and augmentation.
        plots: write the learning-curve and partition PNGs into the run directory.
        eval_local: also evaluate every updated local model on the test set (costs one test pass per client) and
            report their mean accuracy AccL (FedSSD §3.1) and FedKA's class-wise forgetting degree (§3.1).
        client_state_mb: CPU memory for per-client method state (SCAFFOLD's controls, MOON's previous models, ...)
            before further clients' states are kept on disk under ``<run dir>/client_state`` (``None``: no limit).
        collapse_rounds: stop a run as ``diverged`` once its global model has been right on at most one class (it
            predicts one class for everything: chance accuracy, the papers' "Failed") in this many evaluated rounds
            in a row; the divergence round is the first of them (``None``: never; never for a one-class test set).
            Healthy runs in ``results/`` spend at most 2 rounds in a row so, all in their first rounds.
    """

    def __init__(
        self,
        rounds: int = 20,
        sample_ratio: float = 1.0,
        local_epochs: int = 1,
        aggregation: str = "weighted",
        lr_decay: float = 1.0,
        eval_every: int = 1,
        server_lr: float = 1.0,
        server_momentum: float = 0.0,
        seed: int = 0,
        plots: bool = True,
        eval_local: bool = False,
        client_state_mb: float | None = None,
        collapse_rounds: int | None = 10,
    ) -> None:
        if rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {rounds}")
        if not 0 < sample_ratio <= 1:
            raise ValueError(f"sample_ratio must be in (0, 1], got {sample_ratio}")
        if local_epochs < 1:
            raise ValueError(f"local_epochs must be at least 1, got {local_epochs}")
        if aggregation not in ("weighted", "uniform"):
            raise ValueError(f"aggregation must be 'weighted' or 'uniform', got {aggregation!r}")
        if not 0 < lr_decay <= 1:
            raise ValueError(f"lr_decay must be in (0, 1], got {lr_decay}")
        if eval_every < 1:
            raise ValueError(f"eval_every must be at least 1, got {eval_every}")
        if server_lr <= 0 or not 0 <= server_momentum < 1:
            raise ValueError(f"need server_lr > 0 and server_momentum in [0, 1), got {server_lr}, {server_momentum}")
        if client_state_mb is not None and client_state_mb < 0:
            raise ValueError(f"client_state_mb must be >= 0 (or None for no limit), got {client_state_mb}")
        if collapse_rounds is not None and collapse_rounds < 1:
            raise ValueError(f"collapse_rounds must be at least 1 (or None to never stop), got {collapse_rounds}")
        self.rounds = rounds
        self.sample_ratio = sample_ratio
        self.local_epochs = local_epochs
        self.aggregation = aggregation
        self.lr_decay = lr_decay
        self.eval_every = eval_every
        self.server_lr = server_lr
        self.server_momentum = server_momentum
        self.seed = seed
        self.plots = plots
        self.eval_local = eval_local
        self.client_state_mb = client_state_mb
        self.collapse_rounds = collapse_rounds

        # persistent state (checkpointed)
        self.server_state: dict[str, Any] = {}
        self.client_states = ClientStateStore()
        self.momentum_buffer: dict[str, Tensor] | None = None
        # per-run objects, built in setup
        self.dm: FederatedDataModule | None = None
        self.recorder: RunRecorder | None = None
        self._hooks = False
        self._client_batches = True
        self._plans: dict[int, RoundPlan] = {}
        self._round: _Round | None = None
        self._pending_state: dict[str, Any] | None = None

    @property
    def history(self) -> list[dict[str, float]]:
        """The evaluated rounds so far, one dict per ``metrics.csv`` row (empty before fit)."""
        return self.recorder.history if self.recorder is not None else []

    @property
    def status(self) -> str:
        """``running``, or how the run ended: ``completed``, ``diverged``, ``interrupted`` or ``failed``."""
        return self.recorder.status if self.recorder is not None else "running"

    # ---- planning ---------------------------------------------------------------------------------------------

    def num_sampled(self, num_clients: int) -> int:
        """Clients per round: ``round(sample_ratio · N)``, at least 1."""
        return max(1, int(round(self.sample_ratio * num_clients)))

    def plan(self, round_idx: int) -> RoundPlan:
        """The clients, local steps and learning-rate scale of round ``round_idx`` (a pure function of the seed)."""
        if round_idx in self._plans:
            return self._plans[round_idx]
        assert self.dm is not None, "Federation.plan needs setup() first"
        n = self.dm.num_clients
        rng = np.random.default_rng(_round_seed(self.seed, round_idx))
        clients = tuple(int(c) for c in np.sort(rng.choice(n, self.num_sampled(n), replace=False)))
        sizes = self.dm.client_sizes
        steps = tuple(client_steps(sizes[c], self.dm.batch_size, self.local_epochs, self.dm.drop_last) for c in clients)
        plan = RoundPlan(round_idx, clients, steps, self.local_epochs, self.lr_decay**round_idx)
        self._plans = {round_idx: plan}
        return plan

    def local_plan(self, round_idx: int) -> RoundPlan:
        """This process's share of round ``round_idx``: the clients it trains (all of them in a single process).

        Every process gets the same number of training batches (Lightning synchronises processes at every batch):
        a process with fewer clients than another is padded with empty updates (client id -1, no steps).
        """
        plan = self.plan(round_idx)
        rank, world = rank_and_world()
        if world == 1:
            return plan
        shares = assign_clients(plan.steps, world)
        padding = max(map(len, shares)) - len(shares[rank])
        return RoundPlan(
            plan.round,
            tuple(plan.clients[s] for s in shares[rank]) + (-1,) * padding,
            tuple(plan.steps[s] for s in shares[rank]) + (0,) * padding,
            plan.local_epochs,
            plan.lr_scale,
        )

    # ---- setup --------------------------------------------------------------------------------------------------

    def prepare_trainer(self, trainer: L.Trainer) -> None:
        """Before Lightning reads ``max_epochs`` or resolves ``ckpt_path="last"`` (the datamodule calls this on attach).

        Sets the Trainer's epochs to the rounds (no "max_epochs was not set" warning) and keeps the last checkpoint in
        ``<default_root_dir>/checkpoints/last.ckpt``, so that ``trainer.fit(..., ckpt_path="last")`` resumes a plain
        Python run as ``--ckpt_path last`` does on the command line.
        """
        if trainer.fit_loop.max_epochs is None:
            trainer.fit_loop.max_epochs = self.rounds
        for cb in trainer.checkpoint_callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.dirpath is None:
                cb.dirpath = str(Path(trainer.default_root_dir) / "checkpoints")
                if cb.save_last is None:
                    cb.save_last = True

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Check the pieces fit together, hook the datamodule's round loader and prepare the run's record."""
        if stage != "fit":
            return
        dm = trainer.datamodule
        if not isinstance(dm, FederatedDataModule):
            raise TypeError(
                f"the Federation callback needs a FederatedDataModule, got {type(dm).__name__}; "
                "pass datamodule=FederatedDataModule(...) to trainer.fit"
            )
        self._hooks = isinstance(pl_module, FederatedHooks)
        self._client_batches = isinstance(pl_module, FedAvg)
        self._check_trainer(trainer, pl_module)
        if trainer.world_size > 1 and not self._client_batches:
            raise TypeError(
                f"several processes need an fl_lightning method (FedAvg or a subclass); {type(pl_module).__name__} "
                "trains per-step batches, which cannot be padded to keep processes in step: use one device"
            )
        need = pl_module.holdout_per_class_required if self._hooks else 0
        if dm.holdout_per_class < need:
            raise ValueError(
                f"{pl_module.method_name} needs {need} server holdout samples per class; "
                f"set --data.holdout_per_class {need} (it is {dm.holdout_per_class})"
            )
        if getattr(pl_module, "num_classes", dm.num_classes) != dm.num_classes:
            raise ValueError(
                f"the model predicts {pl_module.num_classes} classes but {dm.dataset} has {dm.num_classes}"
            )
        quiet_lightning()
        # Metrics a method logs reach the loggers through the recorder, on the round axis, not every n local steps.
        trainer.log_every_n_steps = 2**31
        dm.setup("fit")
        if dm.drop_last and min(dm.client_sizes) < dm.batch_size:
            raise ValueError(
                f"with drop_last, clients smaller than one batch never train (smallest client {min(dm.client_sizes)} "
                f"samples, batch size {dm.batch_size}); set --data.drop_last false or a smaller --data.batch_size"
            )
        self.dm = dm
        dm.plan_fn = self.local_plan
        dm.flat = not self._client_batches
        self._plans = {}
        trainer.fit_loop.max_epochs = self.rounds
        trainer.reload_dataloaders_every_n_epochs = 1
        run_dir = Path(trainer.default_root_dir)
        self.client_states = ClientStateStore(
            self.client_state_mb, run_dir / "client_state" if self.client_state_mb is not None else None
        )
        self.recorder = RunRecorder(run_dir, self._run_info(trainer, pl_module), self.plots, self.rounds)
        if self._pending_state is not None:  # a checkpoint restored before setup (Lightning restores after it)
            self.load_state_dict(self._pending_state)

    def _check_trainer(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        precision = str(trainer.precision)
        on_cpu = trainer.strategy.root_device.type == "cpu"
        if on_cpu and precision not in _CPU_PRECISIONS:
            raise ValueError(
                f"precision {precision!r} needs a CUDA GPU; on the CPU use --trainer.precision 32-true (or bf16-mixed)"
            )
        if self._hooks and pl_module.needs_exact_steps and precision in ("16-mixed", "16"):
            raise ValueError(
                f"{pl_module.method_name} counts local steps, and 16-mixed's gradient scaler can skip some; "
                "use --trainer.precision bf16-mixed or 32-true"
            )
        if trainer.accumulate_grad_batches != 1:
            raise ValueError("accumulate_grad_batches must be 1: every local batch is one optimizer step")
        if trainer.limit_train_batches not in (1.0, None):
            raise ValueError(
                "limit_train_batches would cut rounds short (a round trains every sampled client); "
                "use --federation.rounds, --federation.sample_ratio or --federation.local_epochs for a smaller run"
            )

    def _run_info(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        assert self.dm is not None
        net = pl_module.hparams.get("net") if hasattr(pl_module, "hparams") else None
        return {
            "method": pl_module.method_name if self._hooks else type(pl_module).__name__,
            "dataset": self.dm.dataset,
            "partition": self.dm.partition_label,
            "num_clients": self.dm.num_clients,
            "sample_ratio": self.sample_ratio,
            "local_epochs": self.local_epochs,
            "model": net if isinstance(net, str) or net is None else type(net).__name__,
            "seed": self.seed,
            "precision": str(trainer.precision),
            "world_size": trainer.world_size,
        }

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Let each process train its clients on its own, and move the server state to the training device."""
        # DDP would average every local gradient across processes, i.e. mix different clients' steps. Clients train
        # independently; their weights are reduced once per round by this callback.
        if trainer.strategy.model is not pl_module:
            trainer.strategy.model = pl_module
        self.server_state = to_device(self.server_state, pl_module.device)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Training really starts (any checkpoint was accepted): mark the run as running, draw the partition."""
        assert self.recorder is not None and self.dm is not None
        self.recorder.start(trainer)
        if trainer.is_global_zero and not self.recorder.history:
            title = f"{self.dm.dataset}, {self.dm.partition_label}, {self.dm.num_clients} clients"
            self.recorder.write_partition(self.dm.client_class_counts, title)

    # ---- plan --------------------------------------------------------------------------------------------------

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Plan the round, set its learning rate, snapshot the global weights and run the method's server start."""
        assert self.dm is not None
        r = trainer.current_epoch
        plan = self.plan(r)
        rank, world = rank_and_world()
        slots = assign_clients(plan.steps, world)[rank] if world > 1 else list(range(len(plan.clients)))
        for opt in trainer.optimizers:
            for group in opt.param_groups:
                group.setdefault("fl_initial_lr", group["lr"])
                group["lr"] = group["fl_initial_lr"] * plan.lr_scale
        sizes = self.dm.client_sizes
        weights = aggregation_weights([sizes[c] for c in plan.clients], self.aggregation)
        server = ServerContext(
            round=r,
            clients=plan.clients,
            weights=tuple(weights),
            num_clients=self.dm.num_clients,
            global_weights={},
            param_keys=frozenset(_parameter_keys(pl_module)),
            state=self.server_state,
            aux_x=self.dm.aux_x,
            aux_y=self.dm.aux_y,
            num_classes=self.dm.num_classes,
            client_class_counts=torch.as_tensor(self.dm.client_class_counts),
            transform=self._transform,
            device=pl_module.device,
        )
        payload = pl_module.on_round_start(server) if self._hooks else {}
        # Snapshot after the hook, so that whatever it set in the module reaches every client of the round.
        global_weights = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        server.global_weights = global_weights
        received = self.evaluate(pl_module, trainer)[2] if self.eval_local else np.zeros(0)
        self._round = _Round(
            plan=plan,
            slots=slots,
            first_batch=[0, *np.cumsum([plan.steps[s] for s in slots]).tolist()],
            global_weights=global_weights,
            weights=weights,
            server=server,
            payload=payload,
            states=StateAccumulator(),
            uploads=UploadAccumulator(pl_module.upload_reduce if self._hooks else None),
            started_at=time.perf_counter(),
            received_class_acc=received,
        )
        pl_module.train()

    def _transform(self, x: Tensor, train: bool) -> Tensor:
        assert self.dm is not None and self.dm.transform is not None
        return self.dm.transform(x, train)

    # ---- local updates ------------------------------------------------------------------------------------------

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """A client starts when its first batch comes (every batch, for methods that train a client per batch)."""
        rnd = self._round
        assert rnd is not None
        if self._client_batches:
            if batch_idx < len(rnd.slots):  # beyond: padding (see local_plan)
                self._start_client(trainer, pl_module, batch_idx)
        elif batch_idx in rnd.first_batch[:-1]:
            self._start_client(trainer, pl_module, rnd.first_batch.index(batch_idx))

    def _start_client(self, trainer: L.Trainer, pl_module: L.LightningModule, pos: int) -> None:
        """Restart from the global weights with a fresh optimizer, and hand the method its client context."""
        rnd = self._round
        assert rnd is not None and self.dm is not None
        slot = rnd.slots[pos]
        client = rnd.plan.clients[slot]
        if pos > 0:
            pl_module.load_state_dict(rnd.global_weights)
        for opt in trainer.optimizers:
            opt.state.clear()
        # Seeded per client, so a client's random draws do not depend on which clients ran before it (or where).
        torch.manual_seed(_round_seed(self.seed, rnd.plan.round, client, 1))
        ctx = ClientContext(
            round=rnd.plan.round,
            client=client,
            num_samples=len(self.dm.client_indices[client]),
            class_counts=torch.as_tensor(self.dm.client_class_counts[client]),
            steps=rnd.plan.steps[slot],
            lr=trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else 0.0,
            weight=rnd.weights[slot],
            server=rnd.payload,
            state=to_device(self.client_states.get(client), pl_module.device),
            global_weights=rnd.global_weights,
            read_data=functools.partial(self.dm.client_data, client),
            transform=self._transform,
            device=pl_module.device,
            generator=torch.Generator().manual_seed(_round_seed(self.seed, rnd.plan.round, client, 2)),
        )
        rnd.client = ctx
        rnd.step_losses = []
        if isinstance(pl_module, FedAvg):
            pl_module.client = ctx
        if self._hooks:
            if pl_module.teacher_needed(ctx):
                pl_module.refresh_teacher()
            pl_module.on_client_start(ctx)

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """Per-step batches of a module with hooks: its ``before_local_step`` runs here."""
        if self._hooks and not self._client_batches:
            pl_module.before_local_step()

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """A client ends after its last batch: collect its weights, upload, state and training loss."""
        rnd = self._round
        assert rnd is not None
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            rnd.step_losses.append(loss.detach().float())
        if self._client_batches:
            if batch_idx < len(rnd.slots):
                self._end_client(trainer, pl_module, batch_idx)
        elif batch_idx + 1 in rnd.first_batch[1:]:
            self._end_client(trainer, pl_module, rnd.first_batch.index(batch_idx + 1) - 1)

    def _end_client(self, trainer: L.Trainer, pl_module: L.LightningModule, pos: int) -> None:
        rnd = self._round
        assert rnd is not None and rnd.client is not None
        ctx, slot = rnd.client, rnd.slots[pos]
        upload = (pl_module.on_client_end(ctx) if self._hooks else None) or {}
        mean_loss = torch.stack(rnd.step_losses).mean() if rnd.step_losses else torch.tensor(0.0)
        state = pl_module.state_dict()
        finite = bool(torch.isfinite(mean_loss)) and all(
            bool(torch.isfinite(v).all()) for v in [*state.values(), *upload.values()] if torch.is_floating_point(v)
        )
        rnd.done += 1
        if not finite:
            rnd.diverged.append(f"client {ctx.client} produced a non-finite loss or weights")
            return
        rnd.states.add(state, rnd.weights[slot], order=slot)
        rnd.uploads.add(upload, rnd.weights[slot])
        rnd.losses[slot] = float(mean_loss)
        self.client_states.put(ctx.client, ctx.state)
        rnd.updated_states[ctx.client] = ctx.state
        if self.eval_local:
            _, local_acc, local_class_acc = self.evaluate(pl_module, trainer, split=False)
            rnd.local_evals[slot] = (local_acc, local_class_acc)

    # ---- reduce, server step, evaluate ------------------------------------------------------------------------

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Reduce the round's clients, take the server step, evaluate and record the round."""
        rnd, recorder = self._round, self.recorder
        assert rnd is not None and recorder is not None
        r = rnd.plan.round
        if rnd.done != len(rnd.slots):
            raise RuntimeError(f"round {r + 1} ended after {rnd.done} of its {len(rnd.slots)} clients")
        diverged = [msg for msgs in all_gather_object(rnd.diverged) for msg in msgs]
        if diverged:
            pl_module.load_state_dict(rnd.global_weights)  # keep the last finite global model
            self._stop_diverged(trainer, r + 1, diverged[0])
            return
        self._reduce(rnd)
        average = rnd.states.result({k: v.dtype for k, v in rnd.global_weights.items()})
        new_global = pl_module.server_update(rnd.server, average, rnd.uploads.result()) if self._hooks else average
        if self.server_lr != 1.0 or self.server_momentum > 0:
            new_global = self._server_momentum_step(rnd.global_weights, new_global)
        pl_module.load_state_dict(new_global)
        if (r + 1) % self.eval_every == 0 or r + 1 >= self.rounds:
            self._evaluate_and_record(trainer, pl_module, rnd)
        else:
            recorder.elapsed += time.perf_counter() - rnd.started_at

    def _reduce(self, rnd: _Round) -> None:
        """Sum weights and uploads over processes; every process gets every updated client state and loss."""
        rnd.states.all_reduce()
        rnd.uploads.all_reduce()
        gathered = all_gather_object((rnd.updated_states, rnd.losses, rnd.local_evals))
        if len(gathered) > 1:
            for states, losses, evals in gathered:
                for client, state in states.items():
                    if client not in rnd.updated_states:
                        self.client_states.put(client, state)
                rnd.losses.update(losses)
                rnd.local_evals.update(evals)

    def _server_momentum_step(self, w_g: dict[str, Tensor], new: dict[str, Tensor]) -> dict[str, Tensor]:
        """FedAvgM: v ← β_s·v + Δ, w_g ← w_g − η_s·v with Δ = w_g − (the method's new global weights)."""
        out = dict(new)
        if self.momentum_buffer is None:
            self.momentum_buffer = {}
        for k, w in w_g.items():
            if not torch.is_floating_point(w):
                continue
            delta = w.float() - new[k].float()
            buf = self.momentum_buffer.get(k)
            buf = delta if buf is None else self.server_momentum * buf.to(delta.device) + delta
            self.momentum_buffer[k] = buf
            out[k] = (w.float() - self.server_lr * buf).to(w.dtype)
        return out

    def _evaluate_and_record(self, trainer: L.Trainer, pl_module: L.LightningModule, rnd: _Round) -> None:
        assert self.recorder is not None
        loss, acc, class_acc = self.evaluate(pl_module, trainer)
        losses = [rnd.losses[s] for s in sorted(rnd.losses)]
        round_seconds = time.perf_counter() - rnd.started_at
        self.recorder.elapsed += round_seconds
        measured: dict[str, float] = {
            "round": rnd.plan.round + 1,
            "global_acc": acc,
            "global_loss": loss,
            "train_loss": float(np.mean(losses)) if losses else float("nan"),
            "lr": trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else float("nan"),
            "clients": len(rnd.plan.clients),
            "round_seconds": round_seconds,
        }
        if rnd.local_evals:
            evals = [rnd.local_evals[s] for s in sorted(rnd.local_evals)]
            # τ compares each local model with the global model it started from.
            degrees = [forgetting_degree(rnd.received_class_acc, local_class) for _, local_class in evals]
            measured["local_acc_mean"] = float(np.mean([a for a, _ in evals]))
            measured["local_forgetting_degree"] = float(np.mean(degrees))
        if len(self.client_states):
            self.recorder.client_state = self.client_states.usage()
        self.recorder.record_round(trainer, measured, class_acc)
        pl_module.log("global_acc", acc, prog_bar=True, logger=False)
        if not math.isfinite(loss):
            self._stop_diverged(trainer, rnd.plan.round + 1, "the global model's test loss is not finite")
        elif (since := self._collapsed_since()) is not None:
            self._stop_diverged(
                trainer,
                since,
                f"the global model has been right on at most one class (accuracy {acc:.2%}) "
                f"in {self.collapse_rounds} evaluated rounds in a row",
            )

    def _collapsed_since(self) -> int | None:
        """The first round of a collapse to one class lasting ``collapse_rounds`` (with two or more test classes)."""
        assert self.recorder is not None
        if self.dm.num_test_classes < 2:
            return None
        return self.recorder.collapsed_since(self.collapse_rounds)

    def _stop_diverged(self, trainer: L.Trainer, round_number: int, reason: str) -> None:
        assert self.recorder is not None
        self.recorder.diverged_round = round_number
        self.recorder.say(trainer, f"round {round_number}: diverged ({reason}); stopping")
        self.recorder.finish(trainer, "diverged", reason)
        trainer.should_stop = True

    @torch.no_grad()
    def evaluate(
        self, pl_module: L.LightningModule, trainer: L.Trainer | None = None, split: bool = True
    ) -> tuple[float, float, np.ndarray]:
        """Global test loss, accuracy and class-wise accuracy of ``pl_module``'s current weights.

        With several processes and ``split``, each evaluates every ``world``-th test batch and the counts are summed
        (all processes must call it together); ``split=False`` evaluates the whole test set in this process.
        """
        assert self.dm is not None and self.dm.transform is not None
        rank, world = rank_and_world() if split else (0, 1)
        num_classes = self.dm.num_classes
        was_training = pl_module.training
        pl_module.eval()
        device = pl_module.device
        sums = {
            "correct": torch.zeros(num_classes, device=device, dtype=torch.float64),
            "total": torch.zeros(num_classes, device=device, dtype=torch.float64),
            "loss": torch.zeros((), device=device, dtype=torch.float64),
        }
        context = (
            trainer.precision_plugin.forward_context() if trainer is not None else torch.autocast("cpu", enabled=False)
        )
        with context:
            for i, (xb, yb) in enumerate(self.dm.test_batches()):
                if i % world != rank:
                    continue
                x = self.dm.transform(xb.to(device), False)
                y = yb.to(device)
                logits = pl_module(x).float()
                sums["loss"] += F.cross_entropy(logits, y, reduction="sum").double()
                hit = (logits.argmax(1) == y).double()
                sums["correct"].index_add_(0, y, hit)
                sums["total"].index_add_(0, y, torch.ones_like(hit))
        if split:
            all_reduce_sum_(sums)
        pl_module.train(was_training)
        correct, total = sums["correct"], sums["total"]
        n = float(total.sum())
        class_acc = (correct / total.clamp_min(1)).cpu().numpy()
        return float(sums["loss"]) / n, float(correct.sum()) / n, class_acc

    # ---- end of the run ---------------------------------------------------------------------------------------

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Close the record: completed when every round ran, interrupted when something stopped it early."""
        assert self.recorder is not None
        if self.recorder.status != "running":
            return
        history = self.recorder.history
        done = bool(history) and history[-1]["round"] >= self.rounds
        self.recorder.finish(trainer, "completed" if done else "interrupted")

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """A signal or Ctrl-C leaves the run ``interrupted`` (resumable); any other error leaves it ``failed``."""
        if self.recorder is None or self.recorder.status != "running":
            return
        if isinstance(exception, (KeyboardInterrupt, SIGTERMException)):
            self.recorder.finish(trainer, "interrupted")
        else:
            self.recorder.finish(trainer, "failed", f"{type(exception).__name__}: {exception}")

    # ---- checkpointing --------------------------------------------------------------------------------------

    @override
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs beyond the model weights."""
        return {
            "record": self.recorder.state_dict() if self.recorder is not None else None,
            "server_state": to_device(self.server_state, "cpu"),
            "client_state": self.client_states.state_dict(),
            "momentum_buffer": self.momentum_buffer,
            "seed": self.seed,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state saved by :meth:`state_dict`."""
        if state_dict.get("seed", self.seed) != self.seed:
            raise ValueError(f"the checkpoint was made with seed {state_dict['seed']}, this run uses {self.seed}")
        if self.recorder is None:
            self._pending_state = state_dict
            return
        self._pending_state = None
        if "history" in state_dict:  # checkpoints written before the recorder was its own unit
            state_dict = {**state_dict, "record": state_dict, "client_state": {}}
        if state_dict.get("record") is not None:
            self.recorder.load_state_dict(state_dict["record"])
        self.server_state = dict(state_dict.get("server_state") or {})
        self.client_states.load_state_dict(state_dict.get("client_state") or {})
        self.momentum_buffer = state_dict["momentum_buffer"]


def _parameter_keys(module: torch.nn.Module) -> list[str]:
    """State-dict keys of the module's trainable parameters."""
    return [name for name, p in module.named_parameters() if p.requires_grad]

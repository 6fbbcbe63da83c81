"""The federation callback: one Lightning epoch is one communication round.

Within a single ``Trainer.fit`` the callback samples the round's clients, restarts each from the global weights with a
fresh optimizer state, collects their updated weights, averages them, and evaluates the global model on the test set.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import subprocess
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.callbacks.progress import TQDMProgressBar
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import Tensor
from typing_extensions import override

from fl_lightning.aggregation import StateAccumulator, aggregation_weights
from fl_lightning.context import ClientContext, ServerContext
from fl_lightning.data import FederatedDataModule, RoundPlan, _round_seed, client_steps
from fl_lightning.metrics import forgetting, forgetting_degree
from fl_lightning.module import FedAvg
from fl_lightning.plots import plot_curve, plot_partition

_CPU_PRECISIONS = ("32-true", "32", "64-true", "64", "bf16-mixed")


class Federation(Callback):
    """Runs federated training inside one ``Trainer.fit``: each training epoch is one communication round.

    Args:
        rounds: communication rounds R (sets the Trainer's ``max_epochs``).
        sample_ratio: fraction of clients sampled per round, ``round(ratio·N)`` (at least 1), in (0, 1].
        local_epochs: local epochs E each sampled client trains per round.
        aggregation: ``weighted`` (by client sample counts, FedAvg) or ``uniform`` (plain mean).
        lr_decay: the learning rate of round r is ``lr_0 · lr_decay^r``.
        eval_every: evaluate the global model every this many rounds (and always after the last one).
        server_lr: server learning rate η_s applied to the averaged update (1 = plain averaging).
        server_momentum: server momentum β_s (FedAvgM; 0 disables).
        seed: seed of client sampling, local shuffling and augmentation.
        plots: write the learning-curve and partition PNGs into the run directory.
        eval_local: also evaluate every updated local model on the test set (costs one test pass per client) and
            report their mean accuracy AccL (FedSSD §3.1) and FedKA's class-wise forgetting degree (§3.1).
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

        # persistent state (checkpointed)
        self.history: list[dict[str, float]] = []
        self.class_acc_history: list[list[float]] = []
        self.client_state: dict[int, dict[str, Any]] = {}
        self.momentum_buffer: dict[str, Tensor] | None = None
        self.status = "running"
        self.elapsed = 0.0
        # per-run objects, built in setup
        self.dm: FederatedDataModule | None = None
        self.run_dir = Path(".")
        self._plans: dict[int, RoundPlan] = {}
        self._reset_round()

    def _reset_round(self) -> None:
        self._plan: RoundPlan | None = None
        self._slot = -1
        self._global: dict[str, Tensor] = {}
        self._payload: dict[str, Any] = {}
        self._acc: StateAccumulator | None = None
        self._weights: list[float] = []
        self._ctx: ClientContext | None = None
        self._losses: list[Tensor] = []
        self._local_evals: list[tuple[float, np.ndarray]] = []
        self._received_class_acc = np.zeros(0)
        self._diverged = ""
        self._round_start = 0.0

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
        if any(s == 0 for s in steps):
            raise ValueError(
                f"a client has fewer samples than one batch with drop_last=True (sizes {[sizes[c] for c in clients]}); "
                "set --data.drop_last false or a smaller batch size"
            )
        plan = RoundPlan(round_idx, clients, steps, self.local_epochs, self.lr_decay**round_idx)
        self._plans = {round_idx: plan}
        return plan

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
        """Check the pieces fit together, hook the datamodule's round loader, and record the partition."""
        if stage != "fit":
            return
        dm = trainer.datamodule
        if not isinstance(dm, FederatedDataModule):
            raise TypeError(
                f"the Federation callback needs a FederatedDataModule, got {type(dm).__name__}; "
                "pass datamodule=FederatedDataModule(...) to trainer.fit"
            )
        if not isinstance(pl_module, FedAvg):
            raise TypeError(
                f"the Federation callback needs a fl_lightning method module, got {type(pl_module).__name__}"
            )
        self._check_precision(trainer, pl_module)
        need = pl_module.holdout_per_class_required
        if dm.holdout_per_class < need:
            raise ValueError(
                f"{pl_module.method_name} needs {need} server holdout samples per class; "
                f"set --data.holdout_per_class {need} (it is {dm.holdout_per_class})"
            )
        if getattr(pl_module, "num_classes", dm.num_classes) != dm.num_classes:
            raise ValueError(
                f"the model predicts {pl_module.num_classes} classes but {dm.dataset} has {dm.num_classes}"
            )
        if trainer.accumulate_grad_batches != 1:
            raise ValueError("accumulate_grad_batches must be 1: every local batch is one optimizer step")
        dm.setup("fit")
        self.dm = dm
        dm.plan_fn = self.plan
        self._plans = {}
        trainer.fit_loop.max_epochs = self.rounds
        trainer.reload_dataloaders_every_n_epochs = 1
        self.run_dir = Path(trainer.default_root_dir)
        if trainer.is_global_zero:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._write_partition(dm)

    def _check_precision(self, trainer: L.Trainer, pl_module: FedAvg) -> None:
        precision = str(trainer.precision)
        on_cpu = trainer.strategy.root_device.type == "cpu"
        if on_cpu and precision not in _CPU_PRECISIONS:
            raise ValueError(
                f"precision {precision!r} needs a CUDA GPU; on the CPU use --trainer.precision 32-true (or bf16-mixed)"
            )
        if pl_module.needs_exact_steps and precision in ("16-mixed", "16"):
            raise ValueError(
                f"{pl_module.method_name} counts local steps, and 16-mixed's gradient scaler can skip some; "
                "use --trainer.precision bf16-mixed or 32-true"
            )

    def _write_partition(self, dm: FederatedDataModule) -> None:
        counts = dm.client_class_counts
        with open(self.run_dir / "partition.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["client", "total", *[f"class_{c}" for c in range(counts.shape[1])]])
            for i, row in enumerate(counts):
                writer.writerow([i, int(row.sum()), *[int(v) for v in row]])
        if self.plots:
            title = f"{dm.dataset}, {dm.partition_label}, {dm.num_clients} clients"
            plot_partition(counts, self.run_dir / "partition.png", title)

    # ---- one round ------------------------------------------------------------------------------------------

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Sample the round's clients, set its learning rate and snapshot the global weights."""
        assert isinstance(pl_module, FedAvg) and self.dm is not None
        self._reset_round()
        self._round_start = time.perf_counter()
        r = trainer.current_epoch
        plan = self.plan(r)
        self._plan = plan
        torch.manual_seed(_round_seed(self.seed, r, 1))
        for opt in trainer.optimizers:
            for group in opt.param_groups:
                group.setdefault("fl_initial_lr", group["lr"])
                group["lr"] = group["fl_initial_lr"] * plan.lr_scale
        self._global = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        sizes = self.dm.client_sizes
        self._weights = aggregation_weights([sizes[c] for c in plan.clients], self.aggregation)
        self._acc = StateAccumulator()
        server = ServerContext(
            round=r,
            clients=plan.clients,
            aux_x=self.dm.aux_x,
            aux_y=self.dm.aux_y,
            num_classes=self.dm.num_classes,
            client_class_counts=torch.as_tensor(self.dm.client_class_counts),
            transform=self._transform,
            device=pl_module.device,
        )
        self._payload = pl_module.on_round_start(server)
        if self.eval_local:
            self._received_class_acc = self.evaluate(pl_module, trainer)[2]
        pl_module.train()

    def _transform(self, x: Tensor, train: bool) -> Tensor:
        assert self.dm is not None and self.dm.transform is not None
        return self.dm.transform(x, train)

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Before a client's local update: restart from the global weights with a fresh optimizer state.

        One training batch is one client's whole local update (:class:`~fl_lightning.data.ClientBatches`).
        """
        assert isinstance(pl_module, FedAvg) and self._plan is not None and self.dm is not None
        self._slot = batch_idx
        client = self._plan.clients[self._slot]
        if self._slot > 0:
            pl_module.load_state_dict(self._global)
        for opt in trainer.optimizers:
            opt.state.clear()
        x, y = self.dm.client_data(client)
        self._ctx = ClientContext(
            round=self._plan.round,
            client=client,
            num_samples=len(y),
            class_counts=torch.as_tensor(self.dm.client_class_counts[client]),
            steps=self._plan.steps[self._slot],
            lr=trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else 0.0,
            server=self._payload,
            state=self.client_state.setdefault(client, {}),
            x=x,
            y=y,
            transform=self._transform,
            device=pl_module.device,
            generator=torch.Generator().manual_seed(_round_seed(self.seed, self._plan.round, client, 2)),
        )
        pl_module.on_client_start(self._ctx)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After a client's local update: collect its weights and mean training loss."""
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        assert isinstance(pl_module, FedAvg) and self._ctx is not None and self._acc is not None
        pl_module.on_client_end(self._ctx)
        mean_loss = loss.detach().float() if loss is not None else torch.tensor(0.0)
        state = pl_module.state_dict()
        finite = bool(torch.isfinite(mean_loss)) and all(
            bool(torch.isfinite(v).all()) for v in state.values() if torch.is_floating_point(v)
        )
        if not finite:
            self._diverged = f"client {self._ctx.client} produced a non-finite loss or weights"
            trainer.should_stop = True
            return
        self._losses.append(mean_loss)
        self._acc.add(state, self._weights[self._slot])
        if self.eval_local:
            _, local_acc, local_class_acc = self.evaluate(pl_module, trainer)
            self._local_evals.append((local_acc, local_class_acc))
        if self._slot == len(self._plan.clients) - 1:
            self._aggregate(pl_module)

    def _aggregate(self, pl_module: FedAvg) -> None:
        assert self._acc is not None
        dtypes = {k: v.dtype for k, v in self._global.items()}
        avg = self._acc.result(dtypes)
        if self.server_lr != 1.0 or self.server_momentum > 0:
            avg = self._server_step(avg)
        pl_module.load_state_dict(avg)

    def _server_step(self, avg: dict[str, Tensor]) -> dict[str, Tensor]:
        """FedAvgM: v ← β_s·v + Δ, w_g ← w_g − η_s·v with Δ = w_g − avg(w_k)."""
        out = dict(avg)
        if self.momentum_buffer is None:
            self.momentum_buffer = {}
        for k, w_g in self._global.items():
            if not torch.is_floating_point(w_g):
                continue
            delta = w_g.float() - avg[k].float()
            buf = self.momentum_buffer.get(k)
            buf = delta if buf is None else self.server_momentum * buf.to(delta.device) + delta
            self.momentum_buffer[k] = buf
            out[k] = (w_g.float() - self.server_lr * buf).to(w_g.dtype)
        return out

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Evaluate the new global model, log the round and write the results files."""
        assert isinstance(pl_module, FedAvg) and self._plan is not None
        r = self._plan.round
        if self._diverged or self._slot != len(self._plan.clients) - 1:
            reason = self._diverged or "the round stopped before every client finished"
            pl_module.load_state_dict(self._global)  # keep the last finite global model
            if self._diverged:
                self.status = "diverged"
                self._say(trainer, f"round {r + 1}: diverged ({reason}); stopping")
                trainer.should_stop = True
                self._write_summary(trainer, pl_module)
            return
        last = r + 1 >= self.rounds
        if (r + 1) % self.eval_every == 0 or last:
            self._evaluate_and_log(trainer, pl_module)
        self.elapsed += time.perf_counter() - self._round_start

    # ---- evaluation and results ---------------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self, pl_module: FedAvg, trainer: L.Trainer | None = None) -> tuple[float, float, np.ndarray]:
        """Global test loss, accuracy and class-wise accuracy of ``pl_module``'s current weights."""
        assert self.dm is not None and self.dm.transform is not None
        num_classes = self.dm.num_classes
        was_training = pl_module.training
        pl_module.eval()
        device = pl_module.device
        correct = torch.zeros(num_classes, device=device)
        total = torch.zeros(num_classes, device=device)
        loss_sum = torch.zeros((), device=device)
        context = (
            trainer.precision_plugin.forward_context() if trainer is not None else torch.autocast("cpu", enabled=False)
        )
        with context:
            for x_raw, y_raw in self.dm.test_batches():
                x = self.dm.transform(x_raw.to(device), False)
                y = y_raw.to(device)
                logits = pl_module(x).float()
                loss_sum += F.cross_entropy(logits, y, reduction="sum")
                hit = (logits.argmax(1) == y).float()
                correct.index_add_(0, y, hit)
                total.index_add_(0, y, torch.ones_like(hit))
        pl_module.train(was_training)
        n = float(total.sum())
        class_acc = (correct / total.clamp_min(1)).cpu().numpy()
        return float(loss_sum) / n, float(correct.sum()) / n, class_acc

    def _evaluate_and_log(self, trainer: L.Trainer, pl_module: FedAvg) -> None:
        assert self._plan is not None
        r = self._plan.round + 1
        loss, acc, class_acc = self.evaluate(pl_module, trainer)
        if not math.isfinite(loss):
            self._diverged = "the global model's test loss is not finite"
        self.class_acc_history.append([float(a) for a in class_acc])
        prev_best = max((row["global_acc"] for row in self.history), default=-1.0)
        train_loss = float(torch.stack(self._losses).mean()) if self._losses else float("nan")
        row: dict[str, float] = {
            "round": r,
            "global_acc": acc,
            "global_loss": loss,
            "best_acc": max(acc, prev_best),
            "forgetting": forgetting(self.class_acc_history),
            "train_loss": train_loss,
            "lr": trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else float("nan"),
            "clients": len(self._plan.clients),
            "round_seconds": time.perf_counter() - self._round_start,
            "elapsed_seconds": self.elapsed + time.perf_counter() - self._round_start,
        }
        if self._local_evals:
            local_accs = [acc for acc, _ in self._local_evals]
            received = self._received_class_acc  # τ compares each local model with the global model it started from
            degrees = [forgetting_degree(received, local_class) for _, local_class in self._local_evals]
            row["local_acc_mean"] = float(np.mean(local_accs))
            row["local_forgetting_degree"] = float(np.mean(degrees))
        row.update({f"acc_class_{c}": float(a) for c, a in enumerate(class_acc)})
        self.history.append(row)
        self._log_to_loggers(trainer, row)
        pl_module.log("global_acc", acc, prog_bar=True, logger=False)
        self._say(
            trainer,
            f"round {r}/{self.rounds}  acc {acc:.4f}  best {row['best_acc']:.4f}  "
            f"test loss {loss:.4f}  train loss {train_loss:.4f}  lr {row['lr']:.4g}  {row['round_seconds']:.1f}s",
        )
        if trainer.is_global_zero:
            self._write_metrics()
            self._write_summary(trainer, pl_module)
        if self._diverged:
            self.status = "diverged"
            trainer.should_stop = True
            self._say(trainer, f"round {r}: diverged ({self._diverged}); stopping")
            self._write_summary(trainer, pl_module)

    def _log_to_loggers(self, trainer: L.Trainer, row: dict[str, float]) -> None:
        if not trainer.loggers:
            return
        metrics = {
            "global/acc": row["global_acc"],
            "global/loss": row["global_loss"],
            "global/acc_best": row["best_acc"],
            "global/forgetting": row["forgetting"],
            "train/loss": row["train_loss"],
            "train/lr": row["lr"],
            "time/round_seconds": row["round_seconds"],
        }
        if "local_acc_mean" in row:
            metrics["local/acc_mean"] = row["local_acc_mean"]
            metrics["local/forgetting_degree"] = row["local_forgetting_degree"]
        metrics.update({f"global_class/acc_{k[10:]}": v for k, v in row.items() if k.startswith("acc_class_")})
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=int(row["round"]))

    def _say(self, trainer: L.Trainer, message: str) -> None:
        bar = trainer.progress_bar_callback
        if isinstance(bar, TQDMProgressBar) and trainer.is_global_zero and bar.is_enabled:
            bar.print(message)
        else:
            rank_zero_info(message)

    def _write_metrics(self) -> None:
        if not self.history:
            return
        fields = list(self.history[0].keys())
        with open(self.run_dir / "metrics.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(self.history)

    def summary(self, trainer: L.Trainer, pl_module: FedAvg) -> dict[str, Any]:
        """The run's results in one flat dict (written to ``summary.json``)."""
        dm = self.dm
        assert dm is not None
        accs = [row["global_acc"] for row in self.history]
        best_i = int(np.argmax(accs)) if accs else -1
        return {
            "method": pl_module.method_name,
            "dataset": dm.dataset,
            "partition": dm.partition_label,
            "num_clients": dm.num_clients,
            "sample_ratio": self.sample_ratio,
            "local_epochs": self.local_epochs,
            "model": pl_module.hparams.get("net"),
            "rounds": self.rounds,
            "rounds_done": int(self.history[-1]["round"]) if self.history else 0,
            "seed": self.seed,
            "precision": str(trainer.precision),
            "final_acc": accs[-1] if accs else None,
            "best_acc": accs[best_i] if accs else None,
            "best_round": int(self.history[best_i]["round"]) if accs else None,
            "last10_mean_acc": float(np.mean(accs[-10:])) if accs else None,
            "forgetting": self.history[-1]["forgetting"] if accs else None,
            "wall_seconds": round(self.elapsed, 3),
            "status": self.status,
            "git_rev": _git_revision(),
        }

    def _write_summary(self, trainer: L.Trainer, pl_module: FedAvg) -> None:
        if not trainer.is_global_zero:
            return
        with open(self.run_dir / "summary.json", "w") as f:
            json.dump(self.summary(trainer, pl_module), f, indent=2)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Mark the run finished and draw its learning curve."""
        assert isinstance(pl_module, FedAvg)
        if self.status == "running":
            done = bool(self.history) and self.history[-1]["round"] >= self.rounds
            self.status = "completed" if done else "interrupted"
        self._finish(trainer, pl_module)

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """Record an interrupted run so that its summary says so."""
        if isinstance(pl_module, FedAvg) and self.dm is not None and self.status == "running":
            self.status = "interrupted"
            self._finish(trainer, pl_module)

    def _finish(self, trainer: L.Trainer, pl_module: FedAvg) -> None:
        if not trainer.is_global_zero or self.dm is None:
            return
        self._write_metrics()
        self._write_summary(trainer, pl_module)
        if self.plots and self.history:
            rounds = [row["round"] for row in self.history]
            accs = [row["global_acc"] for row in self.history]
            title = f"{pl_module.method_name} on {self.dm.dataset}, {self.dm.partition_label}"
            plot_curve(rounds, accs, self.run_dir / "curve.png", title)
        self._send_to_loggers(trainer)
        if self.status == "completed" and self.history:
            best = max(r["global_acc"] for r in self.history)
            rank_zero_info(
                f"done: final acc {self.history[-1]['global_acc']:.4f}, best {best:.4f} "
                f"in {self.elapsed:.1f}s; results in {self.run_dir}"
            )
        elif self.status == "interrupted":
            rank_zero_warn(f"run interrupted; resume it with --ckpt_path last (results so far in {self.run_dir})")

    def _send_to_loggers(self, trainer: L.Trainer) -> None:
        """Final summary and figures to loggers that take them (W&B)."""
        summary = self.summary(trainer, trainer.lightning_module) if self.dm is not None else {}
        for logger in trainer.loggers:
            experiment = getattr(logger, "experiment", None)
            if hasattr(experiment, "summary") and hasattr(experiment.summary, "update"):
                experiment.summary.update({k: v for k, v in summary.items() if v is not None})
            if hasattr(logger, "log_image"):
                for name in ("curve", "partition"):
                    path = self.run_dir / f"{name}.png"
                    if path.exists():
                        logger.log_image(key=f"plots/{name}", images=[str(path)])

    # ---- checkpointing --------------------------------------------------------------------------------------

    @override
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs beyond the model weights."""
        return {
            "history": self.history,
            "class_acc_history": self.class_acc_history,
            "client_state": self.client_state,
            "momentum_buffer": self.momentum_buffer,
            "status": self.status,
            "elapsed": self.elapsed,
            "seed": self.seed,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state saved by :meth:`state_dict`."""
        if state_dict.get("seed", self.seed) != self.seed:
            raise ValueError(f"the checkpoint was made with seed {state_dict['seed']}, this run uses {self.seed}")
        self.history = list(state_dict["history"])
        self.class_acc_history = list(state_dict["class_acc_history"])
        self.client_state = dict(state_dict["client_state"])
        self.momentum_buffer = state_dict["momentum_buffer"]
        self.status = "running"
        self.elapsed = float(state_dict["elapsed"])


@functools.lru_cache(maxsize=1)
def _git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None

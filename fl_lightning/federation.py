"""The federation callback: one Lightning epoch is one communication round.

A round, in the core's units: the plan (:meth:`FederatedServer.plan_for
<fl_lightning.core.server.FederatedServer.plan_for>`) → local updates (an executor of :mod:`fl_lightning.executor`,
chosen for the fit by :mod:`fl_lightning.engines`) → the server step (:meth:`FederatedServer.server_step
<fl_lightning.core.server.FederatedServer.server_step>`: the reduce, the method's ``server_update``, the server
optimizer) → :func:`~fl_lightning.core.evaluation.evaluate`. :class:`Federation` is the
:class:`~fl_lightning.core.server.FederatedServer` that Lightning's hooks drive: it decides *when* each step runs;
what a round measures goes to a :class:`~fl_lightning.recorder.RunRecorder`, which owns the run's files and logger
output and tells when the run diverged.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from fl_lightning import rules
from fl_lightning.checkpoint import verify_checkpoints_on_load
from fl_lightning.core import faults
from fl_lightning.core.agreement import check_same_settings, fit_settings
from fl_lightning.core.context import ServerContext
from fl_lightning.core.distributed import (
    agreed_min,
    end_process_group_at_exit,
    is_distributed,
    rank_and_world,
    to_device,
)
from fl_lightning.core.evaluation import Evaluation
from fl_lightning.core.gpu_memory import GIB, MIB, StackedMemory, fitting_group
from fl_lightning.core.messages import require_bool, require_integer, require_number, require_one_of
from fl_lightning.core.models import trainable
from fl_lightning.core.rounds import RoundPlan, RoundState, num_sampled, process_share
from fl_lightning.core.run_lock import RunDirClaim, RunDirError
from fl_lightning.core.rundir import check_resumed_run_dir, rounds_done, run_files
from fl_lightning.core.server import FederatedServer, server_optimizer_of, upgrade_state
from fl_lightning.core.server_optim import ServerOptimizer
from fl_lightning.core.stacked_conv import STACKED_CONVS
from fl_lightning.core.step_capture import CAPTURE_MODES
from fl_lightning.data import FederatedDataModule
from fl_lightning.engines import ENGINES, choose_executor
from fl_lightning.executor import ClientExecutor
from fl_lightning.lightning_internals import (
    can_stop_early,
    keep_scheduler_monitors,
    restore_scheduler_monitors,
    set_logged_step,
    set_process_group_timeout,
)
from fl_lightning.module import FedAvg, FederatedHooks, round_payload
from fl_lightning.progress import quiet_lightning, use_round_bars
from fl_lightning.recorder import RunRecorder, run_info
from fl_lightning.whole_rounds import place_whole_rounds


class Federation(Callback, FederatedServer):
    """Runs federated training inside one ``Trainer.fit``: each training epoch is one communication round.

    Works with any LightningModule: an fl_lightning method (:class:`~fl_lightning.FedAvg` and its subclasses) trains a
    whole client in one training batch; any other module sees its ordinary per-step batches, client after client,
    with its own ``training_step`` and ``configure_optimizers``, and is federated as FedAvg (mix in
    :class:`~fl_lightning.module.FederatedHooks` to take part in the method hooks). With several processes
    (``devices``/``num_nodes`` with a DDP strategy) each process trains its own share of the round's clients with no
    gradient synchronisation, and the weighted sums are reduced once per round. Planning, the server's state and its
    step are those of :class:`~fl_lightning.core.server.FederatedServer`, which needs no Lightning.

    Args:
        rounds: communication rounds R (the Trainer's ``max_epochs``).
        sample_ratio: fraction of clients sampled per round, ``round(ratio·N)`` (at least 1), in (0, 1].
        local_epochs: local epochs E each sampled client trains per round.
        aggregation: ``weighted`` (by client sample counts, FedAvg) or ``uniform`` (plain mean).
        lr_decay: the learning rate of round r is ``lr_0 · lr_decay^r``.
        eval_every: evaluate the global model every this many rounds (and always after the last one).
        server_lr: server learning rate η_s (1 = plain averaging); short for ``server_optimizer: ServerSGD``.
        server_momentum: server momentum β_s (FedAvgM; 0 disables); short for ``server_optimizer: ServerSGD``.
        server_optimizer: the server step applied to the method's new global weights (a
            :class:`~fl_lightning.core.server_optim.ServerOptimizer`, e.g. ``FedAdam(lr=0.01)``, or the name of one in
            :data:`~fl_lightning.core.server_optim.SERVER_OPTIMIZERS`, e.g. ``"fedadam"``, with its defaults); give
            the server learning rate here or in ``server_lr``, not both. Default: ``ServerSGD(server_lr,
            server_momentum)``.
        seed: seed of client sampling, local shuffling and augmentation.
        plots: write the learning-curve and partition PNGs into the run directory.
        eval_local: also evaluate every updated local model on the test set (costs one test pass per client) and
            report their mean accuracy AccL (FedSSD §3.1) and FedKA's class-wise forgetting degree (§3.1).
        client_state_mb: CPU memory for per-client method state (SCAFFOLD's controls, MOON's previous models, ...)
            before further clients' states are kept on disk under ``<run dir>/client_state`` (``None``: no limit).
        engine: how a round's local updates run (:mod:`fl_lightning.engines`): ``sequential`` (one client after
            another, Lightning's training loop), ``batched`` (a group of clients takes each local step together on a
            stacked model; the same science up to float rounding) or ``auto`` (batched where it is faster). A method
            or setting that cannot train batched says why (a warning) and trains sequentially.
        group_size: with the batched engine, at most this many clients are stacked at once (memory grows with it;
            ``None``: all of a process's clients of the round, on a GPU as many as fit ``memory_budget_gb``).
        step_capture: how the batched engine runs each local step in which every client still training takes a
            full batch (:mod:`fl_lightning.core.step_capture`): ``auto`` (``graph`` on a GPU, ``off`` elsewhere),
            ``graph`` (recorded once as a CUDA graph and replayed), ``compile`` (``torch.compile(fullgraph=True)``,
            on a GPU recorded as a CUDA graph too), ``static`` (the same function of static tensors, run as it is)
            or ``off`` (op by op). A step that cannot be captured runs uncaptured and the run says why.
        memory_budget_gb: on a GPU with ``group_size=None``, the GPU memory (GiB) the stacked clients may use: the
            group is the most clients that fit, estimated at fit start and re-fitted to the peak measured in the
            first round (``None``: 90 % of the GPU's free memory at fit start). The peak per stacked client is in
            the run's output and ``summary.json`` (``gpu_memory_per_client_mib``).
        stacked_conv: how the batched engine computes its stacked clients' 2-d convolutions
            (:mod:`fl_lightning.core.stacked_conv`): ``grouped`` (``vmap``'s grouped convolution), ``matmul`` (im2col
            and one batched matmul; more memory) or ``loop`` (one convolution per client, for a step recorded as a CUDA
            graph). The same convolution up to float rounding.
        collapse_rounds: stop a run as ``diverged`` once its global model has been right on at most one class (it
            predicts one class for everything: chance accuracy, the papers' "Failed") with a test loss no lower than
            a prediction that ignores its input reaches (the test labels' entropy, ln C when balanced: a model whose
            loss falls below it is learning) in this many evaluated rounds in a row; the divergence round is the
            first of them (``None``: never; never for a one-class test set).
        process_timeout: with several processes (a DDP strategy), the seconds a process waits in a collective (the
            round's reduce, a broadcast) for the others before it fails with an error (``None``: torch's 30 minutes).
            A timeout given to the ``DDPStrategy`` itself is kept.
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
        # the class first: jsonargparse tries a union's types in order (a name is a str, as in YAML's `fedadam`)
        server_optimizer: ServerOptimizer | str | None = None,
        seed: int = 0,
        plots: bool = True,
        eval_local: bool = False,
        client_state_mb: float | None = None,
        collapse_rounds: int | None = 10,
        engine: str = "sequential",
        group_size: int | None = None,
        step_capture: str = "auto",
        memory_budget_gb: float | None = None,
        stacked_conv: str = "grouped",
        process_timeout: float | None = 300.0,
    ) -> None:
        opt = server_optimizer_of(server_optimizer, server_lr, server_momentum)
        FederatedServer.__init__(
            self, rounds, sample_ratio, local_epochs, aggregation, lr_decay, eval_every, seed, opt, client_state_mb
        )
        self.plots, self.eval_local = require_bool("plots", plots), require_bool("eval_local", eval_local)
        self.collapse_rounds = require_integer("collapse_rounds", collapse_rounds, least=1, optional=True)
        require_one_of("engine", engine, ENGINES)
        self.engine, self.group_size = engine, require_integer("group_size", group_size, least=1, optional=True)
        require_one_of("step_capture", step_capture, CAPTURE_MODES)
        self.memory_budget_gb = require_number("memory_budget_gb", memory_budget_gb, "> 0", optional=True)
        require_one_of("stacked_conv", stacked_conv, STACKED_CONVS)
        self.process_timeout = require_number("process_timeout", process_timeout, "> 0", optional=True)
        self.step_capture, self.stacked_conv = step_capture, stacked_conv
        self._budget: float | None = None  # bytes the group is fitted to, when the callback chooses the group size
        self.engine_used = "sequential"  #: The engine this fit runs (``engine`` resolved at fit start).
        self.client_group: int | None = None  # clients per training batch with the batched engine
        self._engine_note: str | None = None  # what to say about the engine when training starts
        # per-run objects, built in setup
        self.dm: FederatedDataModule | None = None
        self.recorder: RunRecorder | None = None
        self.client_batches = True  # a whole client per training batch (fl_lightning methods), else one step each
        self._round: RoundState | None = None
        self._server: ServerContext | None = None
        self.executor: ClientExecutor | None = None
        self._pending_state: dict[str, Any] | None = None
        self._claim = RunDirClaim()  # the run directory this fit holds (rank 0)
        self._spill: tempfile.TemporaryDirectory[str] | None = None  # client states spilled by a rank other than 0
        self._stage = "fit"  # the Trainer's stage (setup); validate/test/predict leave the run's record alone
        self._monitors: dict[int, tuple[str | None, bool]] = {}  # a method's LR scheduler monitors (setup)
        self._stop_held = False  # a stop asked for mid-round, held until the round's end (hold_stop)
        self._settings_config: dict[str, Any] | None = None  # the command line's resolved config (the nodes compare)
        self._files_checked = False  # the command line checked which files a finished run lacks (config.yaml too)
        quiet_lightning()  # now: the Trainer built next prints its tips and accelerator lines in its constructor

    @property
    def history(self) -> list[dict[str, float]]:
        """The evaluated rounds so far, one dict per ``metrics.csv`` row (empty before fit)."""
        return self.recorder.history if self.recorder is not None else []

    @property
    def status(self) -> str:
        """``running``, or how the run ended: ``completed``, ``diverged``, ``interrupted`` or ``failed``."""
        return self.recorder.status if self.recorder is not None else "running"

    # ---- planning (see fl_lightning.core.server) ---------------------------------------------------------------------

    def plan(self, round_idx: int) -> RoundPlan:
        """The clients, local steps and learning-rate scale of round ``round_idx`` (a pure function of the seed)."""
        assert self.dm is not None, "Federation.plan needs setup() first"
        return self.plan_for(round_idx, self.dm.client_sizes, self.dm.batch_size, self.dm.drop_last)

    def local_plan(self, round_idx: int) -> RoundPlan:
        """This process's share of round ``round_idx`` (the whole round in a single process; see ``process_share``)."""
        return process_share(self.plan(round_idx), *rank_and_world())[1]

    # ---- setup --------------------------------------------------------------------------------------------------

    def prepare_trainer(self, trainer: L.Trainer) -> None:
        """Called by the datamodule when attached, before Lightning reads ``max_epochs`` or resolves ``ckpt_path``."""
        rules.prepare_trainer(trainer, self.rounds)
        if self.process_timeout is not None:  # before Lightning starts the process group
            set_process_group_timeout(trainer, self.process_timeout)
        place_whole_rounds(trainer, self)
        use_round_bars(trainer)  # before any hook: Lightning's own progress bars count rounds and clients

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Claim the run directory (one fit at a time), check the pieces fit together and prepare the run's record."""
        self._stage, self._round = stage, None  # a failed fit's half round is over
        verify_checkpoints_on_load(trainer)  # Lightning restores a checkpoint after setup: checked before it is read
        if stage != "fit":
            return
        if is_distributed():  # every node must run the same settings, or it trains another run (or hangs)
            how = {"engine": self.engine, "group_size": self.group_size, "eval_local": self.eval_local}
            config = self._settings_config or fit_settings(trainer, pl_module, {**self.settings(), **how})
            check_same_settings(config, trainer.node_rank)
        if trainer.is_global_zero:  # one fit at a time in a run directory
            self._claim.acquire(trainer.default_root_dir)
        self.client_batches = isinstance(pl_module, FedAvg)
        place_whole_rounds(trainer, self)  # again: after the module's configure_callbacks, which Lightning has added
        if not pl_module.automatic_optimization:  # Lightning drops a manual module's scheduler monitors: keep them
            self._monitors = keep_scheduler_monitors(pl_module)
        self.dm = dm = _checked_data(trainer, pl_module, self.rounds)
        run_dir = Path(trainer.default_root_dir)
        # A new fit starts afresh (a checkpoint restores the state). Spilled client states are a process's own cache:
        # rank 0 keeps its in the run directory, any other process in a temporary folder of its own.
        if not trainer.is_global_zero and self._spill is None:
            self._spill = tempfile.TemporaryDirectory(prefix=f"fl_lightning_client_state_rank{trainer.global_rank}_")
        self.start_fit(Path(self._spill.name) if self._spill is not None else run_dir / "client_state")
        info = run_info(trainer, pl_module, dm, **self.settings())
        self._earlier_record, self.recorder = self.recorder, RunRecorder(run_dir, info, self.plots, self.rounds)
        if self._pending_state is not None:  # a checkpoint restored before setup (Lightning restores after it)
            self.load_state_dict(self._pending_state)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Refuse a Trainer's second fit; let each process train its clients alone, move the state, pick the engine."""
        if trainer.current_epoch > 0 and trainer.ckpt_path is None:  # the Trainer's rounds are all run (or stopped)
            self.recorder = self._earlier_record  # its run's record stands
            self.check_new_fit(trainer.current_epoch, resuming=False)
        assert self.dm is not None and self.recorder is not None
        # DDP would average every local gradient across processes, i.e. mix different clients' steps. Clients train
        # independently; their weights are reduced once per round.
        if trainer.strategy.model is not pl_module:
            trainer.strategy.model = pl_module
        if is_distributed():  # a gloo group left to the interpreter's shutdown can abort a process that has finished
            end_process_group_at_exit()
        if not pl_module.automatic_optimization:
            restore_scheduler_monitors(trainer, self._monitors)
        rules.check_lr_schedulers(trainer, self.lr_decay)
        validates = is_overridden("validation_step", pl_module) and trainer.limit_val_batches != 0
        rules.check_round_monitors(
            trainer, self.eval_every, self.rounds, validates and len(self.dm.val_dataloader()) > 0
        )
        self.server_state = to_device(self.server_state, pl_module.device)
        if pl_module.device.type == "cpu" and trainer.is_global_zero:  # one reading, by the process that warns
            busy = rules.busy_cpu_note(processes=trainer.num_devices)
            if busy is not None:
                rank_zero_warn(busy)
        per_round = num_sampled(self.dm.num_clients, self.sample_ratio)
        local = (lambda module: self.evaluate(module, trainer, split=False)) if self.eval_local else None
        choice = choose_executor(
            self.engine,
            trainer,
            pl_module,
            self.dm,
            self.client_states,
            self.seed,
            self.group_size,
            local,
            self._fell_back,
            step_capture=self.step_capture,
            on_capture_note=rank_zero_warn,
            clients_per_round=per_round,
            memory_budget_gb=self.memory_budget_gb,
            stacked_conv=self.stacked_conv,
        )
        self._budget = choice.memory_budget
        self.executor, self.engine_used, self.client_group = choice.executor, choice.engine, choice.group_size
        if self._budget is not None:  # chosen from this process's GPU memory: the processes take the smallest
            self.client_group = agreed_min(choice.group_size)
        self.recorder.info["engine"] = choice.engine
        self.recorder.info["step_capture"] = choice.step_capture
        self.recorder.info["stacked_conv"] = self.stacked_conv if choice.engine == "batched" else None
        self._engine_note = choice.note  # said when training starts
        if choice.warning is not None:
            rank_zero_warn(choice.warning)

    def _fell_back(self, reason: str) -> None:
        """The batched engine met a client it cannot stack: from now on its clients train one by one."""
        assert self.recorder is not None
        rank_zero_warn(f"engine {self.engine}: {reason}; training sequentially")
        self.engine_used = "sequential"
        self.recorder.info["engine"] = "sequential"

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Training really starts (any checkpoint was accepted): mark the run as running, draw the partition."""
        assert self.recorder is not None and self.dm is not None
        self._stop_held = False
        self.recorder.begin(trainer, self.dm.client_class_counts, trainer.ckpt_path is None, self._engine_note)
        # Lightning logs its own keys (LR monitor, validation, epoch metrics) at this counter: keep it the round.
        set_logged_step(trainer, trainer.current_epoch + 1)

    # ---- the round starts ---------------------------------------------------------------------------------------

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Plan the round, set its learning rate, run the method's server start and snapshot the global weights."""
        assert self.dm is not None and self.executor is not None and self.recorder is not None
        self.recorder.close_round(trainer)  # before anything of this round is logged (its server start, say)
        plan = self.plan(trainer.current_epoch)
        slots, local = process_share(plan, *rank_and_world())
        lr = rules.set_round_lr(trainer, plan.lr_scale)
        weights = self.weights_for(plan, self.dm.client_sizes)
        keys = frozenset(name for name, _ in trainable(pl_module))
        server = self.dm.server_context(
            plan, weights, global_weights={}, param_keys=keys, state=self.server_state, device=pl_module.device
        )
        hooks = pl_module if isinstance(pl_module, FederatedHooks) else None
        payload = round_payload(pl_module, server)
        # Snapshot after the hook, so that whatever it set in the module reaches every client of the round.
        server.global_weights = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        self._round = RoundState(
            plan,
            slots,
            weights,
            batches_per_client=[1] * len(local.clients) if self.client_batches else local.steps,
            upload_reduce=hooks.upload_reduce if hooks is not None else None,
            group_size=self.client_group,
            global_weights=server.global_weights,
            lr=lr,
            started_at=time.perf_counter(),
            received_class_acc=self.evaluate(pl_module, trainer).class_acc if self.eval_local else np.zeros(0),
        )
        self._server = server
        self.recorder.begin_round(trainer)
        self.executor.start_round(self._round, payload)
        pl_module.train()

    # ---- local updates ------------------------------------------------------------------------------------------

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """A client may start (see :class:`~fl_lightning.executor.ClientExecutor`)."""
        assert self.executor is not None
        self.executor.on_batch_start(trainer, pl_module, batch, batch_idx)

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """Per-step batches of a module with hooks: its ``before_local_step`` runs here.

        Outside a fit (a Flower ClientApp's local step through a gradient scaler) there is no executor: nothing to do.
        """
        if self.executor is not None:
            self.executor.before_optimizer_step(pl_module)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """A client may end (the executor hands its results to the round); after the last batch, the round ends.

        The round ends here rather than at the epoch's end so that Lightning's validation, checkpoint and early
        stopping, which follow the last batch, see the new global model and the round's metrics.
        """
        assert self.executor is not None
        self.executor.on_batch_end(pl_module, outputs, batch_idx)
        if self._round is not None and self._round.is_last_batch(batch_idx):
            self._end_round(trainer, pl_module)
        self.hold_stop(trainer)

    # ---- reduce, server step, evaluate --------------------------------------------------------------------------

    def _end_round(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Reduce the round's clients, take the server step, evaluate and record the round."""
        rnd, server = self._round, self._server
        assert rnd is not None and server is not None and self.recorder is not None
        r = rnd.plan.round
        set_logged_step(trainer, r + 1)  # validation's step: the round (see on_train_start)
        diverged = rnd.gather_divergence()
        if diverged:
            pl_module.load_state_dict(rnd.global_weights)  # keep the last finite global model
            self._stop_diverged(trainer, r + 1, diverged[0])
            self._round = None
            return
        update = pl_module.server_update if isinstance(pl_module, FederatedHooks) else None
        pl_module.load_state_dict(self.server_step(rnd, server, update))
        result = self.evaluate(pl_module, trainer) if self.evaluates(r + 1) else None
        self.recorder.end_round(trainer, rnd, result, self.client_states)
        self._round = None

    def _check_round_ended(self) -> None:
        """Refuse to go on when the module ended the epoch before the round's last batch."""
        if self._round is not None:
            raise RuntimeError(
                f"the fit stopped in the middle of round {self._round.plan.round + 1}: the module set "
                "trainer.should_stop (or its on_train_batch_start returned -1) before the round's last client was "
                "trained; a round runs whole, so stop at its end instead (in on_train_epoch_end, or from a callback, "
                "whose stop waits for the round's end); the run resumes from the last finished round"
            )

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A fit validates once a round has ended; never one client's local weights in the middle of a round."""
        self._check_round_ended()  # None outside a fit's rounds

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Record the evaluated round (with any validation metrics of its global model) and step LR schedulers.

        An epoch-interval LR scheduler steps once per round: Lightning steps it for automatic optimization, this
        callback for the methods' manual optimization (which Lightning leaves alone).
        """
        assert self.recorder is not None and self.dm is not None
        self._check_round_ended()
        # Lightning logs a round's epoch metrics at this counter minus one, and the next LR monitor reading at it.
        set_logged_step(trainer, trainer.current_epoch + 2)
        if self.recorder.record_measured(trainer):
            diverged = self.recorder.divergence(self.collapse_rounds, self.dm.test_class_counts)
            if diverged is not None:
                self._stop_diverged(trainer, *diverged)
        rules.step_lr_schedulers(trainer, pl_module)
        self._fit_group_to_memory(trainer)

    def _fit_group_to_memory(self, trainer: L.Trainer) -> None:
        """Report the peak GPU memory per stacked client once measured; re-fit a chosen group size to it."""
        memory = getattr(self.executor, "memory", None)
        if not isinstance(memory, StackedMemory) or self.recorder is None:
            return
        if memory.per_client > 0:
            mib = round(memory.per_client / MIB, 1)
            if self.recorder.info.get("gpu_memory_per_client_mib") != mib:
                self.recorder.info["gpu_memory_per_client_mib"] = mib
                self.recorder.say(trainer, memory.describe())
        if self._budget is not None and self.client_group is not None:
            # Every process (also one that measured nothing: it trained only padding) takes part in the agreement:
            # processes that train different numbers of batches in a round mismatch Lightning's per-batch collectives.
            clients = num_sampled(self.dm.num_clients, self.sample_ratio) if self.dm is not None else self.client_group
            own = self.client_group
            if memory.per_client > 0:
                own = fitting_group(self._budget, 0.0, memory.per_client, clients)
            fitted = agreed_min(own)
            if fitted != self.client_group:
                self.recorder.say(
                    trainer,
                    f"engine batched: up to {fitted} clients trained together from the next round "
                    f"(to fit {self._budget / GIB:.1f} GiB at the measured peak)",
                )
                self.client_group = fitted

    def hold_stop(self, trainer: L.Trainer) -> None:
        """After a training batch: hold back a stop asked for mid-round; hand it on once the round has ended.

        Called by this callback's own batch end (for the callbacks before it) and by
        :class:`~fl_lightning.whole_rounds.WholeRounds` (for those after it). A stop that ``min_epochs`` holds back
        anyway is left alone.
        """
        if self._round is None:  # the round ended with this batch (or diverged): a stop may take effect
            if self._stop_held:
                trainer.should_stop, self._stop_held = True, False
            return
        if trainer.should_stop and can_stop_early(trainer):
            if not self._stop_held and self.recorder is not None:
                running = self._round.plan.round + 1
                self.recorder.say(trainer, f"round {running}: stop asked for mid-round; the round finishes first")
            trainer.should_stop, self._stop_held = False, True

    def measure_stopped_round(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A run stopped after a round without an evaluation (``eval_every`` above 1): evaluate and record it.

        A run that stops, completed, after such a round has it evaluated (and checked for divergence), so that its
        last round is recorded; a failed or interrupted run is not evaluated.
        """
        stops = trainer.should_stop and can_stop_early(trainer)  # not while min_epochs holds the fit
        if stops and self.recorder is not None and self.recorder.unmeasured and self.dm is not None:
            if self.recorder.status == "running":
                self.recorder.measure_late(trainer, self.evaluate(pl_module, trainer))
                diverged = self.recorder.divergence(self.collapse_rounds, self.dm.test_class_counts)
                if diverged is not None:
                    self._stop_diverged(trainer, *diverged)

    def _stop_diverged(self, trainer: L.Trainer, round_number: int, reason: str) -> None:
        """End the run as ``diverged`` in ``round_number``: its record says so and the Trainer stops."""
        assert self.recorder is not None
        self.recorder.finish_diverged(trainer, round_number, reason)
        trainer.should_stop = True

    def evaluate(
        self, pl_module: L.LightningModule, trainer: L.Trainer | None = None, split: bool = True
    ) -> Evaluation:
        """The test loss, accuracy and class-wise accuracy of ``pl_module``'s current weights (see ``test_evaluation``).

        ``split``: with several processes, each evaluates its share of the test batches (all must call it together).
        """
        assert self.dm is not None
        context = trainer.precision_plugin.forward_context() if trainer is not None else None
        return self.dm.test_evaluation(pl_module, context, rank_and_world() if split else (0, 1))

    # ---- end of the run -----------------------------------------------------------------------------------------

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Close the record: completed when every round ran, interrupted when something stopped it early."""
        assert self.recorder is not None
        self.measure_stopped_round(trainer, pl_module)  # a stop after the last checkpoint saved (or with none saved)
        self.recorder.add_late_metrics(trainer)
        self.recorder.end(trainer, self.rounds)

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """A signal or Ctrl-C leaves the run ``interrupted`` (resumable); any other error leaves it ``failed``."""
        if self.recorder is not None and self._stage == "fit":  # an error in validate/test/predict is not the run's
            self.recorder.end_with(trainer, exception)
        self._claim.release()

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Complete the record of a run restored with every round done; every process then holds rank 0's status."""
        if self.recorder is not None and self.dm is not None:
            self.recorder.finish_restored(trainer, self.dm.client_class_counts)
            self.recorder.share_status(trainer)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Release the run directory (and remove a process's temporary spill folder)."""
        self._claim.release()
        if self._spill is not None and stage == "fit":
            self._spill.cleanup()
            self._spill = None

    # ---- checkpointing ------------------------------------------------------------------------------------------

    @override
    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint (of a fit) made with other settings, or a run that is over (its file is checked)."""
        if self._stage == "fit" and self.dm is not None:  # before anything of the run is restored or written
            self.check_resume(checkpoint, pl_module.hparams, self.dm.hparams)
            refusal = None
            if trainer.is_global_zero:  # rank 0's run directory decides, for every process (one alone would hang)
                try:
                    done, files = rounds_done(checkpoint), None if self._files_checked else run_files(self.plots)
                    check_resumed_run_dir(trainer.default_root_dir, self.rounds, done, files)
                except RunDirError as err:
                    refusal = str(err)
            refusal = trainer.strategy.broadcast(refusal, src=0)
            if refusal is not None:
                raise RunDirError(refusal)

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """The round's record in the checkpoint also holds what the module logged in its own ``on_train_epoch_end``.

        Lightning saves the round's checkpoint after that hook, but took the callbacks' states (:meth:`state_dict`)
        before this one.
        """
        if self.recorder is not None and self._stage == "fit":
            # a stop set after WholeRounds' epoch end: the module's own, or EarlyStopping's at the epoch's end
            self.measure_stopped_round(trainer, pl_module)
            self.recorder.add_late_metrics(trainer)
            state = checkpoint.get("callbacks", {}).get(self.state_key)
            if isinstance(state, dict) and state.get("record") is not None:
                state["record"] = self.recorder.state_dict()

    @override
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs beyond the model weights."""
        return {"record": self.recorder.state_dict() if self.recorder is not None else None, **self.server_state_dict()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state saved by :meth:`state_dict` (also from checkpoints of earlier versions)."""
        if self._stage != "fit":  # validate/test/predict from a checkpoint: its weights, not the run's record
            return
        self.check_seed(state_dict)
        if self.recorder is None:
            self._pending_state = state_dict
            return
        self._pending_state = None
        state_dict = upgrade_state(state_dict)
        if state_dict.get("record") is not None:
            self.recorder.load_state_dict(state_dict["record"])
        self.load_server_state(state_dict)


def _checked_data(trainer: L.Trainer, pl_module: L.LightningModule, rounds: int) -> FederatedDataModule:
    """The fit's datamodule, set up, once the Trainer, the module and the data are checked to work together."""
    dm = rules.check_datamodule(trainer.datamodule)  # type: ignore[attr-defined]  # assigned by Lightning
    hooks = pl_module if isinstance(pl_module, FederatedHooks) else None
    rules.check_trainer(trainer, hooks.method_name if hooks is not None and hooks.needs_exact_steps else None, rounds)
    quiet_lightning()
    # Metrics a method logs reach the loggers through the recorder, on the round axis, not every n local steps.
    trainer.log_every_n_steps = 2**31  # type: ignore[attr-defined]  # assigned by Lightning, undeclared
    dm.setup("fit")
    faults.point("after-data-line")
    rules.check_pieces(trainer, pl_module, dm, hooks.holdout_per_class_required if hooks is not None else 0)
    trainer.reload_dataloaders_every_n_epochs = 1  # type: ignore[attr-defined]  # assigned by Lightning
    return dm

"""A run's record: per-round metrics, the summary, plots and logger output, written where scripts can read them.

The :class:`~fl_lightning.Federation` callback measures; :class:`RunRecorder` keeps the history, derives the
papers' metrics from it (best accuracy, forgetting F), writes ``metrics.csv``/``summary.json``/PNGs atomically into
the run directory (on rank 0 only) and sends the rows to the Trainer's loggers with the round as the step. It never
creates the run directory (the fit that claims it does): a directory removed during the run ends it with a
:class:`~fl_lightning.core.run_lock.RunDirLost`, never a run recorded in a new directory of the same name.
"""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks.progress import TQDMProgressBar
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from fl_lightning.core import faults
from fl_lightning.core.evaluation import Evaluation
from fl_lightning.core.files import is_disk_full, overwrite_in_place, remove_temporaries, write_text_atomic
from fl_lightning.core.metrics import collapsed, forgetting, label_entropy
from fl_lightning.core.provenance import device_label, git_revision
from fl_lightning.core.rounds import RoundState
from fl_lightning.core.run_lock import RunDirWatch
from fl_lightning.core.rundir import RunDirLost, check_fresh_run_dir
from fl_lightning.core.state import ClientStateStore
from fl_lightning.lightning_internals import step_only_logged_names

#: Final statuses a run can end with; ``running`` is written while it trains.
STATUSES = ("completed", "diverged", "interrupted", "failed")

#: Logger keys of the recorded columns (the rest keep their column name).
_LOGGER_KEYS = {
    "global_acc": "global/acc",
    "global_loss": "global/loss",
    "best_acc": "global/acc_best",
    "forgetting": "global/forgetting",
    "train_loss": "train/loss",
    "lr": "train/lr",
    "round_seconds": "time/round_seconds",
    "local_acc_mean": "local/acc_mean",
    "local_forgetting_degree": "local/forgetting_degree",
}


class RunRecorder:
    """The history of a federated run and the files it writes into ``run_dir``.

    Args:
        run_dir: the run directory (the Trainer's ``default_root_dir``).
        info: the run's identity for ``summary.json`` (method, dataset, partition, clients, seed, ...).
        plots: draw ``curve.png`` (and the caller's partition plot).
        total_rounds: rounds the run is planned for.
    """

    def __init__(self, run_dir: Path, info: Mapping[str, Any], plots: bool, total_rounds: int) -> None:
        self.run_dir = run_dir
        self.info = dict(info)
        self.plots = plots
        self.total_rounds = total_rounds
        self.history: list[dict[str, float]] = []
        self.class_acc_history: list[list[float]] = []
        self.elapsed = 0.0
        self.status = "running"
        self.error: str | None = None
        self.diverged_round: int | None = None
        self.stopped_early_round: int | None = None
        self._published: set[str] = set()  # the callback metrics this recorder set (never recorded as a module's)
        self._unmeasured: tuple[RoundState, float] | None = None  # the round just ended, when it was not evaluated
        self.client_state: dict[str, float] | None = None  # ClientStateStore.usage(), for methods that keep one
        self.started = False
        self._written_status: str | None = None  # the status summary.json holds now
        self._measured: tuple[dict[str, float], np.ndarray] | None = None  # the round evaluated, to be recorded
        self._metrics_before: dict[str, Any] = {}  # the callback metrics as the round started (begin_round)
        self._row_open = False  # the last row may still gain what the module logs after it was recorded
        self._watch = RunDirWatch(run_dir)  # from start() on, tells when the run directory is removed

    # ---- state ---------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue the record (a checkpoint's: a RunDirLost if the directory is gone)."""
        self._watch.check()  # before the checkpoint is written, which would create the directory anew
        state: dict[str, Any] = {
            "history": self.history,
            "class_acc_history": self.class_acc_history,
            "elapsed": self.elapsed,
            "client_state": self.client_state,  # a run finished from its checkpoint reports it as the run did
        }
        if self.status == "diverged":  # so that finishing a run from its checkpoint keeps how it ended
            state.update(diverged_round=self.diverged_round, error=self.error)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the record of a checkpointed run."""
        self.history = list(state["history"])
        self.class_acc_history = list(state["class_acc_history"])
        self.elapsed, self.client_state = float(state["elapsed"]), state.get("client_state")
        self.diverged_round, self.error = state.get("diverged_round"), state.get("error")
        self.status = "running"

    # ---- recording -------------------------------------------------------------------------------------------------

    def begin(self, trainer: L.Trainer, counts: np.ndarray, new_run: bool, note: str | None = None) -> None:
        """Training starts: mark the run as running, write its partition (``counts``) and say ``note``.

        A ``new_run`` (no checkpoint) must not start over a finished run in the same directory.
        """
        if trainer.is_global_zero and new_run:
            check_fresh_run_dir(self.run_dir)
        self.start(trainer)
        if trainer.is_global_zero and (not self.history or self._partition_missing()):  # a resume into a new folder
            self.write_partition(counts)
        if note is not None:
            self.say(trainer, note)

    def start(self, trainer: L.Trainer) -> None:
        """Mark the run as running (called once training really starts, after any checkpoint was accepted).

        The run directory must exist (the fit claimed it); from now on a write finds it removed with a
        :class:`~fl_lightning.core.run_lock.RunDirLost`.
        """
        self.started = True
        if trainer.is_global_zero:
            self._watch.open()
            for folder in (self.run_dir, self.run_dir / "checkpoints", self.run_dir / "client_state"):
                remove_temporaries(folder)  # what a killed earlier attempt left
            self._write_summary()

    def close_round(self, trainer: L.Trainer) -> None:
        """The next round is about to start: the last row takes what was logged since (:meth:`add_late_metrics`)."""
        self.add_late_metrics(trainer)
        self._row_open = False

    def begin_round(self, trainer: L.Trainer) -> None:
        """A round starts: what Lightning's callback metrics hold now was logged before it (:meth:`record_round`)."""
        self._unmeasured = None
        self._metrics_before = dict(trainer.callback_metrics)

    def record_round(self, trainer: L.Trainer, measured: Mapping[str, Any], class_acc: np.ndarray) -> dict[str, float]:
        """Add one evaluated round (``measured`` holds round, global_acc, global_loss, ...); returns the full row.

        Whatever the module logged with ``self.log`` during the round (its last value, or its round mean with
        ``on_epoch=True``; in its own ``on_train_epoch_end``: :meth:`add_late_metrics`) joins the row under its own
        name, so that it lands in ``metrics.csv`` and, with the round as the step, in the loggers. A value logged in an
        earlier round only (validation that ran every few rounds, say), which Lightning's callback metrics still hold,
        does not: its cell stays empty.
        """
        self.class_acc_history.append([float(a) for a in class_acc])
        prev_best = max((row["global_acc"] for row in self.history), default=-1.0)
        row: dict[str, float] = dict(measured)
        row["best_acc"] = max(float(measured["global_acc"]), prev_best)
        row["forgetting"] = forgetting(self.class_acc_history)
        row["elapsed_seconds"] = self.elapsed
        row.update({f"acc_class_{c}": float(a) for c, a in enumerate(class_acc)})
        self.publish(trainer, row)  # before the module's own metrics join the row: those are Lightning's already
        self._add_module_metrics(trainer, row)
        self.history.append(row)
        self._log(trainer, row)
        self.say(
            trainer,
            f"round {int(row['round'])}/{self.total_rounds}  acc {row['global_acc']:.4f}  best {row['best_acc']:.4f}  "
            f"test loss {row['global_loss']:.4f}  train loss {row['train_loss']:.4f}  lr {row['lr']:.4g}  "
            f"{row['round_seconds']:.1f}s",
        )
        if trainer.is_global_zero:
            with self._writing():
                self._write_metrics()
                self._write_summary()
        self._row_open = True
        if int(row["round"]) >= self.total_rounds:
            faults.point("after-last-round")
        return row

    def add_late_metrics(self, trainer: L.Trainer) -> None:
        """Add to the last round's row what the module logged after the row was recorded, and rewrite ``metrics.csv``.

        Lightning calls a module's own ``on_train_epoch_end`` after the callbacks' (but for checkpoints and early
        stopping), so what it logs there arrives after the round was recorded. The callback calls this at the next
        point it runs after that hook: the round's checkpoint, the next round's start (:meth:`close_round`), the end of
        training. A run that diverged in that round is no exception: its files are written again.
        """
        if not self._row_open or self.status not in ("running", "diverged") or not self.history:
            return
        if self._add_module_metrics(trainer, self.history[-1]) and trainer.is_global_zero:
            with self._writing():
                self._write_metrics()

    def _add_module_metrics(self, trainer: L.Trainer, row: dict[str, float]) -> bool:
        """Add to ``row`` the single-valued callback metrics the module logged this round; whether any was new."""
        added = False
        for key, value in trainer.callback_metrics.items():
            # A value Lightning has not updated since the round started is still the same object: an earlier round's.
            fresh = value is not self._metrics_before.get(key)
            if fresh and key not in row and key not in self._published and value.numel() == 1:
                row[key] = float(value)
                added = True
        return added

    def end_round(
        self,
        trainer: L.Trainer,
        rnd: RoundState,
        result: Evaluation | None,
        client_states: ClientStateStore | None = None,
    ) -> None:
        """A round's server step is done: count its time and, if it was evaluated, publish its measurements.

        ``result``: the new global model's evaluation (``None``: not evaluated this round); ``client_states``: where
        the clients' states are kept, whose usage the summary reports. The measurements are recorded by
        :meth:`record_measured`, after Lightning's validation of this global model, whose metrics join the row.
        """
        seconds = time.perf_counter() - rnd.started_at
        self.elapsed += seconds
        if result is None:
            # No measurements: the last evaluated round's leave the callback metrics, so that EarlyStopping or a
            # ReduceLROnPlateau (eval_every above 1) do not take them for this round's.
            metrics = trainer.callback_metrics
            for key in self._published:
                metrics.pop(key, None)
            self._unmeasured = (rnd, seconds)
            return
        measured = rnd.measurements(result, seconds)
        if client_states is not None and len(client_states):
            self.client_state = client_states.usage()
        self._measured = (measured, result.class_acc)
        self.publish(trainer, measured)

    @property
    def unmeasured(self) -> bool:
        """Whether the round that just ended was not evaluated (``eval_every`` above 1; see :meth:`measure_late`)."""
        return self._unmeasured is not None

    def measure_late(self, trainer: L.Trainer, result: Evaluation) -> None:
        """Record the round that just ended without an evaluation, now evaluated: a stopped run's last round.

        A run's last round is always evaluated (its row is the run's result; a resume counts the rounds done by the
        rows). A run stopped after a round without one (Lightning's ``max_time``, a callback) has it evaluated here.
        """
        if self._unmeasured is None:
            return
        rnd, seconds = self._unmeasured
        self._unmeasured = None
        self.record_round(trainer, rnd.measurements(result, seconds), result.class_acc)

    def record_measured(self, trainer: L.Trainer) -> bool:
        """Record the round :meth:`end_round` measured, if any (see :meth:`record_round`); whether there was one."""
        if self._measured is None:
            return False
        measured, class_acc = self._measured
        self._measured = None
        self.record_round(trainer, measured, class_acc)
        return True

    def publish(self, trainer: L.Trainer, metrics: Mapping[str, float]) -> None:
        """Make a round's metrics callback metrics, so that ``ModelCheckpoint(monitor=...)`` can watch them.

        Each goes under its column name and its logger key (``global_acc`` and ``global/acc``), for
        ``ModelCheckpoint``, ``EarlyStopping`` and LR schedulers alike.
        """
        published = monitorable(metrics)
        self._published.update(published)
        trainer.callback_metrics.update(published)

    def finish(self, trainer: L.Trainer, status: str, error: str | None = None) -> None:
        """End the record with ``status`` (one of :data:`STATUSES`): final files, plot and logger summary."""
        if status not in STATUSES:
            raise ValueError(f"unknown run status {status!r}")
        self.status, self.error = status, error
        if not self.started or not trainer.is_global_zero:
            return
        try:
            # A signal now waits until the files are written: the run ends with one status, whole.
            held = f"the final files of the run ({status}) were written before it took effect"
            with faults.deferred_signals(lambda names: self.say(trainer, f"{names} received: {held}")), self._writing():
                if status == "completed":
                    self._write_final_files(trainer)
                    self._write_summary()  # last: a run says completed only once all its files are written
                else:
                    self._write_summary()  # first: how the run ended is recorded even on a full disk
                    self._write_final_files(trainer, best_effort=True)
        except RunDirLost as err:
            self.status, self.error = "failed", str(err)  # nothing to write into: the exception says so
            self._watch.close()
            raise
        except BaseException:
            if status == "completed" and self._written_status != "completed":
                self.status, self.error = "running", None  # not completed: the caller records how it ended
            raise
        self._watch.close()
        close_bar = getattr(trainer.progress_bar_callback, "close_bar", None)
        if close_bar is not None:
            close_bar()  # RoundProgressBar: erase the bar before the closing line or warning
        if status == "completed" and self.history:
            best = max(r["global_acc"] for r in self.history)
            self.say(
                trainer,
                f"done: final acc {self.history[-1]['global_acc']:.4f}, best {best:.4f} "
                f"in {self.elapsed:.1f}s; results in {self.run_dir}",
            )
        elif status == "interrupted":
            resume = "--ckpt_path last, in Python trainer.fit(..., ckpt_path='last')"
            rank_zero_warn(f"run interrupted; resume it with {resume} (results so far in {self.run_dir})")
        elif status == "failed":
            rank_zero_warn(f"run failed: {error} (results so far in {self.run_dir})")

    def share_status(self, trainer: L.Trainer) -> None:
        """Give every process the status rank 0 recorded (the other ranks write nothing), so that all exit alike."""
        if trainer.world_size > 1:
            self.status = trainer.strategy.broadcast(self.status, src=0)

    def finish_restored(self, trainer: L.Trainer, counts: np.ndarray) -> None:
        """Complete a run restored with every round done (Lightning trains nothing then): write what is missing.

        Nothing happens unless training never started and every round is recorded. ``counts`` (client × class) writes
        the partition when one of its files is missing. A run that diverged in its last round ends ``diverged``
        again; any other ends ``completed``.
        """
        if self.started or not self.history or self.history[-1]["round"] < self.total_rounds:
            return
        status = "diverged" if self.diverged_round is not None else "completed"
        self.say(trainer, f"all {self.total_rounds} rounds are done: writing what is missing, marking the run {status}")
        self.start(trainer)
        if trainer.is_global_zero and self._partition_missing():
            self.write_partition(counts)
        self.finish(trainer, status, self.error if status == "diverged" else None)

    def finish_diverged(self, trainer: L.Trainer, round_number: int, reason: str) -> None:
        """End the record as ``diverged`` in ``round_number`` (the caller stops the Trainer)."""
        self.diverged_round = round_number
        self.say(trainer, f"round {round_number}: diverged ({reason}); stopping")
        self.finish(trainer, "diverged", reason)

    def divergence(self, collapse_rounds: int | None, test_counts: np.ndarray) -> tuple[int, str] | None:
        """Whether the last recorded round shows the run diverged: ``(divergence round, reason)``, else ``None``.

        Diverged: a non-finite test loss, or a collapse (the global model right on at most one class, its test loss
        no lower than the test labels' entropy, for ``collapse_rounds`` evaluated rounds in a row: the papers'
        "Failed"), which diverged in its first round; never a collapse with fewer than two test classes.
        ``test_counts``: test samples per class.
        """
        row = self.history[-1]
        since = self.collapsed_since(collapse_rounds, test_counts) if (np.asarray(test_counts) > 0).sum() >= 2 else None
        if not np.isfinite(row["global_loss"]):
            return int(row["round"]), "the global model's test loss is not finite"
        if since is not None:
            reason = (
                f"the global model has been right on at most one class, with a test loss no lower than ignoring the "
                f"input reaches (the test labels' entropy, {label_entropy(test_counts):.4f}), in {collapse_rounds} "
                f"evaluated rounds in a row to round {int(row['round'])} (accuracy {row['global_acc']:.2%}, "
                f"test loss {row['global_loss']:.4f})"
            )
            return since, reason
        return None

    def end(self, trainer: L.Trainer, total_rounds: int) -> None:
        """At the end of fit: ``completed``, or ``interrupted`` when the run ended short on its own.

        Every round ran, or a callback stopped the run (``EarlyStopping``, Lightning's ``max_time``):
        ``completed``, with ``stopped_early_round`` saying when in the latter case.
        """
        if self.status != "running":
            return
        done = bool(self.history) and self.history[-1]["round"] >= total_rounds
        if not done and trainer.should_stop and self.history:
            self.stopped_early_round = int(self.history[-1]["round"])
            self.say(trainer, f"round {self.stopped_early_round}: stopped early by a callback (e.g. EarlyStopping)")
            done = True
        self.finish(trainer, "completed" if done else "interrupted")

    def end_with(self, trainer: L.Trainer, exception: BaseException) -> None:
        """After an exception: a signal or Ctrl-C leaves the run ``interrupted`` (resumable), others ``failed``.

        A removed run directory (:class:`~fl_lightning.core.run_lock.RunDirLost`) leaves nothing to write into: the run
        is ``failed``, and the exception alone says so.
        """
        if self.status != "running":
            return
        if isinstance(exception, RunDirLost):
            self.status, self.error = "failed", str(exception)
            self._watch.close()
            return
        try:
            if isinstance(exception, (KeyboardInterrupt, SIGTERMException)):
                self.finish(trainer, "interrupted")
            else:
                self.finish(trainer, "failed", f"{type(exception).__name__}: {exception}")
        except (OSError, RunDirLost) as err:  # nothing more can be written (a full disk): the exception propagates
            rank_zero_warn(f"could not record how the run ended ({err})")
        finally:
            self._watch.close()

    def collapsed_since(self, patience: int | None, test_counts: np.ndarray) -> int | None:
        """The first round of a collapse that spans the last ``patience`` evaluated rounds (else None).

        Collapsed (:func:`~fl_lightning.core.metrics.collapsed`): the global model is right on at most one class (it
        predicts one class for everything) and its test loss is no lower than the entropy of the test labels
        (``test_counts``: samples per class), the best a prediction that ignores its input reaches.
        """
        if not patience or len(self.class_acc_history) < patience:
            return None

        def down(i: int) -> bool:
            return collapsed(self.class_acc_history[i], float(self.history[i]["global_loss"]), test_counts)

        first = len(self.class_acc_history) - patience
        if not all(down(i) for i in range(first, len(self.class_acc_history))):  # a round reads the last few only
            return None
        while first > 0 and down(first - 1):
            first -= 1
        return int(self.history[first]["round"])

    def summary(self) -> dict[str, Any]:
        """The run's results in one flat dict (``summary.json``)."""
        accs = [row["global_acc"] for row in self.history]
        best_i = int(np.argmax(accs)) if accs else -1
        out: dict[str, Any] = dict(self.info)
        out.update(
            {
                "rounds": self.total_rounds,
                "rounds_done": int(self.history[-1]["round"]) if self.history else 0,
                "final_acc": accs[-1] if accs else None,
                "best_acc": accs[best_i] if accs else None,
                "best_round": int(self.history[best_i]["round"]) if accs else None,
                "last10_mean_acc": float(np.mean(accs[-10:])) if accs else None,
                "forgetting": self.history[-1]["forgetting"] if accs else None,
                "wall_seconds": round(self.elapsed, 3),
                "status": self.status,
                "git_rev": git_revision(),
                "updated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
        )
        if self.status == "running":
            out["pid"], out["hostname"] = os.getpid(), socket.gethostname()
        if self.client_state:
            out["client_state"] = self.client_state
        if self.diverged_round is not None:
            out["diverged_round"] = self.diverged_round
        if self.stopped_early_round is not None:
            out["stopped_early_round"] = self.stopped_early_round
        if self.error:
            out["error"] = self.error
        return out

    def say(self, trainer: L.Trainer, message: str) -> None:
        """Print a line above the progress bar (rank 0 only); with fl_lightning's bar, on stdout even when it is off."""
        bar = trainer.progress_bar_callback
        ours = hasattr(bar, "close_bar")  # a RoundProgressBar: prints its lines even when it draws no bar
        if isinstance(bar, TQDMProgressBar) and trainer.is_global_zero and (bar.is_enabled or ours):
            bar.print(message)
        else:
            rank_zero_info(message)

    def _partition_missing(self) -> bool:
        names = ["partition.csv", "partition.png"] if self.plots else ["partition.csv"]
        return not all((self.run_dir / name).exists() for name in names)

    def write_partition(self, counts: np.ndarray) -> None:
        """``partition.csv`` (client × class counts) and its heatmap, titled with the dataset, partition and clients."""
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["client", "total", *[f"class_{c}" for c in range(counts.shape[1])]])
        for i, row in enumerate(counts):
            writer.writerow([i, int(row.sum()), *[int(v) for v in row]])
        with self._writing():
            write_text_atomic(self.run_dir / "partition.csv", buf.getvalue())
            if self.plots:
                from fl_lightning.core.plots import plot_partition

                info = self.info
                title = f"{info.get('dataset')}, {info.get('partition')}, {info.get('num_clients')} clients"
                plot_partition(counts, self.run_dir / "partition.png", title)

    # ---- files and loggers ---------------------------------------------------------------------------------------

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Writes into the run directory: a :class:`~fl_lightning.core.run_lock.RunDirLost` once it is removed."""
        self._watch.check()
        try:
            yield
        except FileNotFoundError:
            self._watch.check()  # removed during the write: RunDirLost, chained to the write's error
            raise

    def _write_metrics(self) -> None:
        if not self.history:
            return
        fields: list[str] = []
        for row in self.history:
            fields.extend(k for k in row if k not in fields)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields)
        writer.writeheader()
        writer.writerows(self.history)
        write_text_atomic(self.run_dir / "metrics.csv", buf.getvalue())

    def _write_final_files(self, trainer: L.Trainer, best_effort: bool = False) -> None:
        """``metrics.csv``, ``curve.png`` and the loggers' summary; ``best_effort`` only warns when a write fails."""
        try:
            self._write_metrics()
            faults.point("during-final-writes")
            if self.plots and self.history:
                from fl_lightning.core.plots import plot_curve

                rounds = [int(row["round"]) for row in self.history]
                accs = [row["global_acc"] for row in self.history]
                info = self.info
                title = (
                    f"{info.get('method')} on {info.get('dataset')}, {info.get('partition')}, "
                    f"{info.get('num_clients')} clients"
                )
                plot_curve(rounds, accs, self.run_dir / "curve.png", title, diverged_round=self.diverged_round)
            self._send_summary(trainer)
        except OSError as err:
            if not best_effort:
                raise
            rank_zero_warn(f"could not write the final files ({err})")

    def _write_summary(self) -> None:
        text = json.dumps(self.summary(), indent=2)
        try:
            write_text_atomic(self.run_dir / "summary.json", text)
        except OSError as err:
            if not is_disk_full(err) or self.status in ("running", "completed"):
                raise
            # No room for a temporary: how the run ended goes into the old summary's own blocks.
            overwrite_in_place(self.run_dir / "summary.json", text)
        self._written_status = self.status

    def _log(self, trainer: L.Trainer, row: Mapping[str, float]) -> None:
        if not trainer.loggers:
            return
        metrics: dict[str, float] = {}
        per_step = _step_only_keys(trainer)
        for key, value in row.items():
            # A module's metrics go to the loggers through Lightning (validation, epoch-level ones), at the round step,
            # except those logged on step only, which Lightning sends every log_every_n_steps (off under Federation).
            if key in ("round", "clients", "elapsed_seconds") or (key not in self._published and key not in per_step):
                continue
            name = f"global_class/acc_{key[10:]}" if key.startswith("acc_class_") else _LOGGER_KEYS.get(key, key)
            metrics[name] = value
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=int(row["round"]))
        trainer.logged_metrics.update({k: torch.tensor(v) for k, v in metrics.items()})  # as Lightning's logging does

    def _send_summary(self, trainer: L.Trainer) -> None:
        """Final summary and figures to loggers that take them (W&B)."""
        summary = self.summary()
        for logger in trainer.loggers:
            run_summary: Any = getattr(getattr(logger, "experiment", None), "summary", None)
            if hasattr(run_summary, "update"):
                run_summary.update({k: v for k, v in summary.items() if v is not None})
            if hasattr(logger, "log_image"):
                for name in ("curve", "partition"):
                    path = self.run_dir / f"{name}.png"
                    if path.exists():
                        logger.log_image(key=f"plots/{name}", images=[str(path)])


def _step_only_keys(trainer: L.Trainer) -> set[str]:
    """The names a module logged in training with ``on_step`` only (read from Lightning's training results)."""
    return step_only_logged_names(trainer)


def is_round_metric(key: str) -> bool:
    """Whether ``key`` is a callback metric of an evaluated round (see :func:`monitorable`), measured by the callback.

    >>> is_round_metric("global/acc"), is_round_metric("acc_class_3"), is_round_metric("val/acc")
    (True, True, False)
    """
    named = key in _LOGGER_KEYS or key in _LOGGER_KEYS.values() or key in ("round", "clients", "elapsed_seconds")
    return named or key.startswith(("acc_class_", "global_class/acc_"))


def monitorable(row: Mapping[str, float]) -> dict[str, Any]:
    """A round's row as callback metrics: every value under its column name and its logger key.

    >>> sorted(monitorable({"global_acc": 0.5, "acc_class_3": 1.0}))
    ['acc_class_3', 'global/acc', 'global_acc', 'global_class/acc_3']
    """
    out: dict[str, Any] = {}
    for key, value in row.items():
        tensor = torch.tensor(float(value))
        out[key] = tensor
        out[_LOGGER_KEYS.get(key, f"global_class/acc_{key[10:]}" if key.startswith("acc_class_") else key)] = tensor
    return out


def run_info(trainer: L.Trainer, module: L.LightningModule, datamodule: Any, **federation: Any) -> dict[str, Any]:
    """A run's identity for ``summary.json``: method, dataset, partition, clients, network, seed, precision, ...

    ``federation`` holds the callback's settings to record (``sample_ratio``, ``local_epochs``, ``seed``).
    """
    net = module.hparams.get("net") if hasattr(module, "hparams") else None
    return {
        "method": getattr(module, "method_name", type(module).__name__),
        "dataset": datamodule.dataset,
        "partition": datamodule.partition_label,
        "num_clients": datamodule.num_clients,
        "sample_ratio": federation["sample_ratio"],
        "local_epochs": federation["local_epochs"],
        "model": net if isinstance(net, str) or net is None else type(net).__name__,
        "seed": federation["seed"],
        "precision": str(trainer.precision),
        "world_size": trainer.world_size,
        "device": device_label(trainer.strategy.root_device),
    }

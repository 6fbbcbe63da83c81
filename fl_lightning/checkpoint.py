"""The run's checkpoint: one file, ``<run dir>/checkpoints/last.ckpt``, replaced whole after every round."""

from __future__ import annotations

import errno
import io
import os
import pickle
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

from fl_lightning.core import faults
from fl_lightning.core.files import is_disk_full, seal_checkpoint, temporary_name, write_bytes_atomic
from fl_lightning.core.messages import option
from fl_lightning.core.rundir import check_checkpoint_file
from fl_lightning.core.state import unpicklable, unstorable_state


class AtomicLastCheckpoint(ModelCheckpoint):
    """Keeps one checkpoint, ``checkpoints/last.ckpt``, replaced whole after every round (temp file + rename).

    A process killed at any point leaves the previous round's checkpoint or the new one, never a cut file or a link
    to a deleted file (Lightning's ``save_last="link"`` with ``save_top_k=1`` can leave either). Each checkpoint
    carries its checksum (:func:`~fl_lightning.core.files.seal_checkpoint`); a write that fails (a full disk) removes
    its temporary and leaves the previous checkpoint.
    """

    def __init__(self) -> None:
        super().__init__(save_top_k=0, save_last=True, enable_version_counter=False)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Save ``last.ckpt`` after every round."""
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    @override
    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        tmp = temporary_name(Path(filepath))
        try:
            super()._save_checkpoint(trainer, str(tmp))
            if trainer.is_global_zero:
                seal_checkpoint(tmp)
                os.replace(tmp, filepath)
        except OSError as err:
            if not is_disk_full(err):
                raise
            raise disk_full(err, filepath) from err  # the file the user knows, not its temporary
        finally:
            tmp.unlink(missing_ok=True)
        trainer.strategy.barrier()
        self._last_checkpoint_saved = filepath
        if trainer.current_epoch + 1 >= (trainer.max_epochs or 0):
            faults.point("after-last-checkpoint")

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the checkpoint's bookkeeping, unless the run directory was moved: then there is nothing to restore.

        There is no "best" checkpoint to remember (``save_top_k=0``) and ``last.ckpt`` is always the same file, so a
        run resumed from a moved (or renamed) directory continues as it would have; Lightning's warning that
        ``best_model_score`` "won't be reloaded" would only puzzle.
        """
        if state_dict.get("dirpath", self.dirpath) == self.dirpath:
            super().load_state_dict(state_dict)


class VerifiedCheckpointIO(CheckpointIO):
    """A strategy's checkpoint IO that checks a checkpoint file before anything is read from it.

    A file cut short, damaged or no checkpoint at all is refused with one line naming it
    (:func:`~fl_lightning.core.rundir.check_checkpoint_file`), as the command line refuses it, where torch would fail
    deep in its unpickler. Everything else is the wrapped IO's (``inner``: the strategy's own).
    """

    def __init__(self, inner: CheckpointIO) -> None:
        self.inner = inner

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Save as the inner IO would; a local file through a temporary beside it, not in ``$TMPDIR``.

        Lightning's own IO writes through fsspec's transaction, which stages the file in the system's temporary
        folder first: a full ``/tmp`` then failed a run whose own disk had room, naming neither file. A full disk's
        error names ``path`` and what to do (:func:`disk_full`); a value pickle refuses is named by its keys
        (:func:`unstorable_entry`).
        """
        local = isinstance(path, str | os.PathLike) and "://" not in str(path)
        try:
            if local and storage_options is None and type(self.inner) is TorchCheckpointIO:
                buffer = io.BytesIO()
                torch.save(checkpoint, buffer)
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                try:
                    write_bytes_atomic(path, buffer.getbuffer())
                except OSError as err:
                    if not is_disk_full(err):
                        raise
                    raise disk_full(err, path) from err
                return
            self.inner.save_checkpoint(checkpoint, path, storage_options)
        except (TypeError, AttributeError, pickle.PicklingError) as err:
            unstorable = unstorable_entry(checkpoint)
            if unstorable is None:
                raise
            raise unstorable from err

    @override
    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict:
        if isinstance(path, str | os.PathLike) and Path(path).is_file():
            check_checkpoint_file(path)
        # Only the arguments given: the inner IO's own defaults stay (Lightning's loads to the CPU by default).
        return self.inner.load_checkpoint(path, *args, **kwargs)

    @override
    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)

    @override
    def teardown(self) -> None:
        self.inner.teardown()


def disk_full(err: OSError, target: str | os.PathLike[str]) -> OSError:
    """A full disk's (or quota's) error for the checkpoint ``target``: what happened, to which file, what to do.

    >>> print(disk_full(OSError(errno.ENOSPC, "No space left on device"), "run/checkpoints/last.ckpt"))
    ... # doctest: +NORMALIZE_WHITESPACE
    [Errno 28] No space left on device (ENOSPC) writing the checkpoint run/checkpoints/last.ckpt: free space on that
    disk and resume (--ckpt_path last, in Python trainer.fit(..., ckpt_path='last')), or give --trainer.default_root_dir
    (in Python L.Trainer(default_root_dir=...)) a folder on another disk
    """
    code = err.errno if err.errno is not None else errno.ENOSPC
    return OSError(
        code,
        f"{os.strerror(code)} ({errno.errorcode.get(code, code)}) writing the checkpoint {target}: free space on that "
        "disk and resume (--ckpt_path last, in Python trainer.fit(..., ckpt_path='last')), or give "
        f"{option('trainer.default_root_dir')} a folder on another disk",
    )


def unstorable_entry(checkpoint: dict[str, Any]) -> TypeError | None:
    """The one-line error for the first value in ``checkpoint`` that pickle refuses; None when there is none.

    Looked for once a save has failed, not before every save. A method's state is named as the method wrote it
    (``client 3's state['key']``, ``server.state['key']``: :func:`~fl_lightning.core.state.unstorable_state`);
    anything else by its keys in the checkpoint.
    """
    for state in (checkpoint.get("callbacks") or {}).values():
        if isinstance(state, dict) and "client_state" in state and "server_state" in state:
            for client, client_state in (state["client_state"] or {}).items():
                found = unstorable_state(f"client {client}'s state", client_state)
                if found is not None:
                    return found
            found = unstorable_state("server.state", state["server_state"])
            if found is not None:
                return found
    where = unpicklable(checkpoint)
    if where is None:
        return None
    keys = "".join(f"[{key!r}]" for key in where[0])
    return TypeError(f"the checkpoint's {keys} holds a {type(where[1]).__name__}, which a checkpoint cannot store")


def verify_checkpoints_on_load(trainer: L.Trainer) -> None:
    """Have ``trainer``'s strategy check every checkpoint file before reading it (:class:`VerifiedCheckpointIO`)."""
    strategy = trainer.strategy
    if not isinstance(strategy.checkpoint_io, VerifiedCheckpointIO):
        strategy.checkpoint_io = VerifiedCheckpointIO(strategy.checkpoint_io)

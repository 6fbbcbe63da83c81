"""A run directory's lock: a fit claims its directory for its whole life, so that two fits never write into one.

Also the errors of run directories (:class:`RunDirError` and its kin), which :mod:`fl_lightning.core.rundir`'s checks
raise as well.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

from fl_lightning.core import faults
from fl_lightning.core.messages import option


class RunDirError(ValueError):
    """A run directory or checkpoint that a command must not use as asked; the message says what to do instead."""


class RunDirInUse(RunDirError):
    """A run directory that another process's fit holds (:func:`claim_run_dir`)."""


class RunDirLost(RuntimeError):
    """The run directory was removed (or replaced) while its run was writing into it: the run is lost."""


# ---- claiming a run directory ----------------------------------------------------------------------------------------

#: The lock file a fit holds in its run directory for its whole life (removed when it ends).
LOCK_NAME = ".lock"


@dataclass
class _Claim:
    fd: int
    lock: Path
    created: list[Path]  # the folders the claim made, innermost first (removed again if the fit leaves them empty)
    count: int = 1

    def close(self, unlink: bool) -> None:
        try:
            if unlink and _same_file(self.fd, self.lock):
                self.lock.unlink(missing_ok=True)
        finally:
            os.close(self.fd)


_CLAIMS: dict[Path, _Claim] = {}


def _claim_key(run_dir: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(os.path.expanduser(run_dir)))


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def claim_run_dir(run_dir: str | os.PathLike[str]) -> Path:
    """Claim ``run_dir`` for this process until :func:`release_run_dir`: an exclusive lock on ``<run dir>/.lock``.

    Creates the directory if needed. A process claims a directory at most once at a time (a second claim by the same
    process only counts); the operating system drops the lock when the process ends, however it ends.

    Raises:
        RunDirError: another process holds the claim (a fit is running there), or the directory cannot be written.
    """
    run_dir = Path(os.path.expanduser(run_dir))
    key = _claim_key(run_dir)
    if key in _CLAIMS:
        _CLAIMS[key].count += 1
        return run_dir
    created = [folder for folder in (run_dir, *run_dir.parents) if not folder.exists()]
    lock = run_dir / LOCK_NAME
    for _ in range(10):  # retried when the lock file was removed by the fit that just ended
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise RunDirError(
                f"cannot write to {run_dir} ({err.strerror or err}); choose another "
                + option("trainer.default_root_dir")
            ) from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirInUse(
                f"{run_dir} is in use by another fit (pid {holder}); wait for it to end or stop it, "
                f"or choose another {option('trainer.default_root_dir')}"
            ) from None
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise
            # a file system without locks: the directory check alone guards it
        if _same_file(fd, lock):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            _CLAIMS[key] = _Claim(fd, lock, created)
            return run_dir
        os.close(fd)
    raise RunDirError(f"could not claim {run_dir}: its lock file keeps changing; is another fit starting there?")


def free_aside(run_dir: Path) -> Path:
    """Where ``--overwrite`` moves ``run_dir``: ``<name>.replaced-<time>``, with ``-2``, ``-3``... if that is taken.

    >>> free_aside(Path("/nonexistent/run")).name.startswith("run.replaced-")
    True
    """
    stem = f"{run_dir.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"
    aside, n = run_dir.with_name(stem), 1
    while aside.exists():  # two replacements within one second
        n += 1
        aside = run_dir.with_name(f"{stem}-{n}")
    return aside


def move_claimed(run_dir: Path, aside: Path) -> None:
    """Rename ``run_dir`` to ``aside`` (one atomic rename); a claim this process holds moves to a new ``run_dir``."""
    held = _CLAIMS.pop(_claim_key(run_dir), None)
    os.replace(run_dir, aside)
    if held is not None:
        try:
            claim_run_dir(run_dir)
            _CLAIMS[_claim_key(run_dir)].count = held.count
        finally:
            held.lock = aside / LOCK_NAME  # the old run's lock file, now in the moved directory
            held.close(unlink=True)


def release_run_dir(run_dir: str | os.PathLike[str], disposable: tuple[str, ...] = ()) -> None:
    """Undo one :func:`claim_run_dir`; the last one unlocks, and removes a directory the claim made if still empty.

    ``disposable``: files this fit wrote that go with such a directory when it holds nothing else (a fit refused
    after writing its ``config.yaml``, so that no folder of only that file is left behind).
    """
    key = _claim_key(run_dir)
    claim = _CLAIMS.get(key)
    if claim is None:
        return
    claim.count -= 1
    if claim.count > 0:
        return
    del _CLAIMS[key]
    claim.close(unlink=True)
    folder = Path(os.path.expanduser(run_dir))
    if disposable and folder in claim.created and folder.is_dir():
        if {p.name for p in folder.iterdir()} <= set(disposable):
            for name in disposable:
                (folder / name).unlink(missing_ok=True)
    for folder in claim.created:  # only while empty: a fit refused or failed before writing anything
        try:
            folder.rmdir()
        except OSError:
            break


def holds_claim(run_dir: str | os.PathLike[str]) -> bool:
    """Whether this process holds the claim on ``run_dir``."""
    return _claim_key(run_dir) in _CLAIMS


class RunDirClaim:
    """A fit's hold on its run directory: claimed when the fit sets up (one fit at a time), released when it ends."""

    def __init__(self) -> None:
        self.run_dir: Path | None = None

    def acquire(self, run_dir: str | os.PathLike[str]) -> None:
        """Claim ``run_dir`` (:func:`claim_run_dir`) unless this object already holds it."""
        if self.run_dir is not None:
            return
        fresh = not holds_claim(run_dir)
        self.run_dir = claim_run_dir(run_dir)
        if fresh:
            faults.point("after-claim")

    def release(self) -> None:
        """Let the directory go (:func:`release_run_dir`); nothing if not held."""
        if self.run_dir is not None:
            release_run_dir(self.run_dir)
            self.run_dir = None


class RunDirWatch:
    """Tells when a run directory is removed, or replaced by another of the same name, while its run writes into it.

    From :meth:`open` on it holds the directory open, so that a directory made in its place (by a write that creates
    its parents) is told apart from it.

    >>> import tempfile
    >>> watch = RunDirWatch(Path(tempfile.mkdtemp()))
    >>> watch.open()
    >>> watch.run_dir.rmdir()
    >>> watch.check()
    Traceback (most recent call last):
    ...
    fl_lightning.core.run_lock.RunDirLost: the run directory ... was removed during the run; the run is lost
    >>> watch.close()
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self._fd: int | None = None

    def open(self) -> None:
        """Start watching the directory, which must exist (else :class:`RunDirLost`); nothing if already watching."""
        if self._fd is not None:
            return
        try:
            self._fd = os.open(self.run_dir, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError as err:
            raise self.lost() from err

    def check(self) -> None:
        """Raise :class:`RunDirLost` if the watched directory is no longer at its path (nothing when not watching)."""
        if self._fd is None:
            return
        try:
            same = os.path.samestat(os.fstat(self._fd), os.stat(self.run_dir))
        except OSError:
            same = False
        if not same:
            raise self.lost()

    def lost(self) -> RunDirLost:
        """The error that says the run directory is gone."""
        return RunDirLost(f"the run directory {self.run_dir} was removed during the run; the run is lost")

    def close(self) -> None:
        """Stop watching."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

"""Whole-or-nothing file writes: a reader, or a process killed at any point, sees the old file or the new one.

Every file a run writes (metrics.csv, summary.json, partition.csv, config.yaml, plots, spilled client states, the
checkpoint) is written under :func:`temporary_name` next to its target and renamed over it (:func:`atomic_path` does
both). A temporary's name is unique to the writing process and call, so that two processes writing the same file
(two comparisons sharing an output folder) never write into each other's temporary. A SIGKILL can leave such a
temporary behind (never a cut target); the next run in that directory removes it with :func:`remove_temporaries`.

A checkpoint carries its own checksum (:func:`seal_checkpoint`), checked by :func:`verify_checkpoint` before a run
resumes from it.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import itertools
import os
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TEMP_MARK = ".tmp"
_TEMP_COUNTER = itertools.count()
#: The record a sealed checkpoint adds to torch's zip archive: the SHA-256 of every other record (name and bytes).
CHECKSUM_RECORD = ".data/fl_lightning_sha256"


class DamagedCheckpoint(ValueError):
    """A checkpoint whose content does not match its checksum, or a file that is no PyTorch checkpoint at all.

    ``foreign``: the file is no checkpoint at all (a text file, say), rather than a damaged one.
    """

    def __init__(self, message: str, foreign: bool = False) -> None:
        super().__init__(message)
        self.foreign = foreign


def temporary_name(path: Path) -> Path:
    """A new temporary next to ``path``: hidden, marked ``.tmp``, unique to this process and call, same extension.

    The extension stays last, so that writers that infer a format from it (matplotlib) work.

    >>> name = temporary_name(Path("run/curve.png")).name  # .curve.tmp-<pid>-<n>.png
    >>> name.startswith(".curve.tmp-"), name.endswith(".png")
    (True, True)
    """
    return path.with_name(f".{path.stem}{TEMP_MARK}-{os.getpid()}-{next(_TEMP_COUNTER)}{path.suffix}")


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write; it replaces ``path`` when the block ends without error, else is removed."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text``, whole (flushed to disk before the rename)."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def write_bytes_atomic(path: str | Path, data: bytes | memoryview) -> None:
    """Replace ``path`` with ``data``, whole, through a temporary beside it (flushed to disk before the rename).

    An error names ``path`` (a full disk's ``OSError`` from ``write`` names no file) and keeps its ``errno``.
    """
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        if err.filename is not None:
            raise
        raise OSError(err.errno, err.strerror, str(path)) from err


def overwrite_in_place(path: str | Path, text: str) -> None:
    """Rewrite a small file in its own blocks, for when the disk is full and no temporary fits (not atomic)."""
    with open(path, "r+" if Path(path).exists() else "w", newline="") as f:
        f.write(text)
        f.truncate()
        f.flush()
        os.fsync(f.fileno())


def is_disk_full(err: BaseException) -> bool:
    """Whether an error says the disk (or the quota) is full."""
    return isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)


def _content_digest(archive: zipfile.ZipFile) -> str:
    """SHA-256 of every record of a checkpoint's archive except the checksum (zipfile checks each CRC as it reads)."""
    digest = hashlib.sha256()
    for info in archive.infolist():
        if info.filename.endswith("/" + CHECKSUM_RECORD):
            continue
        digest.update(info.filename.encode() + b"\0")
        with archive.open(info) as f:
            for chunk in iter(functools.partial(f.read, 1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def seal_checkpoint(path: str | Path) -> None:
    """Add the checksum of a checkpoint's content to it, as one more record of torch's zip archive."""
    with zipfile.ZipFile(path, "a") as archive:
        digest = _content_digest(archive)
        prefix = archive.namelist()[0].split("/", 1)[0]
        archive.writestr(f"{prefix}/{CHECKSUM_RECORD}", digest)


_VERIFIED: dict[tuple[str, int, int], bool] = {}


def _not_an_archive(path: Path) -> DamagedCheckpoint:
    """Why ``path``, which is no readable zip archive, cannot be loaded: cut short, a text file, or other bytes."""
    with path.open("rb") as f:
        head = f.read(4096)
    if head.startswith(b"PK"):
        return DamagedCheckpoint(f"checkpoint {path} cannot be loaded (cut short: its archive ends early)")
    what = "a text file, not a checkpoint (a config goes to --config)" if _is_text(head) else "no PyTorch checkpoint"
    return DamagedCheckpoint(f"checkpoint {path} cannot be loaded: it is {what}", foreign=True)


def _is_text(head: bytes) -> bool:
    """Whether the first bytes of a file read as UTF-8 text (a character cut at the end allowed)."""
    if b"\0" in head or not head.strip():
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        return err.start >= len(head) - 3
    return True


def verify_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Check that a checkpoint is whole and unchanged since it was written, before anything is restored from it.

    A sealed checkpoint (:func:`seal_checkpoint`) is checked against its SHA-256; any other PyTorch checkpoint (one
    written by Lightning's own ``ModelCheckpoint``) against the CRC-32 of each record of its zip archive.

    Returns:
        Whether the file was sealed.

    Raises:
        DamagedCheckpoint: the file is cut, changed, or no PyTorch checkpoint (one line naming the file).
    """
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key in _VERIFIED:
        return _VERIFIED[key]
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            sealed = next((n for n in names if n.endswith("/" + CHECKSUM_RECORD)), None)
            digest = _content_digest(archive)
            expected = archive.read(sealed).decode(errors="replace").strip() if sealed else digest
    except zipfile.BadZipFile as err:
        if "CRC" in str(err):
            raise DamagedCheckpoint(f"checkpoint {path} cannot be loaded (a record does not match its CRC-32)") from err
        raise _not_an_archive(path) from err
    except (OSError, EOFError, ValueError, KeyError) as err:
        raise DamagedCheckpoint(f"checkpoint {path} cannot be loaded ({err})") from err
    if digest != expected:
        raise DamagedCheckpoint(f"checkpoint {path} cannot be loaded (its content does not match its checksum)")
    _VERIFIED[key] = sealed is not None
    return sealed is not None


def remove_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporaries a killed run left directly in ``folder``; returns what was removed."""
    removed = [p for p in Path(folder).glob(f".*{TEMP_MARK}*") if p.is_file()]
    for p in removed:
        p.unlink(missing_ok=True)
    return removed


def read_yaml(path: str | os.PathLike[str], label: str | None = None) -> Any:
    """The YAML in a file, or a one-line ``ValueError`` naming it (``label``, default the path) and saying why.

    A file that does not parse is named with the line and column of the problem; one that cannot be read, with the
    reason.
    """
    import yaml

    label = label if label is not None else str(path)
    try:
        return yaml.safe_load(Path(path).read_text())
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        reason = " ".join(part for part in (err.context, err.problem) if part)
        raise ValueError(f"{label}: not valid YAML{where}: {reason}") from err
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"{label}: cannot be read as YAML ({' '.join(str(err).split())})") from err

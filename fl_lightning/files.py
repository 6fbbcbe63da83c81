"""Whole-or-nothing file writes: a reader, or a process killed at any point, sees the old file or the new one.

Every file a run writes (metrics.csv, summary.json, partition.csv, config.yaml, plots, spilled client states, the
checkpoint) is written under :func:`temporary_name` next to its target and renamed over it (:func:`atomic_path` does
both). A SIGKILL can leave such a temporary behind (never a cut target); the next run in that directory removes it
with :func:`remove_temporaries`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TEMP_MARK = ".tmp"


def temporary_name(path: Path) -> Path:
    """The temporary next to ``path``: hidden, marked ``.tmp``, same extension (so writers that infer a format work).

    >>> temporary_name(Path("run/curve.png"))
    PosixPath('run/.curve.tmp.png')
    """
    return path.with_name(f".{path.stem}{TEMP_MARK}{path.suffix}")


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


def remove_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporaries a killed run left directly in ``folder``; returns what was removed."""
    removed = [p for p in Path(folder).glob(f".*{TEMP_MARK}*") if p.is_file()]
    for p in removed:
        p.unlink(missing_ok=True)
    return removed

"""Run directories by version: a new ``<base>/version_N`` for every fresh fit, found again by its settings.

A fit whose command names no run directory writes into a new version folder under its default location
(``runs/<config name>``), Lightning's own convention, so that runs of other methods, seeds or settings never meet;
a resume finds the newest version of the same experiment (:func:`matching_version`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fl_lightning.core.files import verify_checkpoint
from fl_lightning.core.run_lock import LOCK_NAME, claim_run_dir, release_run_dir
from fl_lightning.core.rundir import (
    VERSION_PREFIX,
    RunDirError,
    RunDirInUse,
    read_config,
    rounds_done,
    science_diff,
    versions,
)


def claim_new_version(base: str | os.PathLike[str]) -> Path:
    """Claim (:func:`claim_run_dir`) a new, empty ``base/version_N``, N one past the highest there, and return it.

    Two fits that start at once never get the same folder: one that finds its candidate claimed or written by the
    other takes the next number. Undo with :func:`release_run_dir`, which removes the folder again while it is empty.

    Raises:
        RunDirError: ``base`` cannot be written.
    """
    existing = versions(base)
    first = int(existing[-1].name.removeprefix(VERSION_PREFIX)) + 1 if existing else 0
    for number in range(first, first + 1000):
        candidate = Path(base) / f"{VERSION_PREFIX}{number}"
        if candidate.exists():
            continue
        try:
            claim_run_dir(candidate)
        except RunDirInUse:
            continue
        if any(path.name != LOCK_NAME for path in candidate.iterdir()):  # another fit wrote there in between
            release_run_dir(candidate)
            continue
        return candidate
    raise RunDirError(f"no free version folder in {base}; choose a --trainer.default_root_dir")


def matching_version(base: str | os.PathLike[str], new_config: Mapping[str, Any]) -> Path | None:
    """The newest ``version_N`` under ``base`` whose saved ``config.yaml`` is the same experiment as ``new_config``.

    The same experiment: no science key differs (:func:`science_diff`; the rounds may grow). None when no version
    matches (or none has a readable config).
    """
    for path in reversed(versions(base)):
        try:
            saved = read_config(path / "config.yaml")
        except RunDirError:
            continue
        if saved is not None and not science_diff(saved, new_config):
            return path
    return None


def checkpoint_to_evaluate(
    command: str, ckpt_path: str | None, run_dir: Path, base: Path | None, config: Mapping[str, Any]
) -> str:
    """The checkpoint ``validate``/``test`` evaluate: the file named, or ``last`` found as a fit's resume finds it.

    ``last`` is ``run_dir``'s ``checkpoints/last.ckpt``, or, when the command names no run directory (``base`` is
    its default location), that of the newest version of the same experiment as ``config``. Without a checkpoint
    the command would evaluate a freshly initialised model (Lightning only warns): that is refused.

    Raises:
        ValueError: no checkpoint given, or none found for ``last``; the message says what to give.
    """
    if ckpt_path is None:
        raise ValueError(
            f"{command} evaluates a trained global model: give --ckpt_path <run dir>/checkpoints/last.ckpt "
            "(or --ckpt_path last, with the run's settings or its --config <run dir>/config.yaml)"
        )
    if ckpt_path != "last":
        named = os.path.expanduser(ckpt_path)
        if not Path(named).is_file():  # before: Lightning's "Restoring states" line, then its "not found"
            raise ValueError(f"--ckpt_path {ckpt_path}: no such file; give <run dir>/checkpoints/last.ckpt, or last")
        return named
    found = matching_version(base, config) if base is not None else run_dir
    last = found / "checkpoints" / "last.ckpt" if found is not None else None
    if last is None or not last.is_file():
        where = found if found is not None else f"{base} (no version_N of these settings)"
        raise ValueError(
            f"--ckpt_path last: no checkpoints/last.ckpt in {where}; give --ckpt_path <run dir>/checkpoints/last.ckpt"
        )
    return str(last)


def rounds_note(ckpt_path: str | os.PathLike[str], rounds: Any) -> str:
    """The line ``validate``/``test`` print when the checkpoint holds another round than the config's ``rounds``.

    A run stopped early, or a config whose rounds were raised since, is scored as the checkpoint holds it: a note,
    not an error. ``""`` when the rounds agree, or when the file cannot be read (the command then refuses it, saying
    why).

    >>> rounds_note("no such file", 20)
    ''
    """
    if not isinstance(rounds, int) or not Path(ckpt_path).is_file():
        return ""
    import torch

    try:  # checked first (its checksum is remembered), then mapped: the weights are not read
        verify_checkpoint(ckpt_path)
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False, mmap=True)
        held = int(ckpt["epoch"]) + 1 if "epoch" in ckpt else rounds_done(ckpt)
    except Exception:  # torch's reason for a file it cannot read is given when Lightning loads it
        return ""
    return round_note(held, rounds)


def round_note(held: int, rounds: int) -> str:
    """What :func:`rounds_note` says of a checkpoint holding round ``held`` when the config asks for ``rounds``.

    >>> round_note(3, 20)
    'the checkpoint holds round 3 of the 20 the config asks for; scoring that model'
    >>> round_note(20, 3)
    'the checkpoint holds round 20, past the 3 the config asks for; scoring that model'
    >>> round_note(20, 20)
    ''
    """
    if held <= 0 or held == rounds:
        return ""
    where = f"round {held} of the {rounds}" if held < rounds else f"round {held}, past the {rounds}"
    return f"the checkpoint holds {where} the config asks for; scoring that model"

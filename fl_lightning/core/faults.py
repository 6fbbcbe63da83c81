"""Signals and a run's last writes: hold SIGINT/SIGTERM while the final files are written, and a test hook.

:func:`signal_handlers` and :func:`restore_signal_handlers` (or :func:`kept_signal_handlers` around a block) put
back the handlers that code such as Lightning or Ray changes and leaves behind.

:func:`deferred_signals` holds Ctrl-C and SIGTERM while a run writes its final files, so that a signal at that
moment leaves a whole record (then takes effect); the run has ended by then, and its status says how.

:func:`point` is a test hook: ``FL_LIGHTNING_FAULT=<moment>:<SIGNAL>`` (several separated by commas) makes the
process send itself the signal when the run reaches that moment, so that tests stop a run at an exact point instead
of racing a timer. The moments, in the order a fit meets them:

- ``after-claim``: the run directory is claimed (locked), before it is checked;
- ``after-data-line``: the data is set up and its line printed, before anything of the run is written;
- ``after-last-round``: the last round is recorded (its line printed), before its checkpoint;
- ``after-last-checkpoint``: the last round's checkpoint is written, before the final files;
- ``during-final-writes``: the final files are being written (``metrics.csv`` is, the plot and summary are not).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

MOMENTS = ("after-claim", "after-data-line", "after-last-round", "after-last-checkpoint", "during-final-writes")
_ENV = "FL_LIGHTNING_FAULT"


def point(moment: str) -> None:
    """The test hook: send this process the signal that ``FL_LIGHTNING_FAULT`` names for ``moment``, if any."""
    spec = os.environ.get(_ENV)
    if not spec:
        return
    for item in spec.split(","):
        name, _, sig = item.strip().partition(":")
        if name == moment:
            os.kill(os.getpid(), getattr(signal, sig.strip() or "SIGTERM"))


def signal_handlers(signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> dict[int, Any] | None:
    """These signals' handlers now, for :func:`restore_signal_handlers`; ``None`` outside the main thread.

    Only the main thread can set a handler, so there is nothing to keep elsewhere.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    return {s: signal.getsignal(s) for s in signums}


def restore_signal_handlers(previous: Mapping[int, Any] | None) -> None:
    """Put back the handlers :func:`signal_handlers` returned (``None``: nothing to put back)."""
    for s, handler in (previous or {}).items():
        signal.signal(s, handler if handler is not None else signal.SIG_DFL)  # None: a handler set outside Python


@contextmanager
def kept_signal_handlers() -> Iterator[None]:
    """SIGINT's and SIGTERM's handlers after the block are the ones before it."""
    previous = signal_handlers()
    try:
        yield
    finally:
        restore_signal_handlers(previous)


@contextmanager
def deferred_signals(
    note: Callable[[str], None] | None = None, signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)
) -> Iterator[None]:
    """Hold these signals during the block, then deliver them to the handlers that were in place.

    ``note`` is told the names of the signals that were held, before they are delivered. Outside the main thread
    (where handlers cannot be changed) the block runs unprotected.
    """
    previous = signal_handlers(signums)
    if previous is None:
        yield
        return
    pending: list[int] = []
    for s in signums:
        signal.signal(s, lambda signum, _frame: pending.append(signum))
    try:
        yield
    finally:
        restore_signal_handlers(previous)
        held = list(dict.fromkeys(pending))
        if held and note is not None:
            note(" and ".join(signal.Signals(s).name for s in held))
        for s in held:
            signal.raise_signal(s)

r"""One-line messages: what an error says about a value or another error, on one line.

>>> first_line(ValueError("bad value\nmore detail")), first_line(KeyError())
('bad value', 'KeyError')
>>> short(3), short(list(range(100)))
('3', 'a list object')
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral
from typing import Any

__all__ = ["first_line", "require", "require_integer", "require_one_of", "short"]


def first_line(err: BaseException) -> str:
    """The first non-empty line of ``err``'s message, or its type's name when it has none."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def short(value: Any) -> str:
    """``repr(value)`` when it is one short line, else what kind of object it is."""
    text = repr(value)
    return text if "\n" not in text and len(text) <= 80 else f"a {type(value).__name__} object"


def require(ok: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``ok`` (an argument's check: ``message`` says what to change)."""
    if not ok:
        raise ValueError(message)


def require_integer(name: str, value: Any, least: int | None = None) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer (a Python or numpy one, not a bool), at least ``least``.

    >>> require_integer("rounds", 2.5)
    Traceback (most recent call last):
    ...
    ValueError: rounds must be an integer, got 2.5
    """
    which = "an integer" if least is None else f"an integer of at least {least}"
    ok = isinstance(value, Integral) and not isinstance(value, bool) and (least is None or int(value) >= least)
    require(ok, f"{name} must be {which}, got {value!r}")


def require_one_of(name: str, value: Any, choices: Sequence[str]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``: ``<name> must be one of a, b, got 'c'``."""
    require(value in choices, f"{name} must be one of {', '.join(choices)}, got {value!r}")

r"""One-line messages: what an error says about a value or another error, on one line; and the arguments' checks.

The ``require_*`` checks refuse a constructor's argument when it is built, in one line that names the argument, says
what to give and shows the value: ``<name> must be <what>, got <value>``. They take Python's and numpy's scalars
(never a bool for a number, nor a number or a string for a bool) and return the value as Python's type.

>>> first_line(ValueError("bad value\nmore detail")), first_line(KeyError())
('bad value', 'KeyError')
>>> short(3), short(list(range(100)))
('3', 'a list object')
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any, overload

import numpy as np

__all__ = [
    "finite_number",
    "first_line",
    "require",
    "require_bool",
    "require_integer",
    "require_number",
    "require_one_of",
    "short",
]


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


def _or_none(what: str, optional: bool) -> str:
    return f"{what} (or None)" if optional else what


@overload
def require_integer(name: str, value: int, least: int | None = None, optional: bool = False) -> int: ...
@overload
def require_integer(name: str, value: Any, least: int | None = None, optional: bool = False) -> int | None: ...
def require_integer(name: str, value: Any, least: int | None = None, optional: bool = False) -> int | None:
    """``value`` as an ``int``, unless it is not an integer (a Python or numpy one, not a bool) of at least ``least``.

    ``optional``: ``None`` is accepted (and returned) too.

    >>> require_integer("rounds", 2.5)
    Traceback (most recent call last):
    ...
    ValueError: rounds must be an integer, got 2.5
    >>> require_integer("group_size", 0, least=1, optional=True)
    Traceback (most recent call last):
    ...
    ValueError: group_size must be an integer of at least 1 (or None), got 0
    """
    if optional and value is None:
        return None
    which = "an integer" if least is None else f"an integer of at least {least}"
    ok = isinstance(value, Integral) and not isinstance(value, bool) and (least is None or int(value) >= least)
    require(ok, f"{name} must be {_or_none(which, optional)}, got {short(value)}")
    return int(value)


def finite_number(value: Any) -> float | None:
    """``value`` as a ``float`` when it is a finite real number (a Python or numpy one, not a bool), else ``None``.

    >>> finite_number(0.5), finite_number("0.5"), finite_number(True), finite_number(float("nan"))
    (0.5, None, None, None)
    """
    if isinstance(value, bool | np.bool_) or not isinstance(value, Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


_RANGE = re.compile(r"^(?:([\[(])(\S+), (\S+)([\])])|(>=|>) (\S+))$")


@overload
def require_number(name: str, value: float, within: str = "", optional: bool = False, hint: str = "") -> float: ...
@overload
def require_number(name: str, value: Any, within: str = "", optional: bool = False, hint: str = "") -> float | None: ...
def require_number(name: str, value: Any, within: str = "", optional: bool = False, hint: str = "") -> float | None:
    """``value`` as a ``float``, unless it is not a finite number (Python's or numpy's, not a bool) ``within``.

    A number out of range is told the range (``<name> must be in (0, 1], got 0``), anything else that it must be a
    number (``<name> must be a number in (0, 1], got '0.5'``, ``a finite number > 0, got nan``).

    Args:
        name: the argument, as the message names it.
        value: what was given.
        within: the range, as the message says it: an interval (``"(0, 1]"``, ``"[0, 1)"``) or a bound (``"> 0"``,
            ``">= 0"``); empty for any finite number.
        optional: ``None`` is accepted (and returned) too.
        hint: what the message adds after the value (``; <hint>``), e.g. where else the option is spelt.

    >>> require_number("lr", 0.05, "> 0")
    0.05
    >>> require_number("momentum", 1, "[0, 1)")
    Traceback (most recent call last):
    ...
    ValueError: momentum must be in [0, 1), got 1
    >>> require_number("sample_ratio", "0.5", "(0, 1]")
    Traceback (most recent call last):
    ...
    ValueError: sample_ratio must be a number in (0, 1], got '0.5'
    >>> require_number("lr", float("nan"), "> 0")
    Traceback (most recent call last):
    ...
    ValueError: lr must be a finite number > 0, got nan
    """
    if optional and value is None:
        return None
    match = _RANGE.match(within)
    if within and match is None:
        raise ValueError(f"require_number: cannot read the range {within!r}")  # a mistake in fl_lightning's code
    number = finite_number(value)
    ok = number is not None and (match is None or _within(number, *match.groups()))
    interval = within[:1] in ("[", "(")
    if number is not None:  # out of range
        what = f"in {within}" if interval else within
    else:
        what = f"a number in {within}" if interval else f"a finite number {within}".rstrip()
    require(ok, f"{name} must be {_or_none(what, optional)}, got {short(value)}" + (f"; {hint}" if hint else ""))
    return number


def _within(number: float, opening: str, low: str, high: str, closing: str, bound: str, limit: str) -> bool:
    """Whether ``number`` is in ``_RANGE``'s interval (``opening low, high closing``) or ``bound limit``."""
    if bound:
        return number > float(limit) if bound == ">" else number >= float(limit)
    above = number > float(low) if opening == "(" else number >= float(low)
    return above and (number < float(high) if closing == ")" else number <= float(high))


@overload
def require_bool(name: str, value: bool, optional: bool = False) -> bool: ...
@overload
def require_bool(name: str, value: Any, optional: bool = False) -> bool | None: ...
def require_bool(name: str, value: Any, optional: bool = False) -> bool | None:
    """``value`` as a ``bool``, unless it is neither True nor False (Python's or numpy's); ``optional``: or ``None``.

    >>> require_bool("plots", "yes")
    Traceback (most recent call last):
    ...
    ValueError: plots must be True or False, got 'yes'
    """
    if optional and value is None:
        return None
    what = "True, False or None" if optional else "True or False"
    require(isinstance(value, bool | np.bool_), f"{name} must be {what}, got {short(value)}")
    return bool(value)


def require_one_of(name: str, value: Any, choices: Sequence[str]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``: ``<name> must be one of a, b, got 'c'``."""
    require(value in choices, f"{name} must be one of {', '.join(choices)}, got {value!r}")

r"""One-line messages: what an error says about a value or another error, on one line; and the arguments' checks.

The ``require_*`` checks refuse a constructor's argument when it is built, in one line that names the argument, says
what to give and shows the value: ``<name> must be <what>, got <value>``. They take Python's and numpy's scalars
(never a bool for a number, nor a number or a string for a bool) and return the value as Python's type.

>>> first_line(ValueError("bad value\nmore detail")), first_line(KeyError())
('bad value', 'KeyError')
>>> short(3), short(list(range(100)))
('3', 'a list object')

A setting a message tells the user to change is named in both spellings (:func:`option`, :func:`options`): the
command line's, and the Python argument it is (``--data.num_clients`` is ``FederatedDataModule(num_clients=...)``).
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
    "option",
    "options",
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


#: What each command-line group configures in Python (``--data.x`` is ``FederatedDataModule(x=...)``); a method's
#: options (``--model.x``) are its class's arguments, which :func:`option` names when it is told the class.
PYTHON_OWNERS = {
    "data": "FederatedDataModule",
    "federation": "Federation",
    "trainer": "L.Trainer",
    "model": "the method",
}


def _python(group: str, arguments: Sequence[str], owner: str | None) -> str:
    """The Python spelling of ``group``'s ``arguments`` (``name=value``): ``Owner(a=1, b=...)``, or the method's."""
    who = owner or PYTHON_OWNERS.get(group)
    if who is None:
        raise ValueError(f"option: no Python spelling for --{group}.*")  # a mistake in fl_lightning's code
    return f"the method's {', '.join(arguments)}" if who == "the method" else f"{who}({', '.join(arguments)})"


def options(*names: str, joint: str = ", ", owner: str | None = None, inside: bool = False) -> str:
    """Several options of one group in both spellings: ``--x.a, --x.b (in Python X(a=..., b=...))``.

    Args:
        names: the options as the command line spells them without the dashes (``"data.batch_size"``), all of one
            group (``data``, ``federation``, ``trainer`` or ``model``).
        joint: what stands between the command line's options (``" or "``: ``--x.a or --x.b``).
        owner: the Python class the options are arguments of, when the group's default is not it (a method's name:
            ``FedSSD(aux_per_class=...)`` rather than ``the method's aux_per_class=...``).
        inside: for a message that already opens a parenthesis: ``--x.a, in Python X(a=...)`` without its own.

    >>> options("data.batch_size", "data.eval_batch_size")
    '--data.batch_size, --data.eval_batch_size (in Python FederatedDataModule(batch_size=..., eval_batch_size=...))'
    >>> options("federation.rounds", "federation.sample_ratio", joint=" or ", inside=True)
    '--federation.rounds or --federation.sample_ratio, in Python Federation(rounds=..., sample_ratio=...)'
    """
    groups = {name.partition(".")[0] for name in names}
    if len(groups) != 1 or not all("." in name for name in names):
        raise ValueError(f"options: give options of one group, got {names}")  # a mistake in fl_lightning's code
    return _spelt(
        joint.join(f"--{name}" for name in names),
        _python(groups.pop(), [f"{name.partition('.')[2]}=..." for name in names], owner),
        inside,
    )


def option(name: str, value: object = None, *, owner: str | None = None, inside: bool = False) -> str:
    """One option in both spellings, the command line's and Python's: ``--x.y 5 (in Python X(y=5))``.

    Args:
        name: the option as the command line spells it without the dashes (``"data.holdout_per_class"``).
        value: the value to give, as Python's (the command line's ``true``/``false`` for a bool); None for none.
        owner: the Python class, when not the group's (:func:`options`): a method's name for a ``model`` option.
        inside: for a message that already opens a parenthesis: ``--x.y 5, in Python X(y=5)`` without its own.

    >>> option("data.holdout_per_class", 5)
    '--data.holdout_per_class 5 (in Python FederatedDataModule(holdout_per_class=5))'
    >>> option("federation.engine", "sequential")
    "--federation.engine sequential (in Python Federation(engine='sequential'))"
    >>> option("data.drop_last", False)
    '--data.drop_last false (in Python FederatedDataModule(drop_last=False))'
    >>> option("model.net"), option("model.aux_per_class", owner="FedSSD")
    ("--model.net (in Python the method's net=...)", '--model.aux_per_class (in Python FedSSD(aux_per_class=...))')
    >>> option("trainer.default_root_dir", inside=True)
    '--trainer.default_root_dir, in Python L.Trainer(default_root_dir=...)'
    """
    group, _, argument = name.partition(".")
    if not argument:
        raise ValueError(f"option: {name!r} names no group")  # a mistake in fl_lightning's code
    if isinstance(value, np.generic):  # numpy's scalar as Python's (``5``, not ``np.int64(5)``)
        value = value.item()
    if value is None:
        return _spelt(f"--{name}", _python(group, [f"{argument}=..."], owner), inside)
    given = str(value).lower() if isinstance(value, bool) else str(value)
    return _spelt(f"--{name} {given}", _python(group, [f"{argument}={value!r}"], owner), inside)


def _spelt(command_line: str, python: str, inside: bool) -> str:
    return f"{command_line}, in Python {python}" if inside else f"{command_line} (in Python {python})"


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

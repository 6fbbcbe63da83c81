"""The tables that name extension points (methods, datasets, networks, partitions, server optimizers).

A :class:`Registry` is a ``dict`` from a name to an entry that checks what is put in it: a name already taken is
refused (replacing a built-in is a ``del`` away, never an accident), and so is an entry of the wrong kind, each with
one line that says what to change, when it is registered rather than when some later run looks it up.

>>> table = Registry("SQUARES", lambda name, entry: None if callable(entry) else f"must be callable, got {entry!r}")
>>> table["square"] = lambda x: x * x
>>> table["square"](3)
9
>>> table["square"] = abs
Traceback (most recent call last):
...
ValueError: SQUARES already has 'square'; register another name, or `del SQUARES['square']` first to replace it
>>> table["cube"] = 3
Traceback (most recent call last):
...
TypeError: SQUARES['cube'] must be callable, got 3
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from fl_lightning.core.messages import short

__all__ = ["Registry", "import_path", "named_subclass"]

_Entry = TypeVar("_Entry")


class Registry(dict[str, _Entry]):
    """A name → entry table that refuses a name already taken and an entry ``check`` finds wrong.

    Args:
        table: the table's name, for messages (``"PARTITIONERS"``).
        check: ``check(name, entry)`` → what is wrong with ``entry`` under ``name``, as the end of a sentence that
            starts "``TABLE[name]``" ("must be callable, got 3"), or ``None``.
        entries: the built-in entries.
    """

    def __init__(
        self,
        table: str,
        check: Callable[[str, Any], str | None],
        entries: Mapping[str, _Entry] | Iterable[tuple[str, _Entry]] = (),
    ) -> None:
        super().__init__()
        self.table, self.check = table, check
        self.update(entries)

    def __setitem__(self, name: str, entry: _Entry) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.table} names are non-empty strings, got {name!r}")
        if name in self and self[name] is not entry:
            raise ValueError(
                f"{self.table} already has {name!r}; register another name, or `del {self.table}[{name!r}]` first to "
                "replace it"
            )
        problem = self.check(name, entry)
        if problem is not None:
            raise TypeError(f"{self.table}[{name!r}] {problem}")
        super().__setitem__(name, entry)

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Register each entry, as ``self[name] = entry`` does."""
        for name, entry in dict(*args, **kwargs).items():
            self[name] = entry

    def __ior__(self, other: Any) -> Registry[_Entry]:  # type: ignore[override,misc]
        self.update(other)
        return self

    def setdefault(self, name: str, entry: _Entry) -> _Entry:
        """The entry under ``name``, registering ``entry`` there first if there is none."""
        if name not in self:
            self[name] = entry
        return self[name]

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.table, self.check, dict(self)))


class named_subclass:  # noqa: N801  (used as a function: ``named_subclass(FedAvg, "method_name")``)
    """A :class:`Registry` check: the entry is a subclass of ``base`` whose ``attribute`` (if set) is its name.

    ``attribute`` is the class constant the entry's results are recorded under (a method's ``method_name``): a
    registered name that differs would make the same class answer to two names.
    """

    def __init__(self, base: type, attribute: str | None = None) -> None:
        self.base, self.attribute = base, attribute

    def __call__(self, name: str, entry: Any) -> str | None:
        """What is wrong with ``entry`` under ``name``, if anything."""
        if not (isinstance(entry, type) and issubclass(entry, self.base)):
            return f"must be a subclass of {self.base.__name__} (the class itself, not an instance), got {short(entry)}"
        recorded = getattr(entry, self.attribute, None) if self.attribute else None
        if recorded and recorded != name:
            return f"must be registered under its {self.attribute} {recorded!r} (or set {self.attribute} = {name!r})"
        return None


def import_path(path: str) -> Any | None:
    """The object a dotted path names (a config's ``class_path``), or None where it names none that imports.

    >>> import_path("collections.OrderedDict").__name__, import_path("nowhere.Thing"), import_path("FedAvg")
    ('OrderedDict', None, None)
    """
    module, _, name = path.rpartition(".")
    if not module:
        return None
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None

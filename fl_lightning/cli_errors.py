"""One-line messages for the command line's errors: what a user must change, without jsonargparse's nesting."""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import sys

from jsonargparse import ArgumentError

__all__ = ["one_line"]


def one_line(err: BaseException) -> str:
    """An exception as one line: its first line, with a parser's key and reason joined."""
    text = str(err).strip() or type(err).__name__
    class_path = _class_path_reason(text)
    if class_path is not None:
        return class_path
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    linked = re.match(r"Call to compute_fn of link '[^']*' with args \(.*?\) failed: (.+)", lines[0])
    if linked is not None:  # a link's own refusal (cli_args.fixed_seed): its message alone
        return linked.group(1)
    union = next((i for i, ln in enumerate(lines) if ln.startswith("Does not validate against any of the Union")), None)
    if union is not None:
        nested = _class_argument_reason(text)
        if nested is not None:
            return nested
        # jsonargparse wraps the class's own error among one line per union member; keep the class's.
        key = _parser_line(lines[:union]) if union else ""
        for i, ln in enumerate(lines[union:], union):
            if ln.startswith("- ") and "Expected a <class" not in ln:
                reason = ln[2:] + (" " + lines[i + 1] if ln.endswith(":") and i + 1 < len(lines) else "")
                return f"{key.rstrip(':')}: {reason}" if key else reason
        # Every member only says "Expected a <class 'X'>": name the types and the value given.
        types = [ln.split("'")[1] for ln in lines[union:] if ln.startswith("- Expected a <class '")]
        given = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Given value:")), None)
        name = lines[0].split('"')[1] if lines[0].startswith("Parser key") and '"' in lines[0] else ""
        if name and types:
            return f"--{name}: {_expected_types(types, given or '')}"
        return lines[0]
    if isinstance(err, ArgumentError) or type(err).__name__ == "ArgumentError":
        return _parser_line(lines)
    waited = re.search(r"Timed out waiting (\d+)ms for \w+ operation", text)  # gloo's process-group timeout
    if waited is not None:
        return (
            f"another process did not answer within {int(waited.group(1)) / 1000:g}s (a node that stopped, froze or "
            "is far slower than this one): check every node, or raise --federation.process_timeout"
        )
    if isinstance(err, FileNotFoundError) and len(lines) > 1:
        return " ".join(lines)  # the searched paths and how to get the data belong to the one message
    return lines[0]


def _class_path_reason(text: str) -> str | None:
    """A class path that cannot be used for an option (``--model mypkg.MyModule``) as ``--<key>: <the real reason>``.

    jsonargparse first tries the value as a config file ("Expected a path but ... either not accessible or invalid")
    and puts the real reason below it: the class does not import, or it is not a subclass of the option's base class.
    Only a class path given to the option itself is handled here; one among a class's arguments is
    :func:`_class_argument_reason`'s. None when the error is not about such a class path.
    """
    if len(re.findall(r'Parser key "', text)) != 1 or not text.startswith("Parser key"):
        return None
    key = text.split('"')[1]
    wrong = re.search(r"Import path (?:(\S+) )?does not correspond to a subclass of (\w+)", text)
    if wrong is not None:
        given = re.search(r"^\s*Given value: (\S+)\s*$", text, re.M)
        path = wrong.group(1) or (given.group(1) if given else "the class")
        return f"--{key}: {path} is not a {wrong.group(2)}"
    problem = re.search(r"Problem with given class_path '([^']+)'", text)
    reason = _import_error(problem.group(1)) if problem is not None else None
    if problem is None or not reason:
        return None
    return f"--{key}: cannot import {problem.group(1)}: {reason}{_importable_as(problem.group(1), key)}"


def _importable_as(class_path: str, key: str) -> str:
    """``; did you mean fl_lightning.methods.FedNTD (or just FedNTD)?`` for a class that lies in another module.

    The classes of that name in the public modules of the path's package that are imported already
    (``fl_lightning.FedNTD``: those under ``fl_lightning``), each by its shortest path, at most three; a method is also
    taken by its name alone (``--model FedNTD``). Empty when there is none.
    """
    package, name = class_path.split(".", 1)[0], class_path.rpartition(".")[2]
    paths: dict[type, str] = {}
    for loaded, mod in sorted(sys.modules.items(), key=lambda item: (len(item[0]), item[0])):
        public = not any(part.startswith("_") for part in loaded.split("."))
        if public and (loaded == package or loaded.startswith(f"{package}.")):
            cls = vars(mod).get(name)  # the module's own names: no lazy import
            if isinstance(cls, type):
                paths.setdefault(cls, f"{loaded}.{name}")
    if not paths:
        return ""
    from fl_lightning.methods import METHODS  # the methods are loaded: the command line imports them

    found = sorted(paths.values(), key=lambda path: (len(path), path))[:3]
    method = key == "model" and any(cls in METHODS.values() for cls in paths)
    listed = found[0] if len(found) == 1 else f"{', '.join(found[:-1])} or {found[-1]}"
    return f"; did you mean {listed}{f' (or just {name})' if method else ''}?"


def _import_error(class_path: str) -> str | None:
    """Why ``class_path`` (``package.module.Class``) cannot be imported, in one line; None when it can."""
    module, _, name = class_path.rpartition(".")
    try:
        getattr(importlib.import_module(module), name)
    except Exception as err:  # whatever the user's module raises on import is the reason
        return (str(err).strip().splitlines() or [type(err).__name__])[0]
    return None


def _class_argument_reason(text: str) -> str | None:
    """A bad value among a class's arguments (``--model.lr abc``), at any depth, as ``--<key>: <reason>``.

    jsonargparse nests the reason under the class's key, its class path and the argument's key, indented; the keys
    on the way make the option's name and the innermost line is the reason. None when the error is not about a
    class's arguments.
    """
    nodes: list[tuple[str, list]] = []
    stack: list[tuple[int, list]] = [(-1, nodes)]
    for raw in text.splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        node: tuple[str, list] = (raw.strip(), [])
        while stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].append(node)
        stack.append((indent, node[1]))
    keys: list[str] = []
    through_class: list[str] = []

    def innermost(level: list[tuple[str, list]]) -> str | None:
        for line, children in level:
            line = line[2:] if line.startswith("- ") else line
            if line.startswith("Parser key") and '"' in line:
                keys.append(line.split('"')[1])
                rest = line.split('":', 1)[1].strip() if '":' in line else ""
                return rest or innermost(children)
            if line.startswith("Problem with given class_path"):
                through_class.append(line.split("'")[1] if "'" in line else "")
                return innermost(children) or line
            if line == "Errors:":
                real = [b for b in children if not re.fullmatch(r"(- )?Expected a <class '[^']*'>", b[0])]
                if real:
                    return innermost(real[:1])
                # Every member of an optional type only says "Expected a <class 'X'>": name them and the value.
                types = [b[0].split("'")[1] for b in children if "'" in b[0]]
                given = next((ln.split(":", 1)[1].strip() for ln, _ in level if ln.startswith("Given value:")), None)
                return _expected_types(types, given) if types and given is not None else None
            if line.startswith(("Subtypes:", "Given value", "Does not validate against any of the Union")):
                continue
            return line
        return None

    reason = innermost(nodes)
    if not through_class or reason is None or not keys:
        return None
    unknown = re.fullmatch(r"Option '(\w+)' is not accepted", reason)
    if unknown is not None:
        return _unknown_option(keys, through_class[-1], unknown.group(1))
    required = re.fullmatch(r"the following arguments are required: (\w+(?:, \w+)*)", reason)
    if required is not None:  # a class of your own needs arguments: say how to give them
        prefix = "--" + ".".join(keys)
        given = " ".join(f"{prefix}.init_args.{name} <value>" for name in required.group(1).split(", "))
        return f"{prefix}: {reason}; give {given}"
    missing = re.fullmatch(r"module '[\w.]+' has no attribute '\w+'", reason)
    hint = _importable_as(through_class[-1], ".".join(keys)) if missing else ""
    return f"--{'.'.join(keys)}: {_expected(reason)}{hint}"


_NOT_FINITE = ("nan", ".nan", "inf", "+inf", "-inf", ".inf", "-.inf", "infinity", "-infinity")


def _expected(reason: str) -> str:
    """A parser's reason ``Expected a <class 'float'>. Got value: x`` as ``expected float, got 'x'``.

    >>> _expected("Expected a <class 'float'>. Got value: nan")
    "expected a finite float, got 'nan' (not a number)"
    >>> _expected("Expected a <class 'float'>. Got value: -inf")
    "expected a finite float, got '-inf' (infinite)"
    """
    found = re.fullmatch(r"Expected a <class '([^']*)'>\. Got value: (.*)", reason)
    if found is None:
        return reason
    kind, value = found.groups()
    if kind == "float" and value.strip().lower() in _NOT_FINITE:
        return f"expected a finite float, got {value!r} ({'not a number' if 'nan' in value.lower() else 'infinite'})"
    return f"expected {kind}, got {value!r}"


def _expected_types(types: list[str], value: str) -> str:
    """``expected float or None, got 'x'``; a float's nan or inf is named as such.

    >>> _expected_types(["float", "NoneType"], "nan")
    "expected a finite float or None, got 'nan' (not a number)"
    >>> _expected_types(["int", "NoneType"], "abc")
    "expected int or None, got 'abc'"
    """
    names = ["None" if t == "NoneType" else t for t in types]
    if "float" in names and value.strip().lower() in _NOT_FINITE:
        others = "".join(f" or {n}" for n in names if n != "float")
        why = "not a number" if "nan" in value.lower() else "infinite"
        return f"expected a finite float{others}, got {value!r} ({why})"
    return f"expected {' or '.join(names)}, got {value!r}"


def _unknown_option(keys: list[str], class_path: str, name: str) -> str:
    """``--model.lrr`` as ``--model.lrr: FedAvg has no option lrr; did you mean --model.lr?``."""
    module, _, attr = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
        options = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    except Exception:  # a class that cannot be inspected: no suggestion
        options = []
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    prefix = "--" + ".".join(keys)
    hint = f"; did you mean {prefix}.{close[0]}?" if close else ""
    if not close and keys == ["model"]:
        hint = _other_methods_option(name, attr)
    return f"{prefix}.{name}: {attr or class_path} has no option {name}{hint}"


def _other_methods_option(name: str, current: str) -> str:
    """``; it is an option of FedNTD: give --model <method> before its options`` when other methods take ``name``."""
    from fl_lightning.methods import METHODS

    owners = sorted(
        {
            cls.__name__
            for cls in METHODS.values()
            if cls.__name__ != current and name in inspect.signature(cls).parameters
        }
    )
    if not owners:
        return ""
    return f"; it is an option of {', '.join(owners)}: give --model <method> before its options"


def _parser_line(lines: list[str]) -> str:
    """A jsonargparse error (key line, then nested reasons) as ``<key>: <first reason>``."""
    first = lines[0]
    key = ""
    if first.startswith(("Parser key", "Problem with given class_path")):
        key = first.split('"')[1] if '"' in first else ""
        reasons = [ln.lstrip("- ") for ln in lines[1:] if not ln.startswith(("Given value type", "Subclass types"))]
        reason = reasons[0] if reasons else first
        if reason.startswith(f'Parser key "{key}": '):
            reason = reason.split('": ', 1)[1]
        return f"--{key}: {_expected(reason)}" if key else reason
    return first

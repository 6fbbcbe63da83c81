"""The command line: ``python cli.py fit --config configs/<name>.yaml`` (LightningCLI) or ``python cli.py compare``.

``fit``/``validate``/``test`` go to fl_lightning's LightningCLI (:mod:`fl_lightning.lightning_cli`), ``compare`` to
:mod:`fl_lightning.compare`; this module turns how they end into an exit code and a one-line message.

Exit codes: 0 completed, 1 failed (an error during the run), 2 bad input or a refused run directory, 3 diverged,
4 interrupted (Ctrl-C, SIGTERM). An error prints one line ``error: ...``; ``--debug`` (or ``FL_LIGHTNING_DEBUG=1``)
shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import yaml
from jsonargparse import ArgumentError
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from fl_lightning import compare
from fl_lightning.lightning_cli import RUNNING, cli_main, resolve_config

__all__ = ["EXIT_CODES", "cli_main", "main", "one_line", "resolve_config", "run"]

#: Exit code of each way a run can end (README "Statuses and exit codes").
EXIT_CODES: dict[str, int] = {"completed": 0, "failed": 1, "bad input": 2, "diverged": 3, "interrupted": 4}
_FLAGS = ("--debug", "--overwrite")


def one_line(err: BaseException) -> str:
    """An exception as one line: its first line, with a parser's key and reason joined."""
    text = str(err).strip() or type(err).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    union = next((i for i, ln in enumerate(lines) if ln.startswith("Does not validate against any of the Union")), None)
    if union is not None:
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
            names = ["None" if t == "NoneType" else t for t in types]
            return f"--{name}: expected {' or '.join(names)}, got {given!r}"
        return lines[0]
    if isinstance(err, ArgumentError) or type(err).__name__ == "ArgumentError":
        return _parser_line(lines)
    if isinstance(err, FileNotFoundError) and len(lines) > 1:
        return " ".join(lines)  # the searched paths and how to get the data belong to the one message
    return lines[0]


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
        return f"--{key}: {reason}" if key else reason
    return first


def _exit_code_of_run() -> int:
    """The exit code that the finished fit's ``summary.json`` status calls for."""
    run_dir = RUNNING.get("run_dir")
    summary = Path(run_dir) / "summary.json" if run_dir is not None else None
    if summary is None or not summary.exists():
        return EXIT_CODES["failed"]
    try:
        status = str(yaml.safe_load(summary.read_text()).get("status"))
    except (OSError, yaml.YAMLError, AttributeError):
        return EXIT_CODES["failed"]
    return EXIT_CODES.get(status, EXIT_CODES["failed"])


def _error(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return code


def run(args: list[str], overwrite: bool = False, debug: bool = False) -> int:
    """Run ``fit``/``validate``/``test`` and return the process exit code (:data:`EXIT_CODES`)."""
    RUNNING.update(run_dir=None, fitting=False)
    try:
        cli = cli_main(args, overwrite=overwrite)
    except SIGTERMException:
        if debug:
            traceback.print_exc()
        return _error("stopped by SIGTERM; resume the run with --ckpt_path last", EXIT_CODES["interrupted"])
    except KeyboardInterrupt:
        return _error("interrupted before training started", EXIT_CODES["interrupted"])
    except SystemExit as stop:
        if stop.code in (0, None):
            return 0  # --help, --print_config
        if RUNNING["fitting"]:  # Lightning turns Ctrl-C into exit(1) after recording the run
            return _error("interrupted; resume the run with --ckpt_path last", EXIT_CODES["interrupted"])
        return int(stop.code) if isinstance(stop.code, int) else 1
    except (ArgumentError, ValueError, TypeError, FileNotFoundError, MisconfigurationException) as err:
        if debug:
            raise
        return _error(one_line(err), EXIT_CODES["bad input"])
    except Exception as err:
        if debug:
            raise
        return _error(f"{type(err).__name__}: {one_line(err)}", EXIT_CODES["failed"])
    if cli.subcommand != "fit":
        return 0
    return _exit_code_of_run()


def main(argv: list[str] | None = None) -> None:
    """``fit``/``validate``/``test`` go to LightningCLI; ``compare`` runs a comparison (fl_lightning.compare).

    ``--debug`` (anywhere) or ``FL_LIGHTNING_DEBUG=1`` shows tracebacks; ``--overwrite`` replaces a finished run.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("FL_LIGHTNING_DEBUG", "") not in ("", "0")
    overwrite = "--overwrite" in args
    args = [a for a in args if a not in _FLAGS]
    if args and args[0] == "compare":
        try:
            sys.exit(compare.main(args[1:]))
        except (ValueError, TypeError, FileNotFoundError) as err:
            if debug:
                raise
            sys.exit(_error(one_line(err), EXIT_CODES["bad input"]))
    sys.exit(run(args, overwrite=overwrite, debug=debug))


if __name__ == "__main__":
    main()

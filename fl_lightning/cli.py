"""The command line: ``python cli.py fit --config configs/<name>.yaml`` (LightningCLI) or ``python cli.py compare``.

``fit``/``test`` go to fl_lightning's LightningCLI (:mod:`fl_lightning.lightning_cli`), ``compare`` to
:mod:`fl_lightning.experiments.compare`; this module turns how they end into an exit code and a one-line message.

Exit codes: 0 completed, 1 failed (an error during the run), 2 bad input or a refused run directory, 3 diverged,
4 interrupted (Ctrl-C, SIGTERM). An error prints one line ``error: ...``; ``--debug`` (or ``FL_LIGHTNING_DEBUG=1``)
shows the traceback instead. A signal at any moment ends the command with one status and its exit code: before
training starts nothing is recorded (4), during the rounds the run is ``interrupted`` (4), and once the run has ended
(the final files are written with signals held) its own status stands.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from pathlib import Path

import yaml
from jsonargparse import ArgumentError
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from fl_lightning import __version__, shipped_configs
from fl_lightning.cli_errors import one_line
from fl_lightning.experiments import compare
from fl_lightning.lightning_cli import RUNNING, SUBCOMMAND_HELP, cli_main, resolve_config

__all__ = ["EXIT_CODES", "cli_main", "main", "one_line", "resolve_config", "run"]

#: Exit code of each way a run can end (README "Statuses and exit codes").
EXIT_CODES: dict[str, int] = {"completed": 0, "failed": 1, "bad input": 2, "diverged": 3, "interrupted": 4}
_FLAGS = ("--debug", "--overwrite")


def _summary_file() -> Path | None:
    run_dir = RUNNING.get("run_dir")
    return Path(run_dir) / "summary.json" if run_dir is not None else None


def _summary_stamp() -> tuple[int, int] | None:
    """When and how big the fit's ``summary.json`` is (None when absent): tells this fit's summary from an older one."""
    try:
        stat = _summary_file().stat()  # type: ignore[union-attr]
    except (AttributeError, OSError):
        return None
    return stat.st_mtime_ns, stat.st_size


def _run_status() -> str | None:
    """The status in the fit's ``summary.json`` (None when it has none)."""
    summary = _summary_file()
    if summary is None or not summary.exists():
        return None
    try:
        return str(yaml.safe_load(summary.read_text()).get("status"))
    except (OSError, yaml.YAMLError, AttributeError):
        return None


def _exit_code_of_run() -> int:
    """The exit code that the finished fit's ``summary.json`` status calls for."""
    return EXIT_CODES.get(_run_status() or "failed", EXIT_CODES["failed"])


def _stopped(how: str) -> int:
    """The exit code, and its line, of a fit stopped by a signal (``how``: "stopped by SIGTERM", "interrupted")."""
    status = _run_status() if RUNNING.get("fitting") and _summary_stamp() != RUNNING.get("summary_stamp") else None
    if status in ("completed", "failed", "diverged"):
        return EXIT_CODES[status]  # the run had ended, and said so, before the signal took effect
    if status is None:
        message = f"{how} before training started; nothing was recorded: run the same command again"
        return _error(message, EXIT_CODES["interrupted"])
    return _error(f"{how}; resume the run with --ckpt_path last", EXIT_CODES["interrupted"])


def _raise_sigterm(signum: int, frame: object) -> None:
    """SIGTERM outside the training loop (start-up, the end) stops the command like Ctrl-C.

    During the rounds Lightning's own handler, which calls this one too, stops the fit at the end of the step.
    """
    if signal.getsignal(signal.SIGTERM) is _raise_sigterm:
        raise SIGTERMException()


def _error(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return code


def run(args: list[str], overwrite: bool = False, debug: bool = False) -> int:
    """Run ``fit``/``test`` and return the process exit code (:data:`EXIT_CODES`)."""
    RUNNING.update(run_dir=None, fitting=False, summary_stamp=None)
    main_thread = threading.current_thread() is threading.main_thread()
    # Lightning ignores Ctrl-C while it shuts a fit down and may leave it so: restored, with SIGTERM, at the end.
    previous = (signal.getsignal(signal.SIGINT), signal.signal(signal.SIGTERM, _raise_sigterm)) if main_thread else None
    try:
        cli = cli_main(args, overwrite=overwrite)
    except SIGTERMException:
        if debug:
            traceback.print_exc()
        return _stopped("stopped by SIGTERM")
    except KeyboardInterrupt:
        return _stopped("interrupted")
    except SystemExit as stop:
        if stop.code in (0, None):
            return 0  # --help, --print_config
        if RUNNING["fitting"]:  # Lightning turns Ctrl-C into exit(1) after recording the run
            return _stopped("interrupted")
        return int(stop.code) if isinstance(stop.code, int) else 1
    except (ArgumentError, ValueError, TypeError, FileNotFoundError, MisconfigurationException) as err:
        if debug:
            raise
        return _error(one_line(err), EXIT_CODES["bad input"])
    except Exception as err:
        if debug:
            raise
        return _error(f"{type(err).__name__}: {one_line(err)}", EXIT_CODES["failed"])
    finally:
        if previous is not None:
            for signum, handler in zip((signal.SIGINT, signal.SIGTERM), previous, strict=True):
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    if cli.subcommand != "fit":
        return 0
    return _exit_code_of_run()


#: Every command of ``fl-lightning``, with what it does (``fl-lightning --help``).
COMMANDS = {
    **SUBCOMMAND_HELP,
    "compare": "Run methods x seeds x settings from a YAML (each an ordinary fit) and write the papers' tables and "
    "plots.",
    "configs": "List the configs that ship with fl_lightning, print one, or copy them into a folder to edit.",
    "claims": "Write the papers' claims beside fl_lightning's results (results/claims/claims.md) and refresh README's "
    "generated tables.",
}


def usage() -> str:
    """``fl-lightning --help``: every command with a line saying what it does."""
    width = max(map(len, COMMANDS))
    lines = [
        f"usage: fl-lightning {{{','.join(COMMANDS)}}} ...",
        "",
        "fl_lightning: federated learning on non-IID data with PyTorch Lightning.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()),
        "",
        "Run `fl-lightning <command> --help` for a command's options. For example:",
        "  fl-lightning fit --config quickstart                      # FedAvg on digits, no download",
        "  fl-lightning fit --config quickstart --model fedntd --federation.rounds 5",
        "  fl-lightning compare --config compare/fmnist_shard2_seeds --dry-run",
        "  fl-lightning configs                                      # the shipped configs, by name",
        "--debug (anywhere) shows the traceback of an error; --overwrite replaces a finished run (fit).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Run one command: ``fit``/``test`` (LightningCLI), ``compare`` or ``configs``; else print :func:`usage`.

    ``compare`` runs a comparison (fl_lightning.experiments.compare), ``configs`` lists the shipped configs
    (fl_lightning.shipped_configs); nothing, ``-h`` or ``--help`` prints :func:`usage`.

    ``--debug`` (anywhere) or ``FL_LIGHTNING_DEBUG=1`` shows tracebacks; ``--overwrite`` replaces a finished run.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("FL_LIGHTNING_DEBUG", "") not in ("", "0")
    overwrite = "--overwrite" in args
    args = [a for a in args if a not in _FLAGS]
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        sys.exit(0)
    if args[0] == "--version":
        print(f"fl_lightning {__version__}")
        sys.exit(0)
    if args[0] == "configs":
        try:
            sys.exit(shipped_configs.main(args[1:]))
        except FileNotFoundError as err:
            if debug:
                raise
            sys.exit(_error(one_line(err), EXIT_CODES["bad input"]))
    if args[0] == "claims":
        from fl_lightning.experiments import claims

        try:
            sys.exit(claims.main(args[1:]))
        except (ValueError, FileNotFoundError) as err:
            if debug:
                raise
            sys.exit(_error(one_line(err), EXIT_CODES["bad input"]))
    if args and args[0] == "compare":
        try:
            sys.exit(compare.main(args[1:]))
        except (ValueError, TypeError, FileNotFoundError) as err:
            if debug:
                raise
            sys.exit(_error(one_line(err), EXIT_CODES["bad input"]))
        except KeyboardInterrupt:
            if debug:
                raise
            message = "compare interrupted; run the same command again to continue (finished runs are kept)"
            sys.exit(_error(message, EXIT_CODES["interrupted"]))
    sys.exit(run(args, overwrite=overwrite, debug=debug))


if __name__ == "__main__":
    main()

"""The command line: ``python cli.py fit --config configs/<name>.yaml`` (LightningCLI) or ``python cli.py compare``.

``fit``/``test`` go to fl_lightning's LightningCLI (:mod:`fl_lightning.lightning_cli`), ``compare`` to
:mod:`fl_lightning.experiments.compare`; this module turns how they end into an exit code and a one-line message.

Exit codes: 0 completed, 1 failed (an error during the run), 2 bad input or a refused run directory, 3 diverged,
4 interrupted (Ctrl-C, SIGTERM). An error prints one line ``error: ...``; ``--debug`` (or ``FL_LIGHTNING_DEBUG=1``)
shows the traceback as well, with the same exit code. A signal at any moment ends the command with one status and its
exit code: before training starts, from the first line of :func:`main` on (Lightning and torch are imported after the
signal handlers are in place), nothing is recorded (4); during the rounds the run is ``interrupted`` (4); and once the
run has ended (the final files are written with signals held, and from then on the process ignores SIGINT and SIGTERM
until it exits) its own status stands.

Importing this module loads neither Lightning nor torch: :func:`main` does, once its signal handlers are in place.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import traceback
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fl_lightning import __version__
from fl_lightning.core.faults import restore_signal_handlers, signal_handlers

if TYPE_CHECKING:
    from fl_lightning.cli_errors import one_line
    from fl_lightning.lightning_cli import cli_main, resolve_config

__all__ = ["EXIT_CODES", "cli_main", "main", "one_line", "resolve_config", "run"]

#: Names this module offers from the modules that load Lightning, imported on first use (PEP 562).
_LAZY = {
    "cli_main": "fl_lightning.lightning_cli",
    "resolve_config": "fl_lightning.lightning_cli",
    "one_line": "fl_lightning.cli_errors",
}


def __getattr__(name: str) -> Any:
    """``cli_main``, ``resolve_config`` and ``one_line``, imported on first use."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fl_lightning.cli' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


#: Exit code of each way a run can end (README "Statuses and exit codes").
EXIT_CODES: dict[str, int] = {"completed": 0, "failed": 1, "bad input": 2, "diverged": 3, "interrupted": 4}
_FLAGS = ("--debug", "--overwrite")

#: Whether this process is the command itself (:func:`main`), which ends when the command does: from the moment its
#: outcome is decided it ignores SIGINT and SIGTERM (:func:`_hold_signals`). :func:`run` called from Python restores
#: the handlers it found instead.
_PROCESS: dict[str, bool] = {"main": False}


class _Terminated(BaseException):  # noqa: N818  (a signal, not an error)
    """SIGTERM while the command starts (imports, before :func:`run` installs its own handler)."""


def _running() -> dict[str, Any]:
    """The fit's state (:data:`fl_lightning.lightning_cli.RUNNING`), or an empty one before Lightning is imported."""
    module = sys.modules.get("fl_lightning.lightning_cli")
    return module.RUNNING if module is not None else {}


def _summary_file() -> Path | None:
    run_dir = _running().get("run_dir")
    return Path(run_dir) / "summary.json" if run_dir is not None else None


def _summary_stamp() -> tuple[int, int] | None:
    """When and how big the fit's ``summary.json`` is (None when absent): tells this fit's summary from an older one."""
    summary = _summary_file()
    try:
        stat = summary.stat() if summary is not None else None
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size) if stat is not None else None


def _run_status() -> str | None:
    """The status in the fit's ``summary.json`` (None when it has none)."""
    import yaml

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


def _this_fit_status() -> str | None:
    """The status this fit wrote into its ``summary.json`` (None before it wrote one)."""
    running = _running()
    return _run_status() if running.get("fitting") and _summary_stamp() != running.get("summary_stamp") else None


def _stopped(how: str) -> int:
    """The exit code, and its line, of a fit stopped by a signal (``how``: "stopped by SIGTERM", "interrupted")."""
    status = _this_fit_status()
    if status in ("completed", "failed", "diverged"):
        return EXIT_CODES[status]  # the run had ended, and said so, before the signal took effect
    if status is None:
        message = f"{how} before training started; nothing was recorded: run the same command again"
        return _error(message, EXIT_CODES["interrupted"])
    return _error(f"{how}; resume the run with --ckpt_path last", EXIT_CODES["interrupted"])


def _raise_sigterm(signum: int, frame: object) -> None:
    """SIGTERM outside the training loop (start-up, the end) stops the command like Ctrl-C.

    During the rounds Lightning's own handler, which calls this one too, stops the fit at the end of the step. In the
    command's own process the first SIGTERM is the one that counts: later ones are ignored while it takes effect.
    """
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    if signal.getsignal(signal.SIGTERM) is _raise_sigterm:
        if _PROCESS["main"]:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SIGTERMException()


def _start_up_sigterm(signum: int, frame: object) -> None:
    """SIGTERM while the command imports Lightning and torch: stop it as before training (no traceback)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Terminated()


def _hold_signals() -> None:
    """Ignore SIGINT and SIGTERM from now until the process exits: its outcome is decided (final writes, atexit)."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


def _error(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return code


def _bad_input_types() -> tuple[type[BaseException], ...]:
    """The exceptions that mean bad input (exit 2): a parser's, a value's, a missing file, Lightning's refusals."""
    from jsonargparse import ArgumentError
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    return (ArgumentError, ValueError, TypeError, FileNotFoundError, MisconfigurationException)


def run(args: list[str], overwrite: bool = False, debug: bool = False) -> int:
    """Run ``fit``/``test`` and return the process exit code (:data:`EXIT_CODES`).

    With ``debug`` an error is raised (its traceback shown) instead of being turned into its line and exit code.
    """
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from fl_lightning.cli_errors import one_line
    from fl_lightning.lightning_cli import RUNNING, cli_main

    RUNNING.update(run_dir=None, fitting=False, summary_stamp=None)
    # Lightning ignores Ctrl-C while it shuts a fit down and may leave it so: restored, with SIGTERM, at the end.
    previous = signal_handlers()
    if previous is not None:
        signal.signal(signal.SIGTERM, _raise_sigterm)
    returned = False
    try:
        cli = cli_main(args, overwrite=overwrite)
        returned = True
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
    except _bad_input_types() as err:
        if debug:
            raise
        if _this_fit_status() == "failed":  # an error during the rounds, recorded as the run's failure
            return _error(f"{type(err).__name__}: {one_line(err)}", EXIT_CODES["failed"])
        return _error(one_line(err), EXIT_CODES["bad input"])
    except Exception as err:
        if debug:
            raise
        return _error(f"{type(err).__name__}: {one_line(err)}", EXIT_CODES["failed"])
    finally:
        if _PROCESS["main"]:
            _hold_signals()
        else:
            restore_signal_handlers(previous)
        if not returned:  # failed or interrupted: the other processes are not coming to the end's barrier
            from fl_lightning.core.distributed import leave_process_group

            leave_process_group()
    from fl_lightning.core.distributed import end_process_group

    end_process_group()
    if cli.subcommand != "fit":
        return 0
    if cli.trainer.global_rank != 0:  # only rank 0 writes summary.json; the others hold its status
        from fl_lightning.federation import Federation

        statuses = [cb.status for cb in cli.trainer.callbacks if isinstance(cb, Federation)]  # type: ignore[attr-defined]
        return EXIT_CODES.get(statuses[0] if statuses else "completed", EXIT_CODES["failed"])
    if _this_fit_status() is None:  # Lightning ended the fit before on_train_start: nothing ran, nothing was written
        why = "a callback asked it to, e.g. --trainer.max_time already spent"
        return _error(f"the fit stopped before its first round ({why}); nothing was recorded", EXIT_CODES["failed"])
    return _exit_code_of_run()


#: The commands that are not LightningCLI's, with what they do (``fl-lightning --help``).
OTHER_COMMANDS = {
    "compare": "Run methods x seeds x settings from a YAML (each an ordinary fit) and write the papers' tables and "
    "plots.",
    "configs": "List the configs that ship with fl_lightning, print one, or copy them into a folder to edit.",
    "claims": "Write the papers' claims beside fl_lightning's results (results/claims/claims.md) and refresh README's "
    "generated tables.",
}


def usage() -> str:
    """``fl-lightning --help``: every command with a line saying what it does."""
    from fl_lightning.lightning_cli import SUBCOMMAND_HELP

    commands = {**SUBCOMMAND_HELP, **OTHER_COMMANDS}
    width = max(map(len, commands))
    lines = [
        f"usage: fl-lightning {{{','.join(commands)}}} ...",
        "",
        "fl_lightning: federated learning on non-IID data with PyTorch Lightning.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {text}" for name, text in commands.items()),
        "",
        "Run `fl-lightning <command> --help` for a command's options. For example:",
        "  fl-lightning fit --config quickstart                      # FedAvg on digits, no download",
        "  fl-lightning fit --config quickstart --model fedntd --federation.rounds 5",
        "  fl-lightning compare --config compare/fmnist_shard2_seeds --dry-run",
        "  fl-lightning configs                                      # the shipped configs, by name",
        "A fit writes into a new runs/<config name>/version_N unless --trainer.default_root_dir names its directory;",
        "--ckpt_path last resumes the newest run of the same settings there.",
        "--debug (anywhere) shows the traceback of an error; --overwrite replaces a finished run (fit).",
    ]
    return "\n".join(lines) + "\n"


def _show_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None
) -> None:
    """A warning on the command line: one line ``warning: <message>``, without the source file that raised it."""
    text = str(message).strip().splitlines()
    print(f"warning: {text[0] if text else category.__name__}", file=sys.stderr if file is None else file, flush=True)


def _command(args: list[str], debug: bool, overwrite: bool) -> int:
    """Run the command ``args`` names and return its exit code (its modules imported here, not before)."""
    try:
        return _dispatch(args, debug, overwrite)
    except BrokenPipeError:
        if debug:
            raise
        _reader_gone()
        return EXIT_CODES["completed"]


def _reader_gone() -> None:
    """The end of a pipe our output went to was closed (``fl-lightning configs | head -3``): write no more there.

    What is left to write (and Python's flush at exit) goes to ``os.devnull`` instead of raising again.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _dispatch(args: list[str], debug: bool, overwrite: bool) -> int:
    from fl_lightning.cli_errors import one_line

    if args[0] == "configs":
        from fl_lightning import shipped_configs

        try:
            return shipped_configs.main(args[1:])
        except FileNotFoundError as err:
            if debug:
                raise
            return _error(one_line(err), EXIT_CODES["bad input"])
    if args[0] == "claims":
        from fl_lightning.experiments import claims

        try:
            return claims.main(args[1:])
        except (ValueError, FileNotFoundError) as err:
            if debug:
                raise
            return _error(one_line(err), EXIT_CODES["bad input"])
    if args[0] == "compare":
        from fl_lightning.experiments import compare

        try:
            return compare.main(args[1:])
        except (ValueError, TypeError, FileNotFoundError) as err:
            if debug:
                raise
            return _error(one_line(err), EXIT_CODES["bad input"])
        except KeyboardInterrupt:
            if debug:
                raise
            message = "compare interrupted; run the same command again to continue (finished runs are kept)"
            return _error(message, EXIT_CODES["interrupted"])
        except BrokenPipeError:
            if debug or "--dry-run" in args:
                raise  # a dry run printed all it had to: it ends as configs does (_command)
            _reader_gone()
            message = "compare stopped: the pipe its output went to was closed; its fits were stopped (run the same "
            message += "command again to continue; finished runs are kept)"
            return _error(message, EXIT_CODES["interrupted"])
        except OSError as err:  # after BrokenPipeError, an OSError too: a folder went away or filled up while it ran
            if debug:
                raise
            return _error(one_line(err), EXIT_CODES["failed"])
    import fl_lightning.lightning_cli  # noqa: F401  (Lightning and torch: imported while the start-up handlers hold)
    from fl_lightning.cli_args import SUBCOMMANDS

    if not args[0].startswith("-") and args[0] not in SUBCOMMANDS:
        import difflib

        commands = [*SUBCOMMANDS, *OTHER_COMMANDS]
        close = difflib.get_close_matches(args[0], commands, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        return _error(
            f"unknown command {args[0]!r}; {hint}the commands are {', '.join(commands)} (fl-lightning --help)",
            EXIT_CODES["bad input"],
        )

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return run(args, overwrite=overwrite, debug=debug)


def _code_of(err: BaseException) -> int:
    """The exit code of an error that ``--debug`` let through: bad input (2) or failed (1)."""
    try:
        bad_input = isinstance(err, _bad_input_types()) and _this_fit_status() != "failed"
    except Exception:  # the error came while the modules were being imported
        bad_input = False
    return EXIT_CODES["bad input"] if bad_input else EXIT_CODES["failed"]


def main(argv: list[str] | None = None) -> None:
    """Run one command: ``fit``/``test`` (LightningCLI), ``compare`` or ``configs``; else print :func:`usage`.

    ``compare`` runs a comparison (fl_lightning.experiments.compare), ``configs`` lists the shipped configs
    (fl_lightning.shipped_configs); nothing, ``-h`` or ``--help`` prints :func:`usage`.

    ``--debug`` (anywhere) or ``FL_LIGHTNING_DEBUG=1`` shows tracebacks; ``--overwrite`` replaces a finished run.
    Signal handlers come first, so that Ctrl-C or SIGTERM while Lightning and torch are imported ends the command
    with its line and exit code 4. Without ``argv`` (the process's own command line: ``cli.py``, ``fl-lightning``)
    the process ignores SIGINT and SIGTERM from the moment the outcome is decided until it exits; with ``argv`` (called
    from Python) the signal handlers and the warning display it found are restored.
    """
    ending = argv is None
    previous = signal_handlers()
    shown = warnings.showwarning
    if previous is not None:
        signal.signal(signal.SIGTERM, _start_up_sigterm)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _PROCESS["main"] = ending
    try:
        code = _main(argv)
    except KeyboardInterrupt:
        code = _stopped("interrupted")
    except _Terminated:
        code = _stopped("stopped by SIGTERM")
    finally:
        if ending:
            _hold_signals()
        else:
            warnings.showwarning = shown
            restore_signal_handlers(previous)
        _PROCESS["main"] = False
    sys.exit(code)


def _main(argv: list[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("FL_LIGHTNING_DEBUG", "") not in ("", "0")
    overwrite = "--overwrite" in args
    args = [a for a in args if a not in _FLAGS]
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        return 0
    if args[0] == "--version":
        print(f"fl_lightning {__version__}")
        return 0
    if not debug:
        warnings.showwarning = _show_warning
    try:
        return _command(args, debug, overwrite)
    except (KeyboardInterrupt, _Terminated, SystemExit):
        raise
    except Exception as err:
        if not debug:
            raise
        traceback.print_exc()
        return _code_of(err)


if __name__ == "__main__":
    main()

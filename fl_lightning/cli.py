"""The command line: ``python cli.py fit --config configs/<name>.yaml`` (LightningCLI).

Exit codes: 0 completed, 1 failed (an error during the run), 2 bad input or a refused run directory, 3 diverged,
4 interrupted (Ctrl-C, SIGTERM). An error prints one line ``error: ...``; ``--debug`` (or ``FL_LIGHTNING_DEBUG=1``)
shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from jsonargparse import ArgumentError, Namespace
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.callbacks.progress.tqdm_progress import TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException
from typing_extensions import override

from fl_lightning import methods  # noqa: F401  (registers the methods so that `--model FedNTD` resolves)
from fl_lightning.data import FederatedDataModule
from fl_lightning.federation import Federation
from fl_lightning.files import temporary_name, write_text_atomic
from fl_lightning.module import FedAvg
from fl_lightning.progress import RoundProgressBar, quiet_lightning
from fl_lightning.rundir import RunDirPlan, check_run_dir, flatten, move_aside

quiet_lightning()

#: Exit code of each way a run can end (README "Statuses and exit codes").
EXIT_CODES: dict[str, int] = {"completed": 0, "failed": 1, "bad input": 2, "diverged": 3, "interrupted": 4}
#: Trainer settings that would cut rounds short or change what a round is; the federation has its own knobs.
_REFUSED_TRAINER = {
    "fast_dev_run": (False, 0, None),
    "limit_train_batches": (None, 1.0, 1),
    "max_steps": (-1, None),
    "overfit_batches": (0, 0.0, None),
}
_FLAGS = ("--debug", "--overwrite")


class RunConfigSaver(SaveConfigCallback):
    """Saves the resolved config as ``config.yaml`` in the run directory (atomically) and sends it to the loggers."""

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.already_saved or stage != "fit":
            return
        if trainer.is_global_zero:
            run_dir = trainer.default_root_dir
            os.makedirs(run_dir, exist_ok=True)
            config = self.config.clone()
            config["ckpt_path"] = None  # the file describes the experiment; `--config` of it starts, not resumes
            text = self.parser.dump(config, skip_none=False)
            write_text_atomic(Path(run_dir) / self.config_filename, text)
            config = self.config.clone().as_dict() if hasattr(self.config, "as_dict") else dict(self.config)
            for logger in trainer.loggers:
                logger.log_hyperparams(_flatten(config))
        self.already_saved = True


class AtomicLastCheckpoint(ModelCheckpoint):
    """Keeps one checkpoint, ``checkpoints/last.ckpt``, replaced whole after every round (temp file + rename).

    A process killed at any point leaves the previous round's checkpoint or the new one, never a cut file or a link
    to a deleted file (Lightning's ``save_last="link"`` with ``save_top_k=1`` can leave either).
    """

    def __init__(self) -> None:
        super().__init__(save_top_k=0, save_last=True, enable_version_counter=False)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Save ``last.ckpt`` after every round."""
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    @override
    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        tmp = temporary_name(Path(filepath))
        super()._save_checkpoint(trainer, str(tmp))
        if trainer.is_global_zero:
            os.replace(tmp, filepath)
        trainer.strategy.barrier()
        self._last_checkpoint_saved = filepath


def _flatten(d: dict[str, Any]) -> dict[str, Any]:
    """The config as loggers take hyper-parameters: ``group/key`` names, scalar values (others as text)."""
    return {
        key.replace(".", "/"): value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
        for key, value in flatten(d).items()
    }


class _Resolved(Exception):  # noqa: N818  (a control-flow signal, not an error)
    """Raised by :func:`resolve_config` to stop the CLI once the config is resolved, before anything is built."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__("resolved")
        self.config = config


#: What the running process's fit is doing: its run directory, and whether training has started.
_RUN: dict[str, Any] = {"run_dir": None, "fitting": False}


class FLCLI(LightningCLI):
    """LightningCLI with the federation settings under ``--federation.*`` and the data facts linked to the model.

    Before anything is built or written it checks the run directory (:func:`fl_lightning.rundir.check_run_dir`).
    """

    overwrite: bool = False
    resolve_only: bool = False

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(Federation, "federation")
        for attr in ("num_classes", "in_channels", "image_size"):
            parser.link_arguments(f"data.{attr}", f"model.init_args.{attr}", apply_on="instantiate")
        parser.link_arguments("federation.rounds", "trainer.max_epochs")
        parser.link_arguments("seed_everything", "data.seed")
        parser.link_arguments("seed_everything", "federation.seed")
        parser.set_defaults(
            {
                "trainer.logger": False,
                "trainer.default_root_dir": "runs/default",
                "trainer.num_sanity_val_steps": 0,
                "trainer.enable_model_summary": False,
            }
        )

    @override
    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer = config.get("trainer")
        if trainer is None:
            return
        _default_precision(trainer)
        _refuse_trainer_settings(trainer)
        _logger_defaults(config)
        if self.resolve_only:
            raise _Resolved(self.resolved_dict(config))
        if self.subcommand == "fit":
            resume = config.get("ckpt_path") is not None
            self.run_plan = check_run_dir(
                trainer["default_root_dir"],
                self.resolved_dict(config),
                resume=resume,
                overwrite=self.overwrite,
                ckpt_path=config.get("ckpt_path"),
            )
            # Lightning gets the checked file itself (its own `last` lookup could pick another one).
            config["ckpt_path"] = str(self.run_plan.ckpt) if self.run_plan.ckpt is not None else None
            _RUN["run_dir"] = Path(trainer["default_root_dir"])

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        argv = list(sys.argv[1:] if args is None else args) if not isinstance(args, dict) else args
        if isinstance(argv, list):
            argv = _tensorboard_save_dir(argv)
        super().parse_arguments(parser, argv)

    def resolved_dict(self, config: Namespace) -> dict[str, Any]:
        """The config as ``config.yaml`` would hold it, as a nested dict."""
        parser = self._parser(self.subcommand)
        return yaml.safe_load(parser.dump(config, skip_none=False, skip_validation=True)) or {}

    @override
    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        # Checkpoints live in the run directory whatever the logger, so that `--ckpt_path last` finds them.
        for cb in trainer.checkpoint_callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.dirpath is None:
                cb.dirpath = os.path.join(trainer.default_root_dir, "checkpoints")
        for i, cb in enumerate(trainer.callbacks):
            if type(cb) is TQDMProgressBar:
                trainer.callbacks[i] = RoundProgressBar(refresh_rate=cb.refresh_rate, leave=False)
        return trainer

    def before_fit(self) -> None:
        """Carry out the run-directory plan: say what happens, move a replaced run aside."""
        plan: RunDirPlan | None = getattr(self, "run_plan", None)
        if plan is None:
            return
        if plan.message:
            print(f"[fl_lightning] {plan.message}", file=sys.stderr, flush=True)
        move_aside(plan)
        _RUN["fitting"] = True


def _tensorboard_save_dir(argv: list[str]) -> list[str]:
    """``--trainer.logger TensorBoardLogger`` alone: give it the placeholder save_dir ``.`` (the run directory).

    TensorBoardLogger requires a save_dir when the arguments are parsed, before the run directory is known.
    """
    for i, arg in enumerate(argv[:-1]):
        given = any(a.startswith("--trainer.logger.save_dir") for a in argv)
        if arg == "--trainer.logger" and argv[i + 1].rsplit(".", 1)[-1] == "TensorBoardLogger" and not given:
            return [*argv[: i + 2], "--trainer.logger.save_dir", ".", *argv[i + 2 :]]
    return argv


def _default_precision(trainer: Namespace) -> None:
    """Mixed precision on a GPU, plain float32 on the CPU, unless --trainer.precision says otherwise."""
    accelerator = str(trainer.get("accelerator") or "auto")
    gpu = torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda")
    precision = trainer.get("precision")
    if precision is None:
        trainer["precision"] = (
            "bf16-mixed" if gpu and torch.cuda.is_bf16_supported() else "16-mixed" if gpu else "32-true"
        )
    elif str(precision) in ("16-mixed", "16", "16-true", "transformer-engine") and not gpu:
        # Lightning would quietly switch 16-mixed to bf16-mixed on the CPU; say so instead.
        raise ValueError(
            f"--trainer.precision {precision} needs a CUDA GPU; on the CPU use --trainer.precision 32-true "
            "(or bf16-mixed)"
        )


def _refuse_trainer_settings(trainer: Namespace) -> None:
    """Trainer options that would cut a round short (a run would end neither completed nor resumable)."""
    for key, allowed in _REFUSED_TRAINER.items():
        value = trainer.get(key)
        if value not in allowed:
            raise ValueError(
                f"--trainer.{key} {value} is not supported: one training batch is one client's whole update, so it "
                "would cut rounds short; for a quick run use --federation.rounds 1 --data.num_clients 2 "
                "(or --federation.sample_ratio to train fewer clients per round)"
            )


def _logger_defaults(config: Namespace) -> None:
    """W&B and TensorBoard write under the run directory; a W&B run is named, grouped and tagged from the config."""
    logger = config.get("trainer", {}).get("logger")
    if not isinstance(logger, Namespace) or "class_path" not in logger:
        return
    run_dir = str(config["trainer"]["default_root_dir"])
    args = logger.get("init_args")
    if args is None:
        return
    name = str(logger["class_path"]).rsplit(".", 1)[-1]
    if name == "TensorBoardLogger":
        if args.get("save_dir") in (None, "."):
            args["save_dir"] = run_dir
            if args.get("name") == "lightning_logs":
                args["name"] = "tensorboard"
            if args.get("version") is None:
                args["version"] = ""  # one event folder per run directory, continued on resume
    elif name == "WandbLogger":
        data, model = config.get("data", {}), config.get("model", {})
        method = str(model.get("class_path", "FedAvg")).rsplit(".", 1)[-1] if isinstance(model, Namespace) else "?"
        dataset, partition, seed = data.get("dataset"), data.get("partition"), config.get("seed_everything")
        defaults = {
            "project": "fl_lightning",
            "name": Path(run_dir).name,
            "group": f"{dataset}_{partition}",
            "tags": [method, str(dataset), str(partition), f"seed{seed}"],
        }
        for key, value in defaults.items():
            if args.get(key) is None:
                args[key] = value
        if args.get("save_dir") in (None, "."):
            args["save_dir"] = run_dir


def cli_main(args: list[str] | None = None, run: bool = True, overwrite: bool = False) -> FLCLI:
    """Build (and by default run) the command line; ``overwrite`` replaces a finished run in the run directory."""
    cli_class = type("FLCLI", (FLCLI,), {"overwrite": overwrite})
    return cli_class(
        FedAvg,
        FederatedDataModule,
        subclass_mode_model=True,
        seed_everything_default=0,
        save_config_callback=RunConfigSaver,
        trainer_defaults={"callbacks": [AtomicLastCheckpoint()]},
        args=args,
        run=run,
        auto_configure_optimizers=False,
        parser_kwargs=_parser_kwargs(),
    )


def _parser_kwargs() -> dict[str, Any]:
    # Raise parse errors instead of printing the usage wall, so that main() can print the one line that matters.
    return {"exit_on_error": False, **{sub: {"exit_on_error": False} for sub in ("fit", "validate", "test", "predict")}}


def resolve_config(args: list[str]) -> dict[str, Any]:
    """The resolved config that ``cli.py <args>`` would save as ``config.yaml``, without building or running anything.

    Args:
        args: the arguments after ``cli.py``, e.g. ``["fit", "--config", "configs/quickstart.yaml"]``.
    """
    cli_class = type("FLCLI", (FLCLI,), {"resolve_only": True})
    try:
        cli_class(
            FedAvg,
            FederatedDataModule,
            subclass_mode_model=True,
            seed_everything_default=0,
            save_config_callback=RunConfigSaver,
            args=args,
            run=True,
            auto_configure_optimizers=False,
            parser_kwargs=_parser_kwargs(),
        )
    except _Resolved as resolved:
        return resolved.config
    raise RuntimeError("resolve_config: the CLI did not reach its config")  # pragma: no cover


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
    run_dir = _RUN.get("run_dir")
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
    _RUN.update(run_dir=None, fitting=False)
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
        if _RUN["fitting"]:  # Lightning turns Ctrl-C into exit(1) after recording the run
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
        from fl_lightning.compare import main as compare_main

        try:
            sys.exit(compare_main(args[1:]))
        except (ValueError, TypeError, FileNotFoundError) as err:
            if debug:
                raise
            sys.exit(_error(one_line(err), EXIT_CODES["bad input"]))
    sys.exit(run(args, overwrite=overwrite, debug=debug))


if __name__ == "__main__":
    main()

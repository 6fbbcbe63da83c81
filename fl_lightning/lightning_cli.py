"""fl_lightning's LightningCLI: the parser, its defaults and links, and the run-directory check before a fit.

:func:`cli_main` builds (and runs) it, :func:`resolve_config` only resolves a config. The command around it (exit
codes, one-line errors, ``compare``) is :mod:`fl_lightning.cli`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from jsonargparse import Namespace
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.callbacks.progress.tqdm_progress import TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from typing_extensions import override

from fl_lightning import (
    methods,  # noqa: F401  (registers the methods so that `--model FedNTD` resolves)
    rules,
)
from fl_lightning.data import FederatedDataModule
from fl_lightning.federation import Federation
from fl_lightning.files import temporary_name, write_text_atomic
from fl_lightning.module import FedAvg
from fl_lightning.progress import RoundProgressBar, quiet_lightning
from fl_lightning.rundir import RunDirPlan, check_run_dir, flatten, move_aside

quiet_lightning()


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


#: What this process's fit is doing: its run directory, and whether training has started (for the exit code).
RUNNING: dict[str, Any] = {"run_dir": None, "fitting": False}


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
        _trainer_rules(trainer)
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
            RUNNING["run_dir"] = Path(trainer["default_root_dir"])

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
        # Rounds as epochs; checkpoints in the run directory whatever the logger, so that `--ckpt_path last` finds them.
        rules.prepare_trainer(trainer, self._get(self.config, "federation.rounds"))
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
        RUNNING["fitting"] = True


def _tensorboard_save_dir(argv: list[str]) -> list[str]:
    """``--trainer.logger TensorBoardLogger`` alone: give it the placeholder save_dir ``.`` (the run directory).

    TensorBoardLogger requires a save_dir when the arguments are parsed, before the run directory is known.
    """
    for i, arg in enumerate(argv[:-1]):
        given = any(a.startswith("--trainer.logger.save_dir") for a in argv)
        if arg == "--trainer.logger" and argv[i + 1].rsplit(".", 1)[-1] == "TensorBoardLogger" and not given:
            return [*argv[: i + 2], "--trainer.logger.save_dir", ".", *argv[i + 2 :]]
    return argv


def _trainer_rules(trainer: Namespace) -> None:
    """The trainer rules (:mod:`fl_lightning.rules`) on the parsed config, before anything is built.

    An unset precision becomes :func:`~fl_lightning.rules.default_precision` (mixed on a GPU, float32 on the CPU).
    """
    accelerator = trainer.get("accelerator")
    if trainer.get("precision") is None:
        trainer["precision"] = rules.default_precision(accelerator)
    else:
        rules.check_precision(trainer["precision"], on_cpu=not rules.uses_cuda(accelerator))
    rules.check_round_options({key: trainer.get(key) for key in rules.ROUND_OPTIONS})


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

"""fl_lightning's LightningCLI: the parser, its defaults and links, and the run-directory check before a fit.

:func:`cli_main` builds (and runs) it, :func:`resolve_config` only resolves a config. The command around it (exit
codes, one-line errors, ``compare``) is :mod:`fl_lightning.cli`.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from jsonargparse import Namespace
from lightning.pytorch.callbacks.progress.tqdm_progress import TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback, _InstantiatorFn
from typing_extensions import override

from fl_lightning import (
    methods,  # registers the methods so that `--model FedNTD` resolves; `--model fedntd` goes through METHODS
    rules,
    shipped_configs,
)
from fl_lightning.checkpoint import AtomicLastCheckpoint
from fl_lightning.core import faults
from fl_lightning.core.files import write_text_atomic
from fl_lightning.core.partitions import Partitioner
from fl_lightning.core.rundir import (
    RunDirError,
    RunDirPlan,
    check_checkpoint_file,
    check_run_dir,
    claim_run_dir,
    flatten,
    move_aside,
    release_run_dir,
)
from fl_lightning.data import FederatedDataModule
from fl_lightning.federation import Federation
from fl_lightning.progress import RoundProgressBar, quiet_lightning

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
            # The settings only: not the --config files the parser read (`config: [Path_fsr(...)]`).
            config = {key: value for key, value in config.items() if key != "config" and not key.startswith("_")}
            for logger in trainer.loggers:
                logger.log_hyperparams(_flatten(config))
        self.already_saved = True


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


#: What this process's fit is doing: its run directory, whether training has started (for the exit code), and the
#: run directory it claimed (released when the command ends).
RUNNING: dict[str, Any] = {"run_dir": None, "fitting": False, "claimed": None}


def _is_worker_process() -> bool:
    """Whether this process is one that a launcher (Lightning's DDP, torchrun, SLURM) started beside the main one."""
    return any(os.environ.get(var, "0") not in ("", "0") for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "NODE_RANK"))


class FLCLI(LightningCLI):
    """LightningCLI with the federation settings under ``--federation.*`` and the data facts linked to the model.

    The model is any ``LightningModule`` (a method by name, or a class path); the data facts (``num_classes``,
    ``in_channels``, ``image_size``) reach the arguments of its ``__init__`` that have those names, if any.

    Before anything is built or written it checks the run directory (:func:`fl_lightning.core.rundir.check_run_dir`).
    """

    overwrite: bool = False
    resolve_only: bool = False

    @staticmethod
    @override
    def subcommands() -> dict[str, set[str]]:
        """``fit``, ``validate`` and ``test`` (``predict`` returns tensors: use it from Python, see the README)."""
        return {key: value for key, value in LightningCLI.subcommands().items() if key in ("fit", "validate", "test")}

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
                # The loggers get the resolved config once, under namespaced keys (RunConfigSaver), not the module's
                # and datamodule's arguments again under bare names (with LightningCLI's internal `_instantiator`).
                "trainer.enable_autolog_hparams": False,
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
            if not _is_worker_process() and RUNNING.get("claimed") is None:
                # Claim the directory before checking it, so that no other fit can start there in between.
                RUNNING["claimed"] = claim_run_dir(trainer["default_root_dir"])
                faults.point("after-claim")
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
    def _add_instantiators(self) -> None:
        """Lightning's, with a model's hyper-parameters holding only the linked data facts its ``__init__`` takes.

        jsonargparse passes a linked value only to a class that has the argument, but Lightning records every link's
        value among the hyper-parameters (``in_channels`` of a module without one), which a checkpoint then hands
        back to a module that refuses it (``test --ckpt_path``).
        """
        super()._add_instantiators()
        record_hparams = _InstantiatorFn(cli=self, key="model")

        def instantiate_model(
            class_type: type[L.LightningModule], *args: Any, applied_instantiation_links: dict, **kwargs: Any
        ) -> L.LightningModule:
            taken = {key: v for key, v in applied_instantiation_links.items() if key.rsplit(".", 1)[-1] in kwargs}
            return record_hparams(class_type, *args, applied_instantiation_links=taken, **kwargs)

        self.parser.add_instantiator(instantiate_model, L.LightningModule, subclasses=True)

    @override
    def _parse_ckpt_path(self) -> None:
        """Check a ``--ckpt_path`` file's checksum before Lightning reads the hyper-parameters from it."""
        ckpt_path = self.config[self.config.subcommand].get("ckpt_path") if self.config.get("subcommand") else None
        if not ckpt_path or ckpt_path == "last" or not Path(ckpt_path).is_file():
            super()._parse_ckpt_path()
            return
        check_checkpoint_file(ckpt_path)
        try:
            super()._parse_ckpt_path()
        except Exception as err:  # torch's own error for a file that is no checkpoint of this kind
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise RunDirError(f"checkpoint {ckpt_path} cannot be loaded ({reason})") from err

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        argv = list(sys.argv[1:] if args is None else args) if not isinstance(args, dict) else args
        if isinstance(argv, list):
            argv = _tensorboard_save_dir(_data_source_paths(_method_names(_named_configs(argv))))
            _check_logger_packages(argv)
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
        for logger in trainer.loggers:
            wandb_init = getattr(logger, "_wandb_init", None)
            if isinstance(wandb_init, dict) and wandb_init.get("anonymous") is None:
                # Lightning passes `anonymous=None`, which W&B answers with "The anonymous setting has no effect".
                wandb_init.pop("anonymous", None)
        return trainer

    def before_fit(self) -> None:
        """Carry out the run-directory plan: say what happens, move a replaced run aside."""
        plan: RunDirPlan | None = getattr(self, "run_plan", None)
        if plan is None:
            return
        if plan.message:
            print(f"[fl_lightning] {plan.message}", file=sys.stderr, flush=True)
        move_aside(plan)
        for logger in self.trainer.loggers:
            if hasattr(logger, "_wandb_init") and logger.save_dir:
                # W&B looks for a git repository from its folder when the run starts, before the run directory would
                # exist, and warns "git root ... does not exist" (and records no git state) if it does not.
                Path(logger.save_dir).mkdir(parents=True, exist_ok=True)
        summary = plan.run_dir / "summary.json"  # tells this fit's summary from the one it found (the exit code)
        RUNNING["summary_stamp"] = (summary.stat().st_mtime_ns, summary.stat().st_size) if summary.exists() else None
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


def _named_configs(argv: list[str]) -> list[str]:
    """``--config NAME``: a file as it is, else the shipped config of that name (:mod:`~fl_lightning.shipped_configs`).

    Raises:
        FileNotFoundError: neither a file nor a shipped config's name.
    """
    out = list(argv)
    for i, arg in enumerate(out):
        if arg in ("--config", "-c") and i + 1 < len(out):
            out[i + 1] = shipped_configs.resolve_config_arg(out[i + 1], arg)
        elif arg.startswith("--config="):
            out[i] = "--config=" + shipped_configs.resolve_config_arg(arg.split("=", 1)[1], "--config")
    return out


def _method_class_path(value: str, option: str = "--model") -> str:
    """A method named as in the results (``fedntd``, ``FedNTD``, ``fedlmd_tf``; any case) as its class path.

    A class path (``mypkg.MyMethod``), an inline class config (``{"class_path": ...}``) or the name of another
    imported ``LightningModule`` subclass is returned unchanged; an unknown name is refused with the closest method's
    name.

    >>> _method_class_path("fedntd"), _method_class_path("FedLMD-Tf")
    ('fl_lightning.methods.FedNTD', 'fl_lightning.methods.FedLMDTf')
    """
    if not value or "." in value or not value.replace("_", "").replace("-", "").isalnum():
        return value

    def key(name: str) -> str:
        return name.lower().replace("_", "").replace("-", "")

    by_key: dict[str, type] = {}
    for short, cls in methods.METHODS.items():
        by_key.setdefault(key(short), cls)
        by_key.setdefault(key(cls.__name__), cls)
    cls = by_key.get(key(value))
    if cls is not None:
        return f"{cls.__module__}.{cls.__qualname__}"
    if any(sub.__name__ == value for sub in _subclasses(L.LightningModule)):
        return value  # a module of your own that is imported: jsonargparse resolves it by name
    close = difflib.get_close_matches(key(value), list(by_key), n=1, cutoff=0.5)
    names = {key(short): short for short in methods.METHODS}
    hint = f"did you mean {names.get(close[0], by_key[close[0]].__name__)}? " if close else ""
    raise ValueError(
        f"{option} {value}: unknown method; {hint}The methods are {', '.join(methods.METHODS)} (any case), "
        f"or give a class path such as mypkg.MyMethod"
    )


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _method_names(argv: list[str]) -> list[str]:
    """``--model fedntd`` (and ``--model.help fedntd``) with the method's class path."""
    out = list(argv)
    options = ("--model", "--model.class_path", "--model.help")
    for i, arg in enumerate(out):
        if arg in options and i + 1 < len(out):
            out[i + 1] = _method_class_path(out[i + 1], arg)
        elif "=" in arg and arg.split("=", 1)[0] in options:
            option, value = arg.split("=", 1)
            out[i] = f"{option}={_method_class_path(value, option)}"
    return out


def _data_source_paths(argv: list[str]) -> list[str]:
    """``--data.dataset mypkg.MyData``: a class path (the built-in datasets' names have no dot) as a ``DataSource``.

    The option also takes a dataset's name, as which jsonargparse would otherwise take the class path.
    """
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--data.dataset" and i + 1 < len(out) and _CLASS_PATH.fullmatch(out[i + 1]):
            out[i] = "--data.dataset.class_path"
        elif arg.startswith("--data.dataset=") and _CLASS_PATH.fullmatch(arg.split("=", 1)[1]):
            out[i] = "--data.dataset.class_path=" + arg.split("=", 1)[1]
    return out


_CLASS_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


#: Loggers whose package is optional: the module to import and what to ``pip install``.
_LOGGER_PACKAGES = {
    "WandbLogger": (("wandb",), "wandb"),
    "TensorBoardLogger": (("tensorboard", "tensorboardX"), "tensorboard"),
    "CometLogger": (("comet_ml",), "comet-ml"),
    "MLFlowLogger": (("mlflow",), "mlflow"),
    "NeptuneLogger": (("neptune",), "neptune"),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _check_logger_package(logger: str) -> None:
    """Refuse a logger whose package is not installed, naming the ``pip install`` to run."""
    name = logger.rsplit(".", 1)[-1]
    modules, package = _LOGGER_PACKAGES.get(name, ((), ""))
    if modules and not any(_installed(m) for m in modules):
        extra = f" (or pip install 'fl_lightning[{package}]')" if package in ("wandb", "tensorboard") else ""
        raise ValueError(f"--trainer.logger {name} needs the {package} package: pip install {package}{extra}")


def _check_logger_packages(argv: list[str]) -> None:
    for i, arg in enumerate(argv):
        if arg == "--trainer.logger" and i + 1 < len(argv):
            _check_logger_package(argv[i + 1])
        elif arg.startswith("--trainer.logger="):
            _check_logger_package(arg.split("=", 1)[1])


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
    _check_logger_package(name)
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
        dataset, partition = _config_label(data.get("dataset")), _config_label(data.get("partition"))
        defaults = {
            "project": "fl_lightning",
            "name": Path(run_dir).name,
            "group": _wandb_text(f"{dataset}_{partition}"),
            "tags": [_wandb_text(tag) for tag in (method, dataset, partition, f"seed{config.get('seed_everything')}")],
        }
        for key, value in defaults.items():
            if args.get(key) is None:
                args[key] = value
        if args.get("save_dir") in (None, "."):
            args["save_dir"] = run_dir


def _config_label(value: Any) -> str:
    """A dataset or partition of the config as results name it (W&B's group and tags), never a ``Namespace``.

    A name stays as given; a class path gives a ``DataSource``'s ``name`` (in ``init_args`` or on the class; else
    the class name) or a ``Partitioner``'s ``label`` (``dirichlet(0.1)``).
    """
    if not isinstance(value, Namespace) or "class_path" not in value:
        return str(value)
    class_path, init_args = str(value["class_path"]), value.get("init_args")
    init_args = init_args.as_dict() if isinstance(init_args, Namespace) else dict(init_args or {})
    if isinstance(init_args.get("name"), str) and init_args["name"]:
        return init_args["name"]
    module, _, attr = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)  # imported already, when the config was parsed
        if isinstance(cls, type) and issubclass(cls, Partitioner):
            return cls(**init_args).label
    except Exception:  # a name for a logger: the class's own, if it cannot give a better one
        return attr
    name = getattr(cls, "name", None)
    return name if isinstance(name, str) and name else attr


def _wandb_text(text: str) -> str:
    """``text`` cut to the 64 characters W&B allows in a tag (and keeps groups as short)."""
    return text if len(text) <= 64 else text[:61] + "..."


def cli_main(args: list[str] | None = None, run: bool = True, overwrite: bool = False) -> FLCLI:
    """Build (and by default run) the command line; ``overwrite`` replaces a finished run in the run directory."""
    cli_class = type("FLCLI", (FLCLI,), {"overwrite": overwrite})
    RUNNING["claimed"] = None
    try:
        return cli_class(
            L.LightningModule,  # any module by class path; the methods by name too (_method_names)
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
    finally:
        # A fit claims its run directory before checking it (FLCLI.before_instantiate_classes); released however
        # the command ends.
        if RUNNING.get("claimed") is not None:
            release_run_dir(RUNNING["claimed"])
            RUNNING["claimed"] = None


#: What each subcommand does, in ``fl-lightning --help`` and atop its own ``--help``.
SUBCOMMAND_HELP = {
    "fit": "Train a federation and write its results into its run directory (--trainer.default_root_dir).",
    "validate": "Validate a trained global model on the validation data (--data.holdout_per_class or a DataSource's "
    "val; --ckpt_path <run dir>/checkpoints/last.ckpt).",
    "test": "Test a trained global model on the test data (--ckpt_path <run dir>/checkpoints/last.ckpt).",
}


def _parser_kwargs() -> dict[str, Any]:
    # Raise parse errors instead of printing the usage wall, so that main() can print the one line that matters.
    return {
        "exit_on_error": False,
        "description": "fl_lightning: federated learning on non-IID data with PyTorch Lightning.",
        **{sub: {"exit_on_error": False, "description": SUBCOMMAND_HELP[sub]} for sub in FLCLI.subcommands()},
    }


def resolve_config(args: list[str]) -> dict[str, Any]:
    """The resolved config that ``cli.py <args>`` would save as ``config.yaml``, without building or running anything.

    Args:
        args: the arguments after ``cli.py``, e.g. ``["fit", "--config", "configs/quickstart.yaml"]``.
    """
    cli_class = type("FLCLI", (FLCLI,), {"resolve_only": True})
    try:
        cli_class(
            L.LightningModule,
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

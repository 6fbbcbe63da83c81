"""fl_lightning's LightningCLI: the parser, its defaults and links, and the run-directory check before a fit.

:func:`cli_main` builds (and runs) it, :func:`resolve_config` only resolves a config. The command around it (exit
codes, one-line errors, ``compare``) is :mod:`fl_lightning.cli`.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from jsonargparse import ArgumentError, Namespace
from lightning.pytorch.callbacks.progress.rich_progress import RichProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback, _InstantiatorFn
from typing_extensions import override

from fl_lightning import rules
from fl_lightning.checkpoint import AtomicLastCheckpoint
from fl_lightning.cli_args import (  # cli_args imports the methods: `--model FedNTD` resolves
    DATA_FACTS,
    SUBCOMMANDS,
    check_config_order,
    check_data_facts,
    check_logger_package,
    check_logger_packages,
    class_paths,
    closest_option,
    fixed_seed,
    linked_option,
    method_names,
    missing_method,
    named_configs,
    run_base,
    saved_run_dir,
    tensorboard_save_dir,
)
from fl_lightning.cli_help import HelpParser, network_help
from fl_lightning.core import faults
from fl_lightning.core.files import write_text_atomic
from fl_lightning.core.partitions import Partitioner
from fl_lightning.core.registry import import_path
from fl_lightning.core.run_lock import claim_run_dir, release_run_dir
from fl_lightning.core.rundir import (
    VERSION_PREFIX,
    RunDirError,
    RunDirPlan,
    check_checkpoint_file,
    check_run_dir,
    flatten,
    move_aside,
)
from fl_lightning.core.step_capture import resolve_capture
from fl_lightning.core.versions import checkpoint_to_evaluate, claim_new_version, matching_version, rounds_note
from fl_lightning.data import FederatedDataModule
from fl_lightning.federation import Federation
from fl_lightning.module import FedAvg
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
            saved = self.config.clone()
            # The file describes the experiment, without ckpt_path: `--config` of it starts, not resumes, and it
            # leaves a --ckpt_path given before it as it was (a `ckpt_path: null` there would undo it).
            del saved["ckpt_path"]
            text = self.parser.dump(saved, skip_none=False)
            write_text_atomic(Path(run_dir) / self.config_filename, text)
            config = self.config.clone().as_dict() if hasattr(self.config, "as_dict") else dict(self.config)
            # The settings only: not the --config files the parser read (`config: [Path_fsr(...)]`).
            settings = {key: value for key, value in config.items() if key != "config" and not key.startswith("_")}
            for logger in trainer.loggers:
                logger.log_hyperparams(_flatten(settings))
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

#: The run directory a fit chose under its default location, for the processes a launcher starts beside it.
_RUN_DIR_ENV = "FL_LIGHTNING_RUN_DIR"


def _version_of_checkpoint(base: Path, ckpt_path: str | os.PathLike[str]) -> Path | None:
    """The ``base/version_N`` that a checkpoint file lies in (``<version>/checkpoints/<file>``), else None."""
    folder = Path(ckpt_path).resolve().parent.parent
    inside = folder.parent == base.resolve() and folder.name.startswith(VERSION_PREFIX)
    return base / folder.name if inside else None


def _is_worker_process() -> bool:
    """Whether this process is one that a launcher (Lightning's DDP, torchrun, SLURM) started beside the main one."""
    return any(os.environ.get(var, "0") not in ("", "0") for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "NODE_RANK"))


def _launched_world_size() -> int:
    """How many processes an outside launcher started for this fit (torchrun's ``WORLD_SIZE``, SLURM's tasks)."""
    sizes = (os.environ.get(var, "") for var in ("WORLD_SIZE", "SLURM_NTASKS"))
    return max((int(size) for size in sizes if size.isdigit()), default=1)


class FLCLI(LightningCLI):
    """LightningCLI with the federation settings under ``--federation.*`` and the data facts linked to the model.

    The model is any ``LightningModule`` (a method by name, or a class path); the data facts (``num_classes``,
    ``in_channels``, ``image_size``) reach the arguments of its ``__init__`` that have those names, if any.

    A fit whose command names no run directory writes into a new ``runs/<config name>/version_N``
    (:func:`~fl_lightning.cli_args.run_base`). Once every value has passed its own class's checks, and before anything
    is written, it claims and checks the run directory (:func:`fl_lightning.core.rundir.check_run_dir`).
    """

    overwrite: bool = False
    resolve_only: bool = False
    #: The subcommand the command line names, if any: then only its parser is built (Lightning builds one for every
    #: subcommand, each about 0.07 s on 2 cores); ``None`` (``--help``, a misspelt subcommand) builds them all.
    named: str | None = None

    @classmethod
    @override
    def subcommands(cls) -> dict[str, set[str]]:  # Lightning's is a staticmethod, called on the instance
        """``fit``, ``validate`` and ``test`` (``predict`` returns tensors: use it from Python, see the README)."""
        names = (cls.named,) if cls.named else SUBCOMMANDS
        return {key: value for key, value in LightningCLI.subcommands().items() if key in names}

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(Federation, "federation")
        for attr in DATA_FACTS:
            parser.link_arguments(f"data.{attr}", f"model.init_args.{attr}", apply_on="instantiate")
        parser.link_arguments("federation.rounds", "trainer.max_epochs")
        parser.link_arguments("seed_everything", "data.seed", compute_fn=fixed_seed)
        parser.link_arguments("seed_everything", "federation.seed", compute_fn=fixed_seed)
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
        if isinstance(trainer.get("default_root_dir"), str):
            trainer["default_root_dir"] = self._named_run_dir(trainer)
        _trainer_rules(trainer)
        federation = config.get("federation")
        values = {
            key: trainer.get(key) for key in ("check_val_every_n_epoch", "gradient_clip_val", "min_epochs", "max_time")
        }
        rules.check_trainer_values(values, federation.get("rounds") if federation is not None else None)
        rules.check_clipping(trainer.get("gradient_clip_val"), _method_of(config.get("model")))
        if federation is not None and federation.get("step_capture") is not None:  # graph needs CUDA: say so now
            device = "cuda" if rules.uses_cuda(trainer.get("accelerator")) else "cpu"
            resolve_capture(federation["step_capture"], torch.device(device))
        if self.resolve_only:
            _logger_defaults(config)
            raise _Resolved(self.resolved_dict(config))
        if self.subcommand == "fit":
            if not _is_worker_process():
                _warn_cpu_devices(trainer)
            base = getattr(self, "run_base", None)
            if base is not None:
                trainer["default_root_dir"] = str(self._versioned_run_dir(Path(base), config))
        _logger_defaults(config)

    def _versioned_run_dir(self, base: Path, config: Namespace) -> Path:
        """The run directory under ``base`` of a fit whose command names none: a new ``version_N``, or a resumed one.

        A fresh fit claims a new version (:func:`~fl_lightning.core.versions.claim_new_version`). ``--ckpt_path last``
        resumes the newest version of the same experiment (:func:`~fl_lightning.core.versions.matching_version`), and
        ``--ckpt_path <file>`` the version the file lies in; with no such version the fit starts in a new one. The
        processes a launcher starts beside this one take the directory this one chose (``FL_LIGHTNING_RUN_DIR``).
        """
        if _is_worker_process() and os.environ.get(_RUN_DIR_ENV):
            return Path(os.environ[_RUN_DIR_ENV])
        if _launched_world_size() > 1:  # each process would choose a version of its own
            raise ValueError(
                "processes started by a launcher (torchrun, srun) share one run: name its directory with "
                "--trainer.default_root_dir DIR, the same on every node"
            )
        ckpt_path = config.get("ckpt_path")
        run_dir = None
        if ckpt_path == "last":
            run_dir = matching_version(base, self.resolved_dict(config))
        elif ckpt_path:
            run_dir = _version_of_checkpoint(base, ckpt_path)
        if run_dir is None:
            run_dir = claim_new_version(base)
            RUNNING["claimed"] = run_dir
            faults.point("after-claim")
            self.new_version_note = (
                f"no run of these settings in {base} to resume: a new run in {run_dir}"
                if ckpt_path == "last"
                else f"a new run in {run_dir}"
            )
        os.environ[_RUN_DIR_ENV] = str(run_dir)
        RUNNING["run_dir_env"] = True
        return run_dir

    @override
    def after_instantiate_classes(self) -> None:
        """Claim and check the run directory of a fit, once every value has passed its own class's checks.

        The check (:func:`fl_lightning.core.rundir.check_run_dir`) reads only; a refusal leaves nothing behind.
        A ``--model.num_classes`` (or another linked data fact) that the data contradicts is refused first.
        """
        config = self.config[self.subcommand] if self.subcommand else self.config
        init_args = config.get("model.init_args")
        if isinstance(init_args, Namespace):
            given = {fact: init_args.get(fact) for fact in DATA_FACTS}
            from_checkpoint = config.get("ckpt_path") is not None
            check_data_facts(given, self.datamodule, type(self.model), from_checkpoint=from_checkpoint)
        if self.subcommand == "validate" and not self.datamodule.has_validation_data:
            raise ValueError(
                "validate has no validation data: give the run's --data.holdout_per_class N (or a DataSource whose "
                "load() returns a validation split); `test` scores the test set"
            )
        if self.subcommand != "fit":
            return
        run_dir = config["trainer"]["default_root_dir"]
        if not _is_worker_process() and RUNNING.get("claimed") is None:
            # Claim the directory before checking it, so that no other fit can start there in between.
            RUNNING["claimed"] = claim_run_dir(run_dir)
            faults.point("after-claim")
        resume = config.get("ckpt_path") is not None
        plan = check_run_dir(
            run_dir,
            self.resolved_dict(config),
            resume=resume,
            # a new version folder holds nothing to replace; a resume with --overwrite is refused as ever
            overwrite=self.overwrite and (getattr(self, "run_base", None) is None or resume),
            ckpt_path=config.get("ckpt_path"),
            # --overwrite would not replace a version: the same command without --ckpt_path runs it again in a new one
            **({"rerun": "drop --ckpt_path to rerun it in a new version"} if getattr(self, "run_base", None) else {}),
        )
        note = getattr(self, "new_version_note", "")
        if note and plan.action == "fresh":
            plan = replace(plan, message=note)
        self.run_plan = plan
        # Lightning gets the checked file itself (its own `last` lookup could pick another one).
        ckpt = str(plan.ckpt) if plan.ckpt is not None else None
        config["ckpt_path"] = ckpt
        self.config_init[self.subcommand]["ckpt_path"] = ckpt
        RUNNING["run_dir"] = Path(run_dir)

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
        if self.config.get("subcommand") in ("validate", "test"):
            config = self.config[self.config.subcommand]
            config["ckpt_path"] = self._evaluated_checkpoint(config)
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

    def _named_run_dir(self, trainer: Namespace) -> str:
        """The run directory as the command names it: a ``--config <run>/config.yaml``'s folder, ``~`` expanded.

        One directory for the claim, the checks and the fit (a ``~/runs/x`` the claim alone expanded split them).
        """
        own = getattr(self, "own_run_dir", None)
        return os.path.expanduser(str(own if own is not None else trainer["default_root_dir"]))

    def _evaluated_checkpoint(self, config: Namespace) -> str:
        """What ``validate``/``test`` evaluate (:func:`~fl_lightning.core.versions.checkpoint_to_evaluate`)."""
        trainer, ckpt_path = config["trainer"], config.get("ckpt_path")
        if ckpt_path == "last" and trainer.get("precision") is None:  # as the fit resolved it, to match its version
            trainer["precision"] = rules.default_precision(trainer.get("accelerator"))
        wanted = {k: v for k, v in self.resolved_dict(config).items() if k != "verbose"}  # the command's, not the run's
        run_dir = Path(self._named_run_dir(trainer))
        found = checkpoint_to_evaluate(
            self.config.subcommand, ckpt_path, run_dir, getattr(self, "run_base", None), wanted
        )
        if note := rounds_note(found, config.get("federation.rounds")):  # a run stopped early, or rounds raised since
            print(f"[fl_lightning] {note}", file=sys.stderr, flush=True)
        return found

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        argv = list(sys.argv[1:] if args is None else args) if not isinstance(args, dict) else args
        if isinstance(argv, list):
            given, argv = argv, tensorboard_save_dir(class_paths(method_names(named_configs(network_help(argv)))))
            check_logger_packages(argv)
            check_config_order(given)  # named as the user wrote them
            self.run_base, self.own_run_dir = run_base(argv), saved_run_dir(argv)
        try:
            super().parse_arguments(parser, argv)
        except ArgumentError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            no_method = missing_method(first) or linked_option(first)
            if no_method is not None:
                raise ArgumentError(None, no_method) from err
            subcommand = argv[0] if isinstance(argv, list) and argv and argv[0] in self.subcommands() else None
            hint = closest_option(first, self._parser(subcommand)) if subcommand else None
            if hint is None:
                raise
            raise ArgumentError(None, f"{first}; {hint}") from err

    def resolved_dict(self, config: Namespace) -> dict[str, Any]:
        """The config as ``config.yaml`` would hold it, as a nested dict."""
        parser = self._parser(getattr(self, "subcommand", None) or self.config.get("subcommand"))  # set after parsing
        return yaml.safe_load(parser.dump(config, skip_none=False, skip_validation=True)) or {}

    @override
    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        # Rounds as epochs; checkpoints in the run directory whatever the logger, so that `--ckpt_path last` finds them.
        rules.prepare_trainer(trainer, self._get(self.config, "federation.rounds"))
        callbacks: list[L.Callback] = trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning's connector
        # Lightning's default bar is rich's when `rich` is installed: the command line draws the same round bar either
        # way, unless the config names a bar of its own.
        named = self._get(self.config, "trainer.callbacks") or []
        named = named if isinstance(named, list) else [named]  # `--trainer.callbacks X` gives one, not a list
        own_bar = any("ProgressBar" in str(_class_path_of(c)) for c in named)
        for i, cb in enumerate(callbacks):
            if type(cb) is TQDMProgressBar or (type(cb) is RichProgressBar and not own_bar):
                callbacks[i] = RoundProgressBar(refresh_rate=int(cb.refresh_rate), leave=False)
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
        # The plan checked the run's files, config.yaml too (which Lightning writes again before the callback looks).
        settings = self.resolved_dict(self.config[self.subcommand])  # what the nodes of a run compare at its start
        for callback in self.trainer.callbacks:  # type: ignore[attr-defined]  # set by Lightning
            if isinstance(callback, Federation):
                callback._files_checked, callback._settings_config = True, settings
        for logger in self.trainer.loggers:
            if hasattr(logger, "_wandb_init") and logger.save_dir:
                # W&B looks for a git repository from its folder when the run starts, before the run directory would
                # exist, and warns "git root ... does not exist" (and records no git state) if it does not.
                Path(logger.save_dir).mkdir(parents=True, exist_ok=True)
        summary = plan.run_dir / "summary.json"  # tells this fit's summary from the one it found (the exit code)
        RUNNING["summary_stamp"] = (summary.stat().st_mtime_ns, summary.stat().st_size) if summary.exists() else None
        RUNNING["fitting"] = True


def _class_path_of(config: Any) -> Any:
    """A class config's ``class_path`` (a callback given as a class config or as an instance)."""
    return config.get("class_path", "") if isinstance(config, dict | Namespace) else type(config).__name__


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


def _warn_cpu_devices(trainer: Namespace) -> None:
    """One warning when ``--trainer.devices N`` on the CPU asks for more processes than this process has cores."""
    devices = trainer.get("devices")
    if rules.uses_cuda(trainer.get("accelerator")) or str(trainer.get("accelerator") or "auto") not in ("auto", "cpu"):
        return
    count = int(devices) if isinstance(devices, int) or (isinstance(devices, str) and devices.isdigit()) else None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if count is not None and count > cores:
        warnings.warn(
            f"--trainer.devices {count} starts {count} processes on {cores} CPU cores: they take turns on the cores "
            f"and each round is slower than with --trainer.devices {cores} or fewer",
            stacklevel=2,
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
    check_logger_package(name)
    if name == "TensorBoardLogger":
        if args.get("save_dir") in (None, "."):
            args["save_dir"] = run_dir
            if args.get("name") == "lightning_logs":
                args["name"] = "tensorboard"
            if args.get("version") is None:
                args["version"] = ""  # one event folder per run directory, continued on resume
    elif name == "WandbLogger":
        data, model = config.get("data", {}), config.get("model", {})
        method = _method_label(str(model.get("class_path", "FedAvg"))) if isinstance(model, Namespace) else "?"
        dataset, partition = _config_label(data.get("dataset")), _config_label(data.get("partition"))
        name = Path(run_dir).name
        if name.startswith(VERSION_PREFIX):
            name = f"{Path(run_dir).parent.name}_{name}"  # runs/quickstart/version_2: quickstart_version_2
        defaults = {
            "project": "fl_lightning",
            "name": name,
            "group": _wandb_text(f"{dataset}_{partition}"),
            "tags": [_wandb_text(tag) for tag in (method, dataset, partition, f"seed{config.get('seed_everything')}")],
        }
        for key, value in defaults.items():
            if args.get(key) is None:
                args[key] = value
        if args.get("save_dir") in (None, "."):
            args["save_dir"] = run_dir


def _method_of(model: Any) -> str | None:
    """The method name of a parsed ``model`` that is an fl_lightning method (``FedAvg`` or a subclass), else None."""
    cls = import_path(str(model.get("class_path", ""))) if isinstance(model, Namespace) else None
    return cls.method_name if isinstance(cls, type) and issubclass(cls, FedAvg) else None


def _method_label(class_path: str) -> str:
    """A model's class path as results name its method (``fl_lightning.FedNTD``: ``fedntd``, as ``summary.json``)."""
    return str(getattr(import_path(class_path), "method_name", None) or class_path.rpartition(".")[2].lower())


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


def _cli_class(args: Any, **attributes: Any) -> type[FLCLI]:
    """:class:`FLCLI` with ``attributes``, building only the parser of the subcommand that ``args`` names."""
    argv = sys.argv[1:] if args is None else args
    named = argv[0] if isinstance(argv, list) and argv and argv[0] in SUBCOMMANDS else None
    return type("FLCLI", (FLCLI,), {**attributes, "named": named})


def cli_main(args: list[str] | None = None, run: bool = True, overwrite: bool = False) -> FLCLI:
    """Build (and by default run) the command line; ``overwrite`` replaces a finished run in the run directory."""
    cli_class = _cli_class(args, overwrite=overwrite)
    RUNNING["claimed"], failed = None, True
    try:
        cli = cli_class(**_cli_kwargs(cli_class, args, run), trainer_defaults={"callbacks": [AtomicLastCheckpoint()]})
        failed = False
        return cli
    finally:
        # A fit claims its run directory before checking it (FLCLI.after_instantiate_classes); released however
        # the command ends. One refused once its config.yaml was written (by the module's setup) leaves no folder.
        if RUNNING.get("claimed") is not None:
            release_run_dir(RUNNING["claimed"], disposable=("config.yaml",) if failed else ())
            RUNNING["claimed"] = None
        if RUNNING.pop("run_dir_env", False):
            os.environ.pop(_RUN_DIR_ENV, None)


#: What each subcommand does, in ``fl-lightning --help`` and atop its own ``--help``.
SUBCOMMAND_HELP = {
    "fit": "Train a federation and write its results into its run directory (a new runs/<config name>/version_N, "
    "or --trainer.default_root_dir).",
    "validate": "Validate a trained global model on the validation data (--data.holdout_per_class or a DataSource's "
    "val; --ckpt_path <run dir>/checkpoints/last.ckpt).",
    "test": "Test a trained global model on the test data (--ckpt_path <run dir>/checkpoints/last.ckpt).",
}


#: The front door's own flags (:func:`fl_lightning.cli.main`), which ``fit --help`` lists after Lightning's options.
_FLAGS_HELP = (
    "fl_lightning's flags, anywhere on the command line: --overwrite replaces the run a directory holds (moved aside "
    "to <dir>.replaced-<time>); --debug shows an error's traceback (or FL_LIGHTNING_DEBUG=1). --ckpt_path last "
    "resumes the newest run of the same settings (or the named run directory's)."
)


def _cli_kwargs(cli_class: type[FLCLI], args: list[str] | None, run: bool) -> dict[str, Any]:
    """The arguments :class:`FLCLI` is built with, by :func:`cli_main` and :func:`resolve_config` alike."""
    return {
        "model_class": L.LightningModule,  # any module by class path; the methods by name too (method_names)
        "datamodule_class": FederatedDataModule,
        "subclass_mode_model": True,
        "seed_everything_default": 0,
        "save_config_callback": RunConfigSaver,
        "args": args,
        "run": run,
        "auto_configure_optimizers": False,
        "parser_class": HelpParser,  # its help formatter reaches --model.help CLASS too
        "parser_kwargs": _parser_kwargs(cli_class),
    }


def _parser_kwargs(cli_class: type[FLCLI]) -> dict[str, Any]:
    # Raise parse errors instead of printing the usage wall, so that main() can print the one line that matters; an
    # option is taken only by its whole name (`--federation.round` is refused, not read as `--federation.rounds`).
    return {
        "exit_on_error": False,
        "allow_abbrev": False,
        "description": "fl_lightning: federated learning on non-IID data with PyTorch Lightning.",
        **{
            sub: {
                "exit_on_error": False,
                "allow_abbrev": False,
                "description": SUBCOMMAND_HELP[sub],
                "epilog": _FLAGS_HELP if sub == "fit" else None,
            }
            for sub in cli_class.subcommands()
        },
    }


def resolve_config(args: list[str]) -> dict[str, Any]:
    """The resolved config that ``cli.py <args>`` would save as ``config.yaml``, without building or running anything.

    Args:
        args: the arguments after ``cli.py``, e.g. ``["fit", "--config", "configs/quickstart.yaml"]``.
    """
    cli_class = _cli_class(args, resolve_only=True)
    try:
        cli_class(**_cli_kwargs(cli_class, args, run=True))
    except _Resolved as resolved:
        return resolved.config
    raise RuntimeError("resolve_config: the CLI did not reach its config")  # pragma: no cover

"""The command line's arguments before the parser reads them, and what a parser's refusal of one should say.

Configs and methods by name (``--config quickstart``, ``--model fedntd``), a data source, partition, network or
server optimizer by class path (a server optimizer by name too), a config file's YAML checked with its line, the
logger packages a command needs, an option a later ``--config`` would set again (:func:`check_config_order`), the
default run location (:func:`run_base`) and the closest option to a misspelt one (:func:`closest_option`). Used by
:mod:`fl_lightning.lightning_cli`.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import yaml

from fl_lightning import (
    methods,  # registers the methods so that `--model FedNTD` resolves; `--model fedntd` goes through METHODS
    shipped_configs,
)
from fl_lightning.core import server_optim
from fl_lightning.core.files import read_yaml

#: ``cli.py``'s subcommands; a config file may hold its settings under a section of one (``fit: {trainer: ...}``).
SUBCOMMANDS = ("fit", "validate", "test")


def tensorboard_save_dir(argv: list[str]) -> list[str]:
    """``--trainer.logger TensorBoardLogger`` alone: give it the placeholder save_dir ``.`` (the run directory).

    TensorBoardLogger requires a save_dir when the arguments are parsed, before the run directory is known.
    """
    for i, arg in enumerate(argv[:-1]):
        given = any(a.startswith("--trainer.logger.save_dir") for a in argv)
        if arg == "--trainer.logger" and argv[i + 1].rsplit(".", 1)[-1] == "TensorBoardLogger" and not given:
            return [*argv[: i + 2], "--trainer.logger.save_dir", ".", *argv[i + 2 :]]
    return argv


def named_configs(argv: list[str]) -> list[str]:
    """``--config NAME``: a file as it is, else the shipped config of that name (:mod:`~fl_lightning.shipped_configs`).

    Raises:
        FileNotFoundError: neither a file nor a shipped config's name.
    """
    out = list(argv)
    for i, arg in enumerate(out):
        if arg in ("--config", "-c") and i + 1 < len(out):
            out[i + 1] = shipped_configs.resolve_config_arg(out[i + 1], arg)
            check_yaml(out[i + 1], arg)
            check_config_method(out[i + 1], arg)
        elif arg.startswith("--config="):
            out[i] = "--config=" + shipped_configs.resolve_config_arg(arg.split("=", 1)[1], "--config")
            check_yaml(out[i].split("=", 1)[1], "--config")
            check_config_method(out[i].split("=", 1)[1], "--config")
    return out


def check_config_method(value: str, option: str = "--config") -> None:
    """Refuse a config file whose ``model`` is a method's short name (``model: fedntd``), saying what to write.

    jsonargparse takes a config's class by its class name or path only; the short names (any case) are the command
    line's (:func:`method_names`). Without this, jsonargparse reads the name as a file: "Expected a path".

    Raises:
        ValueError: the config names a method as the command line would; the message gives the line to write.
    """
    data = _config_data(value) if Path(value).is_file() else None
    sections = [data, *(data.get(sub) for sub in SUBCOMMANDS)] if isinstance(data, dict) else []
    for section in sections:
        model = section.get("model") if isinstance(section, dict) else None
        if not isinstance(model, str) or "." in model:
            continue
        try:
            path = method_class_path(model, "model:")
        except ValueError as err:
            raise ValueError(f"{option} {value}: {err}") from None
        name = path.rsplit(".", 1)[1]
        if name != model:
            raise ValueError(
                f"{option} {value}: model: {model} is the command line's name for {name}; in a config file write "
                f"model: {name} (or class_path: {path} under model)"
            )


def check_yaml(value: str, option: str = "--config") -> None:
    """Refuse a config file that is not valid YAML, naming the file, the line and the column.

    Raises:
        ValueError: the file does not parse; the message says where and why.
    """
    if Path(value).is_file():  # else an inline config: jsonargparse reports it
        read_yaml(value, f"{option} {value}")


def _config_data(value: str) -> Any:
    """What a ``--config`` (or ``--trainer``) value holds: the file's YAML, or the value itself read as YAML."""
    try:
        text = Path(value).read_text() if Path(value).is_file() else value
        return yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError):
        return None


def _names_run_dir(data: Any) -> bool:
    """Whether a config (nested dict, at the top or under a subcommand) sets ``trainer.default_root_dir``."""
    if not isinstance(data, dict):
        return False
    trainer = data.get("trainer")
    if isinstance(trainer, dict) and trainer.get("default_root_dir") is not None:
        return True
    return any(_names_run_dir(data.get(sub)) for sub in SUBCOMMANDS)


def _is_shipped(value: str) -> bool:
    """Whether a ``--config`` file is one of the shipped configs (:func:`~fl_lightning.shipped_configs.config_dir`)."""
    try:
        return Path(value).resolve().is_relative_to(shipped_configs.config_dir().resolve())
    except OSError:
        return False


#: The options that name a fit's run directory on the command line.
_RUN_DIR_OPTIONS = ("--trainer.default_root_dir", "--fit.trainer.default_root_dir")


def _options(argv: list[str]) -> Iterator[tuple[str, str]]:
    """Each argument as ``(option, value)``: ``--a=b`` or ``--a b`` (the next argument; ``""`` at the end)."""
    for i, arg in enumerate(argv):
        option, _, value = arg.partition("=")
        yield option, value or (argv[i + 1] if i + 1 < len(argv) else "")


def run_base(argv: list[str]) -> Path | None:
    """Where a fit's run directories go when the command names none: ``runs/<config name>``, else ``runs/default``.

    Each fresh fit there takes a new ``version_N`` folder (:func:`fl_lightning.core.versions.claim_new_version`),
    so that runs of other methods, seeds or settings never meet. None when the run directory is named: by
    ``--trainer.default_root_dir`` on the command line, or by a config file of the user's (a run's own saved
    ``config.yaml`` among them). A shipped config's ``default_root_dir`` (``runs/<its name>``) names no directory of
    the user's: it is the default location.

    >>> run_base(["fit"]), run_base(["fit", "--trainer.default_root_dir", "runs/mine"])
    (PosixPath('runs/default'), None)
    """
    name = None
    for option, value in _options(argv):
        if option in _RUN_DIR_OPTIONS:
            return None
        if option == "--trainer" and _names_run_dir({"trainer": _config_data(value)}):
            return None
        if option in ("--config", "-c") and value:
            if not _is_shipped(value) and _names_run_dir(_config_data(value)):
                return None
            if name is None and Path(value).suffix in (".yaml", ".yml", ".json"):
                name = Path(value).stem
    return Path("runs") / (name or "default")


def saved_run_dir(argv: list[str]) -> Path | None:
    """The run directory whose own saved ``config.yaml`` the command gives with ``--config`` (where the file lies).

    So that ``--config <run>/config.yaml --ckpt_path last`` continues that run from any working directory, and after
    the run (or the project) was moved: the ``default_root_dir`` inside the file is where the run was written
    then. None when ``--trainer.default_root_dir`` names the directory, or no such file is given.
    """
    found = None
    for option, value in _options(argv):
        if option in _RUN_DIR_OPTIONS:
            return None
        if option in ("--config", "-c"):
            path = Path(value)
            run = path.parent
            if path.name == "config.yaml" and ((run / "summary.json").is_file() or (run / "checkpoints").is_dir()):
                found = run
    return found


def check_config_order(argv: list[str]) -> None:
    """Refuse an option that a ``--config`` given after it sets again, so that the file's value would be the one used.

    jsonargparse applies the arguments from left to right: ``fit --federation.rounds 1 --config quickstart`` trains
    the config's 20 rounds. An option given again after the file, and one the file does not set, is fine.

    Raises:
        ValueError: the option, the file and what to write instead.
    """
    subcommand = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    options = list(_options(argv))
    last: dict[str, tuple[int, str]] = {}  # an option's key -> where it is given last, and as written
    for i, (option, value) in enumerate(options):
        if (
            option.startswith("--")
            and not option.endswith(("+", ".help"))
            and option not in ("--config", "--print_config")
        ):
            shown = option if value.startswith("-") or not value else f"{option} {value}"
            last[_option_key(option, subcommand)] = (i, shown)
    for i, (option, value) in enumerate(options):
        if option not in ("--config", "-c"):
            continue
        data = _config_data(shipped_configs.resolve_config_arg(value, option))
        for key in sorted(_config_keys(data, subcommand)):
            before, shown = last.get(key, (len(options), ""))
            if before < i:
                raise ValueError(
                    f"{shown} comes before {option} {value}, which sets {key} again (options apply from left to "
                    f"right, so the file's value would be used): give {option} first, then {shown}"
                )


def _option_key(option: str, subcommand: str | None) -> str:
    """The key an option sets, as a config file nests it: ``--fit.model.init_args.beta`` -> ``model.beta``."""
    parts = option.removeprefix("--").split(".")
    if parts[0] == subcommand:
        parts = parts[1:]
    parts = [p for p in parts if p != "init_args"]
    return ".".join(parts[:-1] if parts[-1:] == ["class_path"] else parts)


def _config_keys(data: Any, subcommand: str | None) -> set[str]:
    """The keys a config file sets a value of (``federation.rounds``; ``model`` for its class), ``init_args`` left out.

    >>> sorted(_config_keys({"model": {"class_path": "FedNTD", "init_args": {"beta": 1}}, "trainer": {}}, "fit"))
    ['model', 'model.beta']
    """
    keys: set[str] = set()

    def walk(node: dict[Any, Any], prefix: str) -> None:
        for name, value in node.items():
            if not prefix and name in SUBCOMMANDS:
                continue
            if name == "init_args" and isinstance(value, dict):
                walk(value, prefix)
                continue
            key = prefix if name == "class_path" else f"{prefix}.{name}" if prefix else str(name)
            if isinstance(value, dict):
                walk(value, key)
            else:
                keys.add(key)

    if isinstance(data, dict):
        walk(data, "")
        if subcommand is not None and isinstance(data.get(subcommand), dict):
            walk(data[subcommand], "")
    return keys


def method_class_path(value: str, option: str = "--model") -> str:
    """A method named as in the results (``fedntd``, ``FedNTD``, ``fedlmd_tf``; any case) as its class path.

    A class path (``mypkg.MyMethod``), an inline class config (``{"class_path": ...}``) or the name of another
    imported ``LightningModule`` subclass is returned unchanged; an unknown name is refused with the closest method's
    name.

    >>> method_class_path("fedntd"), method_class_path("FedLMD-Tf")
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
    method = by_key.get(key(value))
    if method is not None:
        return f"{method.__module__}.{method.__qualname__}"
    if any(sub.__name__ == value for sub in _subclasses(L.LightningModule)):
        return value  # a module of your own that is imported: jsonargparse resolves it by name
    close = difflib.get_close_matches(key(value), list(by_key), n=1, cutoff=0.5)
    names = {key(short): short for short in methods.METHODS}
    hint = f"did you mean {names.get(close[0], by_key[close[0]].__name__)}? " if close else ""
    raise ValueError(
        f"{option} {value}: unknown method; {hint}the methods are {', '.join(methods.METHODS)} (any case), "
        f"or give a class path such as mypkg.MyMethod"
    )


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    direct: list[type] = type.__subclasses__(cls)
    for sub in direct:
        found += [sub, *_subclasses(sub)]
    return found


def method_names(argv: list[str]) -> list[str]:
    """``--model fedntd`` (and ``--model.help fedntd``) with the method's class path."""
    out = list(argv)
    options = ("--model", "--model.class_path", "--model.help")
    for i, arg in enumerate(out):
        if arg in options and i + 1 < len(out):
            out[i + 1] = method_class_path(out[i + 1], arg)
        elif "=" in arg and arg.split("=", 1)[0] in options:
            option, value = arg.split("=", 1)
            out[i] = f"{option}={method_class_path(value, option)}"
    return out


#: The options that take a built-in's name or a class of your own (one of the option's type).
CLASS_OPTIONS = ("--data.dataset", "--data.partition", "--model.net", "--federation.server_optimizer")


def class_paths(argv: list[str]) -> list[str]:
    """``--data.dataset mypkg.MyData`` and the other :data:`CLASS_OPTIONS` given a class path: the option's class.

    These options also take a built-in's name (which has no dot), as which jsonargparse would otherwise take the class
    path. A server optimizer's name (``fedadam``, ``FedAdam``, any case) becomes its class's path, so that its
    ``init_args`` can follow; an unknown one is refused with the names.

    >>> class_paths(["--data.partition", "mypkg.MyPartition", "--model.net=lenet"])
    ['--data.partition.class_path', 'mypkg.MyPartition', '--model.net=lenet']
    >>> class_paths(["--federation.server_optimizer", "fedyogi"])
    ['--federation.server_optimizer.class_path', 'fl_lightning.core.server_optim.FedYogi']
    """
    out = list(argv)
    for i, arg in enumerate(out):
        if arg in CLASS_OPTIONS and i + 1 < len(out):
            out[i], out[i + 1] = _class_path(arg, out[i + 1])
        elif "=" in arg and arg.split("=", 1)[0] in CLASS_OPTIONS:
            option, value = _class_path(*arg.split("=", 1))
            out[i] = f"{option}={value}"
    return out


def _class_path(option: str, value: str) -> tuple[str, str]:
    """(option, value) of one of :data:`CLASS_OPTIONS`: ``option.class_path`` for a class."""
    if option == "--federation.server_optimizer" and value.isidentifier() and value.lower() not in ("null", "none"):
        try:
            cls = server_optim.server_optimizer_class(value)
        except ValueError as err:
            if any(sub.__name__ == value for sub in _subclasses(server_optim.ServerOptimizer)):
                return option, value  # a server optimizer of yours that is imported: jsonargparse resolves it by name
            raise ValueError(f"{option}: {err}") from None
        value = f"{cls.__module__}.{cls.__qualname__}"
    if _CLASS_PATH.fullmatch(value):
        return f"{option}.class_path", value
    return option, value


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


def check_logger_package(logger: str) -> None:
    """Refuse a logger whose package is not installed, naming the ``pip install`` to run."""
    name = logger.rsplit(".", 1)[-1]
    modules, package = _LOGGER_PACKAGES.get(name, ((), ""))
    if modules and not any(_installed(m) for m in modules):
        extra = f" (or pip install 'fl_lightning[{package}]')" if package in ("wandb", "tensorboard") else ""
        raise ValueError(f"--trainer.logger {name} needs the {package} package: pip install {package}{extra}")


def check_logger_packages(argv: list[str]) -> None:
    """Refuse each ``--trainer.logger`` of the command line whose package is not installed."""
    for i, arg in enumerate(argv):
        if arg == "--trainer.logger" and i + 1 < len(argv):
            check_logger_package(argv[i + 1])
        elif arg.startswith("--trainer.logger="):
            check_logger_package(arg.split("=", 1)[1])


def closest_option(message: str, parser: argparse.ArgumentParser) -> str | None:
    """``did you mean --x?`` for the first unknown option a parser's refusal names, else None.

    The refusal is ``unrecognized arguments: --x ...`` (the command line) or ``Subcommand 'fit' does not accept
    option 'x'`` (a config file's key); the hint is the closest of the parser's options by spelling, first among those
    of the same group (``--federation.*``). A ``--<group>.help`` of a group that is no class (``--data.help``) gets
    where its options are listed.
    """
    in_config = re.match(r"Subcommand '\w+' does not accept option '([\w.]+)'", message)
    if in_config is not None:
        message = f"unrecognized arguments: --{in_config.group(1)}"
    if not message.startswith("unrecognized arguments:"):
        return None
    known = [option for option in parser._option_string_actions if option.startswith("--")]
    for token in message.split(":", 1)[1].split():
        option = token.split("=", 1)[0]
        if not option.startswith("--") or option in known:
            continue
        group = option.rsplit(".", 1)[0] + "." if "." in option else "--"
        if option.endswith(".help") and any(k.startswith(group) for k in known):  # `--data.help`: not a class
            helps = [k for k in known if k.startswith(group) and k.endswith(".help")]
            classes = f" (and {', '.join(f'{h} CLASS' for h in helps)} a class's)" if helps else ""
            return f"{group[:-1]} is not a class and has no .help: --help lists its options{classes}"
        for candidates in ([k for k in known if k.startswith(group)], known):
            close = difflib.get_close_matches(option, candidates, n=1, cutoff=0.6)
            if close:
                return f"did you mean {close[0]}?"
        return None
    return None


#: The data facts the command line passes to the model's ``__init__`` arguments of these names.
DATA_FACTS = ("num_classes", "in_channels", "image_size")


_NONE = object()  # no default (init_default)


def init_default(cls: type, name: str) -> Any:
    """The default of ``name`` in ``cls.__init__``, or of the first class in its MRO whose ``__init__`` names it.

    >>> from fl_lightning.methods import FedNTD
    >>> init_default(FedNTD, "num_classes"), init_default(FedNTD, "beta"), init_default(FedNTD, "no_such") is _NONE
    (None, 1.0, True)
    """
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            parameter = inspect.signature(init).parameters.get(name)
        except (TypeError, ValueError):
            continue
        if parameter is not None:
            return _NONE if parameter.default is inspect.Parameter.empty else parameter.default
    return _NONE


def _side_pair(size: Any) -> tuple[Any, ...]:
    """An image size as (height, width): a side alone is a square."""
    return tuple(size) if isinstance(size, list | tuple) else (size, size)


def check_data_facts(
    given: dict[str, Any], datamodule: Any, model_class: type | None = None, from_checkpoint: bool = False
) -> None:
    """Refuse a ``--model.<fact>`` that the data contradicts: the data's value, not the one given, reaches the model.

    Args:
        given: the model's ``init_args`` for :data:`DATA_FACTS` (None: not given).
        datamodule: the built datamodule, which holds the facts.
        model_class: the model's class: a value equal to its own default was not given, and is not checked (a
            ``LightningModule`` of the user's may default to ``num_classes=3``; the data's value replaces it).
        from_checkpoint: a checkpoint was given, whose hyper-parameters may be where the value came from.

    Raises:
        ValueError: ``--model.num_classes 5 disagrees with the data ...``.
    """
    for fact in DATA_FACTS:
        value, actual = given.get(fact), getattr(datamodule, fact, None)
        if value is None or actual is None:
            continue
        if model_class is not None and value == init_default(model_class, fact):
            continue
        if (_side_pair(value) == _side_pair(actual)) if fact == "image_size" else value == actual:
            continue
        data = f"the data ({getattr(datamodule, 'dataset', 'the dataset')} has {fact} {actual})"
        if from_checkpoint:
            raise ValueError(
                f"--model.{fact} {value} (given, or the checkpoint's) disagrees with {data}; give the data the "
                f"checkpoint's model was trained on, or leave --model.{fact} out"
            )
        raise ValueError(f"--model.{fact} {value} disagrees with {data}, whose value the model gets; leave it out")


def linked_option(message: str) -> str | None:
    """What to do when an option set from another one is given (``--trainer.max_epochs``), else None.

    >>> linked_option("argument federation.rounds --> trainer.max_epochs: invalid Optional value: '5'").split(";")[0]
    '--trainer.max_epochs is set from --federation.rounds (one epoch is one round)'
    """
    linked = re.fullmatch(r"argument (\S+) --> (\S+): .*", message.strip())
    if linked is None:
        return None
    source, target = linked.groups()
    why = " (one epoch is one round)" if target.endswith("max_epochs") else ""
    return f"--{target} is set from --{source}{why}; leave it out and set --{source}"


#: The seeds numpy (and so Lightning's ``seed_everything``) accepts.
SEED_RANGE = (0, 2**32 - 1)


def fixed_seed(seed: Any) -> Any:
    """``seed_everything`` as the data's and the federation's seed: a number in :data:`SEED_RANGE`.

    ``true`` (Lightning's random seed) is refused: the partition and every round's sampling derive from the seed, so a
    run must name it to be repeated and resumed.
    """
    if isinstance(seed, bool):
        raise ValueError(
            f"--seed_everything {str(seed).lower()}: the partition and the client sampling derive from the seed, "
            "so it must be a number (e.g. --seed_everything 0)"
        )
    if isinstance(seed, int) and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ValueError(f"--seed_everything {seed}: a seed must be between {SEED_RANGE[0]} and {SEED_RANGE[1]}")
    return seed


def missing_method(message: str) -> str | None:
    """What to do when a parser refuses a fit without a method (``required: fit.model``), else None."""
    if re.fullmatch(r"the following arguments are required: (\w+\.)?model", message.strip()) is None:
        return None
    return (
        f"no method: give --model NAME ({', '.join(methods.METHODS)}; any case) or a --config that sets one "
        "(fl-lightning configs lists the shipped ones)"
    )

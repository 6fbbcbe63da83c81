"""The configs that ship with fl_lightning, found by name: ``fl-lightning fit --config quickstart``.

They are the checkout's ``configs/`` folder, installed with the package as ``fl_lightning/configs/``
(``pyproject.toml``), so a pip install runs every README command and paper setting from any directory. A ``--config``
value that is an existing file is used as it is; otherwise it is looked up among the shipped configs, as a name
(``quickstart``, ``fedntd_fmnist_shard2``, ``compare/fmnist_ntd_setting``), with or without ``.yaml``, and with or
without the README's ``configs/`` prefix (so ``--config configs/quickstart.yaml`` works outside a checkout too).

``fl-lightning configs`` lists them, ``fl-lightning configs NAME`` prints one and ``fl-lightning configs --copy DIR``
copies them into a folder to edit.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import sys
from pathlib import Path

import yaml

_PACKAGE = Path(__file__).resolve().parent

#: Where a ``--config`` value may name a shipped config instead of a file: words, dots, dashes and slashes only.
_NAME = re.compile(r"[\w.\-/]+")


def config_dir() -> Path:
    """The folder of the shipped configs: ``fl_lightning/configs`` when installed, else the checkout's ``configs``."""
    installed = _PACKAGE / "configs"
    checkout = _PACKAGE.parent / "configs"
    if not installed.is_dir() and checkout.is_dir() and (_PACKAGE.parent / "pyproject.toml").is_file():
        return checkout
    return installed


def config_names() -> list[str]:
    """The shipped configs' names: runs first (``quickstart``, ...), then comparisons (``compare/...``)."""
    root = config_dir()
    if not root.is_dir():
        return []
    files = sorted(root.glob("*.yaml")) + sorted(root.glob("compare/*.yaml"))
    return [path.relative_to(root).with_suffix("").as_posix() for path in files if not path.name.startswith(".")]


def find_config(value: str) -> Path | None:
    """The shipped config that ``value`` names (``quickstart``, ``configs/quickstart.yaml``, ...), else None.

    >>> find_config("configs/quickstart.yaml") == find_config("quickstart") == config_dir() / "quickstart.yaml"
    True
    >>> find_config("no_such_config") is None
    True
    """
    name = value.strip().replace("\\", "/")
    name = name.removeprefix("./").removeprefix("configs/")
    name = name[: -len(".yaml")] if name.endswith(".yaml") else name[: -len(".yml")] if name.endswith(".yml") else name
    return config_dir() / f"{name}.yaml" if name in config_names() else None


def resolve_config_arg(value: str, option: str = "--config") -> str:
    """A ``--config`` value as a file to read: the file itself when it exists, else the shipped config it names.

    Raises:
        FileNotFoundError: ``value`` is neither a file nor a shipped config's name; the message suggests the
            closest name.
    """
    if Path(value).is_file() or not _NAME.fullmatch(value):
        return value  # a file, or an inline YAML/JSON config for jsonargparse
    found = find_config(value)
    if found is None:
        raise _not_shipped(value, option)
    return str(found)


def _not_shipped(value: str, option: str) -> FileNotFoundError:
    stem = Path(value).with_suffix("").as_posix().removeprefix("./").removeprefix("configs/")
    close = difflib.get_close_matches(stem, config_names(), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return FileNotFoundError(
        f"{option} {value}: no such file, and no config of fl_lightning has that name{hint} "
        f"(`fl-lightning configs` lists them)"
    )


def _description(path: Path) -> str:
    """A config's first comment line (what it runs)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
        if line.strip():
            break
    return ""


def config_copy(path: Path) -> str:
    """A shipped config's text as a copy of yours: without its ``trainer.default_root_dir`` (``runs/<its name>``).

    A shipped config's ``default_root_dir`` is its default location, the folder of its ``version_N`` runs; a copy that
    kept it would name that folder as its one run directory. Without it a copy's runs go to
    ``runs/<the copy's name>/version_N``.
    """
    text = path.read_text(encoding="utf-8")
    return re.sub(r"(?m)^  default_root_dir: runs/\S+\n", "", text, count=1)


def copy_configs(names: list[str], dest: Path) -> tuple[list[Path], list[Path]]:
    """Copy the named shipped configs (all when ``names`` is empty) into ``dest``; returns (copied, kept).

    A file that already exists in ``dest`` is kept as it is (it may hold your edits). A copied comparison spec
    (``compare/*.yaml``) runs the copies: each setting whose configs ``dest`` holds for every method of the spec names
    them there (``configs/{method}_x.yaml`` becomes ``<dest>/{method}_x.yaml``); any other still names the shipped ones.
    """
    wanted = names or config_names()
    copied: list[Path] = []
    kept: list[Path] = []
    for name in wanted:
        source = find_config(name)
        if source is None:
            raise _not_shipped(name, "configs")
        target = dest / source.relative_to(config_dir())
        if target.exists():
            kept.append(target)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(config_copy(source), encoding="utf-8")
        copied.append(target)
    for target in copied:
        if target.parent == dest / "compare":
            target.write_text(_spec_of_copies(target.read_text(encoding="utf-8"), dest), encoding="utf-8")
    return copied, kept


def _spec_of_copies(text: str, dest: Path) -> str:
    """A comparison spec's text with each setting whose configs ``dest`` holds (for all its methods) naming them."""
    spec = yaml.safe_load(text) or {}
    variants = spec.get("variants") or {}
    methods = [str((variants.get(m) or {}).get("method", m)) for m in spec.get("methods") or []]
    for setting, template in (spec.get("settings") or {}).items():
        if not isinstance(template, str) or not template.startswith("configs/"):
            continue
        ours = f"{dest.as_posix()}/{template.removeprefix('configs/')}"
        if methods and all(Path(ours.format(method=m, setting=setting)).is_file() for m in methods):
            text = re.sub(rf"(?m)^(  {re.escape(str(setting))}: ){re.escape(template)}$", rf"\g<1>{ours}", text)
    return text


def main(argv: list[str] | None = None) -> int:
    """``fl-lightning configs [NAME ...] [--copy DIR]``: list, print or copy the shipped configs."""
    parser = argparse.ArgumentParser(
        prog="fl-lightning configs",
        description="The configs that ship with fl_lightning: pass a name to --config (fl-lightning fit --config "
        "quickstart); list them, print one, or copy them into a folder to edit.",
    )
    parser.add_argument("names", nargs="*", help="configs to print (or to copy with --copy); none: list them all")
    parser.add_argument(
        "--copy",
        metavar="DIR",
        nargs="?",
        const="configs",
        help="copy the named configs (all when none is named) into DIR (default ./configs); existing files are kept",
    )
    args = parser.parse_args(argv)
    if args.copy is not None:
        copied, kept = copy_configs(args.names, Path(args.copy))
        print(f"copied {len(copied)} config(s) into {args.copy}" + (f"; kept {len(kept)} existing" if kept else ""))
        return 0
    if args.names:
        paths: list[Path] = []
        for name in args.names:
            path = find_config(name)
            if path is None:
                raise _not_shipped(name, "configs")
            paths.append(path)
        for path in paths:
            sys.stdout.write(config_copy(path))
        return 0
    root = config_dir()
    names = config_names()
    width = max((len(n) for n in names), default=0)
    room = max(40, shutil.get_terminal_size((120, 24)).columns - width - 5)

    def line(name: str) -> str:
        text = _description(root / f"{name}.yaml")
        return f"  {name:<{width}}  {text if len(text) <= room else text[: room - 3] + '...'}"

    runs = [n for n in names if not n.startswith("compare/")]
    print(f"Runs (fl-lightning fit --config NAME), from {root}:")
    print("\n".join(line(name) for name in runs))
    print("Comparisons (fl-lightning compare --config NAME):")
    print("\n".join(line(name) for name in names[len(runs) :]))
    print("fl-lightning configs NAME prints one; fl-lightning configs [NAME ...] --copy DIR copies them to edit.")
    return 0

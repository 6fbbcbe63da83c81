"""The command line's ``--help``: what an option takes, without walls of class names.

:class:`HelpParser` is the parser class LightningCLI builds (its ``parser_class``); its help formatter,
:class:`HelpFormatter`, also formats the help of ``--model.help CLASS``, whose parser jsonargparse builds as one of
the parser's own class. The formatter shortens an ``nn.Module`` option's "known subclasses" (every torch layer, some
230 names) to what a user can give.
"""

from __future__ import annotations

import argparse
from typing import Any

from jsonargparse import DefaultHelpFormatter
from lightning.pytorch.cli import LightningArgumentParser

__all__ = [
    "HelpFormatter",
    "HelpParser",
    "module_subclasses_listed",
    "network_help",
]


def network_help(argv: list[str]) -> list[str]:
    """``--model.net.help CLASS`` with no method before it: as FedAvg's (every method takes FedAvg's ``net``).

    jsonargparse has a class argument's help only once the class is known; without a method it answered
    ``--model: unrecognized arguments: --net.help=CLASS``.

    >>> network_help(["fit", "--model.net.help", "torch.nn.Linear"])
    ['fit', '--model', 'fl_lightning.module.FedAvg', '--model.net.help', 'torch.nn.Linear']
    """
    at = next((i for i, arg in enumerate(argv) if arg.split("=", 1)[0] == "--model.net.help"), None)
    given = ("--model", "--model.class_path", "--config", "-c")
    if at is None or any(arg.split("=", 1)[0] in given for arg in argv[:at]):
        return argv
    return [*argv[:at], "--model", "fl_lightning.module.FedAvg", *argv[at:]]


def module_subclasses_listed(extra_help: str) -> bool:
    """Whether jsonargparse's "known subclasses" text of an option lists ``torch.nn.Module`` itself (every layer)."""
    return "torch.nn.Module" in extra_help.replace(",", " ").replace(":", " ").split()


class HelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help formatter, with an ``nn.Module`` option's known subclasses in a line."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = super()._get_help_string(action)
        # jsonargparse appends an option's `extra_help()` (", known subclasses: ...") as it is.
        extra_help = getattr(action, "extra_help", None)
        listed = extra_help() if callable(extra_help) else ""
        if isinstance(listed, str) and listed and listed in text and module_subclasses_listed(listed):
            option = action.option_strings[0] if action.option_strings else f"--{action.dest}"
            shown = f", known subclasses: any torch.nn.Module by class path ({option}.help CLASS shows its options)"
            text = text.replace(listed, shown)
        return text


class HelpParser(LightningArgumentParser):
    """Lightning's parser, formatting its help with :class:`HelpFormatter` unless given another formatter."""

    def __init__(
        self, *args: Any, formatter_class: type[argparse.HelpFormatter] = HelpFormatter, **kwargs: Any
    ) -> None:
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

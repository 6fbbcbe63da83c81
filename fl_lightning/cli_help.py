"""The command line's ``--help``: what an option takes and whether fl_lightning uses it, without walls of class names.

:class:`HelpParser` is the parser class LightningCLI builds (its ``parser_class``); its help formatter,
:class:`HelpFormatter`, also formats the help of ``--model.help CLASS``, whose parser jsonargparse builds as one of
the parser's own class. The formatter shortens an ``nn.Module`` option's "known subclasses" (every torch layer, some
230 names) to what a user can give, and says which Trainer options a federation does not use, and why.
"""

from __future__ import annotations

import argparse
from typing import Any

from jsonargparse import DefaultHelpFormatter
from lightning.pytorch.cli import LightningArgumentParser

from fl_lightning import rules

__all__ = [
    "HelpFormatter",
    "HelpParser",
    "TRAINER_ACCEPTED",
    "TRAINER_NOTES",
    "module_subclasses_listed",
    "network_help",
]

#: The accepted value (the default) of each refused Trainer option, :data:`fl_lightning.rules.ROUND_OPTION_REASONS`.
TRAINER_ACCEPTED = {
    "fast_dev_run": "false",
    "overfit_batches": "0",
    "limit_train_batches": "1.0",
    "max_steps": "-1",
    "accumulate_grad_batches": "1",
    "val_check_interval": "1.0",
}

#: What ``--help`` says instead of Lightning's text for the Trainer options a federation does not use, by option.
TRAINER_NOTES: dict[str, str] = {
    **{
        f"trainer.{name}": f"Not used by fl_lightning (any value but {TRAINER_ACCEPTED[name]} is refused): {why}."
        for name, why in rules.ROUND_OPTION_REASONS.items()
    },
    "trainer.log_every_n_steps": "Not used by fl_lightning: metrics reach the loggers once a round, with the round "
    "as the step.",
    "trainer.reload_dataloaders_every_n_epochs": "Not used by fl_lightning: the federation gives every round its "
    "clients' data itself.",
}

#: Said after Lightning's own text of an option that fl_lightning's methods refuse (a plain module may use it).
_METHOD_NOTES = {
    "trainer.gradient_clip_val": "Refused with fl_lightning's methods, which step their own optimizer: give "
    "--model.clip_grad_norm.",
}


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


def _own_text(dest: str, text: str) -> str:
    """An option's own help text as fl_lightning's ``--help`` shows it (:data:`TRAINER_NOTES`, ``_METHOD_NOTES``)."""
    if dest in TRAINER_NOTES:
        return TRAINER_NOTES[dest]
    return f"{text} {_METHOD_NOTES[dest]}" if dest in _METHOD_NOTES else text


class HelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help formatter, with :data:`TRAINER_NOTES` and an ``nn.Module`` option's subclasses in a line."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = super()._get_help_string(action)
        own = action.help or ""
        if own and text.startswith(own):  # jsonargparse's: the option's own text, then "(type: ..., default: ...)"
            text = _own_text(action.dest, own) + text[len(own) :]
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

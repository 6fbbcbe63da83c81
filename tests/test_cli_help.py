"""What ``--help`` shows: what an option takes, whether a federation uses it, and where a class really lives."""

from __future__ import annotations

import pytest
import yaml
from jsonargparse import ArgumentParser, DefaultHelpFormatter
from torch import nn

from fl_lightning import rules
from fl_lightning.cli import EXIT_CODES, resolve_config, run
from fl_lightning.cli_help import TRAINER_ACCEPTED, TRAINER_NOTES, HelpParser, module_subclasses_listed


def _out(capsys: pytest.CaptureFixture[str]) -> str:
    return " ".join(capsys.readouterr().out.split())


def test_a_methods_help_says_what_its_network_takes_without_every_torch_layer(capsys):
    # Before: 736 lines, 233 of them torch.nn / torch.ao classes after "known subclasses:" under --model.net.
    assert run(["fit", "--model.help", "FedNTD"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) < 100
    assert "torch.nn.ReLU" not in out and "torch.ao." not in out
    text = " ".join(out.split())
    assert "``lenet``, ``cnn``" in text  # the built-in names (the docstring)
    # The parser of --model.help is jsonargparse's, built as one of the CLI's parser class (HelpParser): its formatter.
    assert "any torch.nn.Module by class path (--model.net.help CLASS shows its options)" in text, text[:2000]


def test_a_networks_help_needs_no_method_before_it(capsys):
    # Before: "error: --model: unrecognized arguments: --net.help=torch.nn.Linear" without a --model first.
    assert run(["fit", "--model.net.help", "torch.nn.Linear"]) == 0
    assert "--net.in_features" in _out(capsys)


def test_jsonargparse_still_lists_every_module_and_appends_the_list_as_it_is():
    """The assumptions :class:`~fl_lightning.cli_help.HelpFormatter` rests on; each fails naming what changed.

    jsonargparse appends an option's ``extra_help()`` (", known subclasses: ...") to its help as it is: the formatter
    replaces that text when it lists ``torch.nn.Module``. (That the parser of ``--model.help CLASS`` is built as one of
    the parser's own class, and so formats with ours, is what the ``--model.help FedNTD`` test shows.)
    """
    parser = ArgumentParser()
    parser.add_argument("--net", type=str | nn.Module, default="lenet", help="the network")
    action = next(a for a in parser._actions if a.dest == "net")
    listed = action.extra_help()  # type: ignore[attr-defined]
    assert module_subclasses_listed(listed) and "torch.nn.ReLU" in listed, f"jsonargparse now lists: {listed[:200]}"
    plain = DefaultHelpFormatter("cli.py")._get_help_string(action)
    assert plain.endswith(listed + ")"), f"jsonargparse no longer appends extra_help() as it is: {plain[:200]}"
    ours = HelpParser()
    ours.add_argument("--net", type=str | nn.Module, default="lenet", help="the network")
    assert "torch.nn.ReLU" not in ours.format_help()


def test_fit_help_marks_the_trainer_options_a_federation_does_not_use(capsys):
    # Before: Lightning's own text ("Runs n if set to ``n`` (int) else 1 ... to find any bugs"), then a refusal.
    assert run(["fit", "--help"]) == 0
    out = capsys.readouterr().out
    blocks = {b.split()[0]: " ".join(b.split()) for b in out.split("\n  --")[1:]}
    for dest in TRAINER_NOTES:
        assert blocks[dest].split(" ", 2)[2].startswith("Not used by fl_lightning"), blocks[dest]
    assert "to find any bugs" not in out
    assert "for a quick run use --federation.rounds 1" in blocks["trainer.fast_dev_run"]
    assert "give --model.clip_grad_norm" in blocks["trainer.gradient_clip_val"]


def test_every_refused_trainer_option_is_noted_with_a_value_it_accepts():
    assert {f"trainer.{name}" for name in rules.ROUND_OPTIONS} <= set(TRAINER_NOTES)
    for name in rules.ROUND_OPTIONS:
        rules.check_round_options({name: yaml.safe_load(TRAINER_ACCEPTED[name])})  # accepted: no refusal
    # The noted options keep their allowed values in a config, and print_config keeps them.
    config = resolve_config(
        ["fit", "--config", "quickstart", "--trainer.fast_dev_run", "false", "--trainer.max_steps", "-1"]
    )
    assert config["trainer"]["fast_dev_run"] is False and config["trainer"]["max_steps"] == -1


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            ["--model", "fl_lightning.FedNTD"],
            "error: --model: cannot import fl_lightning.FedNTD: module 'fl_lightning' has no attribute 'FedNTD'; "
            "did you mean fl_lightning.methods.FedNTD (or just FedNTD)?",
        ),
        (
            ["--data.partition", "fl_lightning.Dirichlet"],
            "error: --data.partition: cannot import fl_lightning.Dirichlet: module 'fl_lightning' has no attribute "
            "'Dirichlet'; did you mean fl_lightning.core.partitions.Dirichlet?",
        ),
        (
            ["--model", "fedavg", "--model.net", "torch.Linear"],
            "error: --model.net: module 'torch' has no attribute 'Linear'; did you mean torch.nn.Linear,",
        ),
        (
            ["--model", "fl_lightning.Nope"],
            "error: --model: cannot import fl_lightning.Nope: module 'fl_lightning' has no attribute 'Nope'",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_a_class_path_that_does_not_import_names_the_one_that_does(tmp_path, capsys, given, message):
    # Before: only "module 'fl_lightning' has no attribute 'FedNTD'", though the methods are in fl_lightning.methods.
    argv = ["fit", "--config", "quickstart", "--trainer.default_root_dir", str(tmp_path / "r"), *given]
    assert run(argv) == EXIT_CODES["bad input"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
    if "Nope" in message:
        assert "did you mean" not in err[0]


def test_a_groups_help_says_where_its_options_are(capsys):
    # Before: "error: unrecognized arguments: --data.help FederatedDataModule; did you mean --data.hflip?".
    assert run(["fit", "--data.help", "FederatedDataModule"]) == EXIT_CODES["bad input"]
    assert capsys.readouterr().err.strip() == (
        "error: unrecognized arguments: --data.help FederatedDataModule; --data is not a class and has no .help: "
        "--help lists its options (and --data.dataset.help CLASS, --data.partition.help CLASS a class's)"
    )

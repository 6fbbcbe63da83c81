"""A message that says which setting to change names it as both users write it: the command line and Python.

Before, many errors raised from the library (not the command line) named only the command line's option
(``lower num_clients (--data.num_clients)``, ``set --data.holdout_per_class 5``, ``choose another
--trainer.default_root_dir``), which a user of ``FederatedDataModule(...)`` or ``L.Trainer(...)`` does not write.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, bare_trainer, tiny_run

from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.core.messages import option, options
from fl_lightning.methods import FedSSD


def test_option_names_both_spellings() -> None:
    assert option("data.holdout_per_class", 5) == (
        "--data.holdout_per_class 5 (in Python FederatedDataModule(holdout_per_class=5))"
    )
    assert (
        option("data.drop_last", np.bool_(False))
        == "--data.drop_last false (in Python FederatedDataModule(drop_last=False))"
    )
    assert (
        option("data.num_clients", np.int64(10))
        == "--data.num_clients 10 (in Python FederatedDataModule(num_clients=10))"
    )
    assert option("federation.engine", "sequential", inside=True) == (
        "--federation.engine sequential, in Python Federation(engine='sequential')"
    )
    assert (
        option("trainer.default_root_dir") == "--trainer.default_root_dir (in Python L.Trainer(default_root_dir=...))"
    )
    assert option("model.net") == "--model.net (in Python the method's net=...)"
    assert (
        option("model.aux_per_class", 2, owner="FedSSD")
        == "--model.aux_per_class 2 (in Python FedSSD(aux_per_class=2))"
    )
    assert options("federation.group_size", "federation.memory_budget_gb", joint=" or ") == (
        "--federation.group_size or --federation.memory_budget_gb "
        "(in Python Federation(group_size=..., memory_budget_gb=...))"
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: option("num_clients"),  # no group
        lambda: option("logger.name"),  # a group with no Python spelling here
        lambda: options("data.batch_size", "federation.rounds"),  # two groups
    ],
)
def test_option_refuses_what_it_cannot_spell(call) -> None:
    with pytest.raises(ValueError, match="^options?: "):
        call()


def test_more_clients_than_samples_names_num_clients_in_python() -> None:
    dm = FederatedDataModule("digits", num_clients=5000, partition="iid")
    with pytest.raises(
        ValueError, match=r"lower --data.num_clients \(in Python FederatedDataModule\(num_clients=...\)\)$"
    ):
        dm.setup()


def test_an_impossible_shard_partition_names_both_spellings() -> None:
    dm = FederatedDataModule("digits", num_clients=3, partition="shard", shards_per_client=500)
    with pytest.raises(ValueError) as err:
        dm.setup()
    assert str(err.value).endswith(
        "lower shards_per_client or num_clients (--data.shards_per_client, --data.num_clients, in Python "
        "FederatedDataModule(shards_per_client=..., num_clients=...))"
    )


def test_a_holdout_that_takes_a_whole_class_names_both_spellings() -> None:
    dm = FederatedDataModule("digits", num_clients=2, partition="iid", holdout_per_class=1000)
    with pytest.raises(ValueError, match=r"lower --data.holdout_per_class \(in Python FederatedDataModule\("):
        dm.setup()


def test_a_holdout_too_small_for_fedssd_names_the_datamodule_and_the_method(tmp_path) -> None:
    with pytest.raises(ValueError) as err:
        tiny_run(tmp_path, FedSSD, rounds=1, data_kwargs={"holdout_per_class": 1}, model_kwargs={"aux_per_class": 3})
    assert str(err.value) == (
        "fedssd needs 3 server holdout samples per class; set --data.holdout_per_class 3 (in Python "
        "FederatedDataModule(holdout_per_class=3)) (it is 1) or lower --model.aux_per_class (in Python "
        "FedSSD(aux_per_class=...))"
    )
    assert not (tmp_path / "summary.json").exists()


def test_drop_last_with_clients_smaller_than_a_batch_names_both_spellings(tmp_path) -> None:
    with pytest.raises(ValueError) as err:
        tiny_run(tmp_path, rounds=1, data_kwargs={"drop_last": True, "batch_size": 1000})
    assert str(err.value).endswith(
        "set --data.drop_last false (in Python FederatedDataModule(drop_last=False)) or a smaller --data.batch_size "
        "(in Python FederatedDataModule(batch_size=...))"
    )


def test_a_default_root_dir_that_is_a_file_names_l_trainers_argument(tmp_path) -> None:
    taken = tmp_path / "a_file"
    taken.write_text("not a folder")
    dm = FederatedDataModule("digits", num_clients=2, partition="iid")
    model = FedAvg(net="lenet", num_classes=dm.num_classes, in_channels=dm.in_channels, image_size=dm.image_size)
    trainer = bare_trainer(taken, Federation(rounds=1, plots=False))
    with pytest.raises(ValueError) as err:
        trainer.fit(model, datamodule=dm)
    assert str(err.value).startswith(f"cannot write to {taken} (")
    assert str(err.value).endswith(
        "; choose another --trainer.default_root_dir (in Python L.Trainer(default_root_dir=...))"
    ), str(err.value)


def test_a_data_root_that_is_a_file_and_a_bad_cutout_name_both_spellings(tmp_path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(ValueError, match=r"\(--data.root, in Python FederatedDataModule\(root=...\)\)$"):
        FederatedDataModule("cifar10", root=str(afile), num_clients=2).setup()
    with pytest.raises(ValueError, match=r"set it between 0 and 7 \(--data.cutout, in Python FederatedDataModule\("):
        FederatedDataModule("digits", num_clients=2, cutout=9)


#: Modules whose messages only the command line produces (it parsed the options they name), and the functions of
#: shared modules that only the command line calls (a fit from Python checks its run directory otherwise).
CLI_ONLY_MODULES = ("cli", "lightning_cli", "experiments/", "flower/", "core/versions.py")
CLI_ONLY_FUNCTIONS = {
    "core/rundir.py": {
        "check_run_dir",
        "_check_resume",
        "_refuse_versioned_runs",
        "resolve_checkpoint",
        "load_checkpoint",
    }
}
_OPTION = re.compile(r"--(data|model|federation|trainer)\.")
#: What says the Python spelling too: "in Python ...", the class called ("Federation(lr_decay=1), --federation.lr_decay
#: 1"), or the command line's option named as such ("on the command line: --model.net mypkg.MyNet").
_BOTH = re.compile(r"in Python|command line|\b(Federation|FederatedDataModule|L\.Trainer)\(")


_SIMPLE = (ast.Raise, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr)


def _messages(path: Path) -> list[tuple[str, int, str]]:
    """(enclosing function, line, text) of each simple statement of ``path`` with a string: its constants joined.

    Docstrings (a statement of a string alone) are left out; a statement that calls ``option``/``options`` says "in
    Python" through them.
    """
    tree = ast.parse(path.read_text())
    found = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child.name)
            elif isinstance(child, _SIMPLE):
                if isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant):
                    continue  # a docstring
                walked = list(ast.walk(child))
                text = "".join(c.value for c in walked if isinstance(c, ast.Constant) and isinstance(c.value, str))
                if any(isinstance(c, ast.Call) and ast.unparse(c.func) in ("option", "options") for c in walked):
                    text += " in Python"
                found.append((func, child.lineno, text))
            else:
                visit(child, func)

    visit(tree, "")
    return found


def test_every_library_message_that_names_an_option_names_its_python_spelling() -> None:
    missing = []
    for path in sorted((ROOT / "fl_lightning").rglob("*.py")):
        name = str(path.relative_to(ROOT / "fl_lightning"))
        if name.startswith(CLI_ONLY_MODULES):
            continue
        for func, line, text in _messages(path):
            if func in CLI_ONLY_FUNCTIONS.get(name, ()) or not _OPTION.search(text):
                continue
            if not _BOTH.search(text):
                missing.append(f"{name}:{line} {text[:100]!r}")
    assert not missing, missing

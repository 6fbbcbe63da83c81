"""A new user's first hours: messages that say what to change, and docs that match what the code does."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import bare_trainer, quickstart_fit_args, tiny_run
from torch import nn

from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.cli import EXIT_CODES, run
from fl_lightning.cli_args import check_config_method
from fl_lightning.core.context import ClientContext, ServerContext
from fl_lightning.core.models import MODELS
from fl_lightning.methods import FedNTD

ROOT = Path(__file__).resolve().parent.parent


class _KDNoFlag(FedAvg):
    """Distils from the teacher but forgets ``uses_teacher = True``."""

    def client_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = self(x)
        return F.cross_entropy(z, y) + F.mse_loss(z, self.teacher_logits(x))


def test_teacher_logits_without_uses_teacher_says_to_set_it(tmp_path) -> None:
    # Before: "... has no teacher before its first client starts (the Federation callback refreshes it when
    # teacher_needed(client) is True)", which did not say what to write.
    with pytest.raises(RuntimeError, match=r"_KDNoFlag has no teacher: set `uses_teacher = True` on the class"):
        tiny_run(tmp_path, _KDNoFlag, rounds=1, data_kwargs={"num_clients": 2})


def test_config_short_name_message_gives_a_class_path_that_imports(tmp_path) -> None:
    # Before: "(or class_path: fl_lightning.FedNTD under model)", and fl_lightning has no attribute FedNTD.
    config = tmp_path / "c.yaml"
    config.write_text("model: fedntd\n")
    with pytest.raises(ValueError, match="model: fedntd is the command line's name for FedNTD") as err:
        check_config_method(str(config))
    path = re.search(r"class_path: (\S+) under model", str(err.value)).group(1)
    module, name = path.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name).__name__ == "FedNTD"


def test_cli_py_without_a_dependency_says_to_use_the_venv_in_one_line() -> None:
    # Before: `python cli.py fit ...` outside the venv ended with a traceback, ModuleNotFoundError: jsonargparse.
    hide = "import runpy, sys; sys.modules['jsonargparse'] = None; sys.argv = ['cli.py', 'fit']; "
    out = subprocess.run(
        [sys.executable, "-c", hide + "runpy.run_path('cli.py', run_name='__main__')"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr == (
        f"error: jsonargparse is not installed in this Python ({sys.executable}); run bash scripts/setup_venv.sh "
        "and use .venv/bin/python (or activate .venv)\n"
    )


def test_guide_commands_use_the_venvs_python() -> None:
    # Before: the guide's pages wrote bare `python cli.py`, README `.venv/bin/python cli.py`.
    for page in sorted((ROOT / "docs/source/guide").glob("*.md")):
        assert not re.search(r"(?<![/\w])python cli\.py", page.read_text()), page.name


def test_loading_a_checkpoint_of_your_own_network_says_to_pass_net(tmp_path) -> None:
    # Before: "unknown model 'torch.nn.modules.container.Sequential'; choose one of lenet, ...".
    dm = FederatedDataModule("digits", num_clients=2, batch_size=256)
    checkpoint = L.pytorch.callbacks.ModelCheckpoint(save_last=True, save_top_k=0)
    trainer = bare_trainer(tmp_path, Federation(rounds=1, plots=False), checkpoint, enable_checkpointing=True)
    trainer.fit(FedNTD(net=_own_net(), lr=0.05), datamodule=dm)
    path = tmp_path / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match=re.escape("FedNTD.load_from_checkpoint(path, net=MyNet())")) as err:
        FedNTD.load_from_checkpoint(path)
    assert "unknown model 'torch.nn.modules.container.Sequential': it names a network of your own" in str(err.value)
    assert isinstance(FedNTD.load_from_checkpoint(path, net=_own_net()).net, nn.Sequential)  # as the message says


def _own_net() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


def test_models_registry_refuses_a_network_instance() -> None:
    # Before: MODELS["inst"] = nn.Linear(64, 10) was accepted (an nn.Module is callable), and every fit by that name
    # shared (or failed on) the one network.
    with pytest.raises(TypeError, match=r"MODELS\['inst'\] .*got a built Linear; register a function or class") as err:
        MODELS["inst"] = nn.Linear(64, 10)
    assert "\n" not in str(err.value) and "inst" not in MODELS
    MODELS["inst"] = lambda channels, size, classes: nn.Linear(channels * size * size, classes)  # a builder: accepted
    del MODELS["inst"]


def test_a_methods_option_before_the_method_says_to_give_the_method_first(tmp_path, capsys) -> None:
    # Before: "error: --model.beta: FedAvg has no option beta", while the other order works.
    args = quickstart_fit_args(tmp_path / "r", "--model.beta", "0.5", "--model", "fedntd", rounds=1)
    assert run(args) == EXIT_CODES["bad input"]
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --model.beta: FedAvg has no option beta; it is an option of ")
    assert "FedNTD" in line and line.endswith(": give --model <method> before its options")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--federation.sample_ratio", "0"],
            "error: sample_ratio must be in (0, 1], got 0.0; give a fraction of the clients "
            "(--federation.sample_ratio, in Python Federation(sample_ratio=...))",
        ),
        (
            ["--data.batch_size", "0"],
            "error: batch sizes must be positive, got batch_size=0 and eval_batch_size=1024; give at least 1 "
            "(--data.batch_size, --data.eval_batch_size, in Python FederatedDataModule(batch_size=..., "
            "eval_batch_size=...))",
        ),
        (
            ["--data.partition", "shard", "--data.shards_per_client", "500"],
            "lower shards_per_client or num_clients (--data.shards_per_client, --data.num_clients, in Python "
            "FederatedDataModule(shards_per_client=..., num_clients=...))",
        ),
        (["--model", "fedavgx"], "error: --model fedavgx: unknown method; did you mean fedavg? the methods are "),
    ],
)
def test_a_bad_value_names_its_option(tmp_path, capsys, args, message) -> None:
    # Before: "sample_ratio must be in (0, 1], got 0.0", "batch sizes must be positive, got 0 and 1024", "lower
    # shards_per_client or num_clients" named no option; "unknown method; The methods..." had a stray capital.
    assert run(quickstart_fit_args(tmp_path / "r", *args, rounds=1)) == EXIT_CODES["bad input"]
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert message in line and line.startswith("error: ")


class _Rounds(FedAvg):
    """Records the round its contexts carry."""

    seen: list[tuple[str, int]] = []

    def on_round_start(self, server: ServerContext) -> dict:
        self.seen.append(("server", server.round))
        return {}

    def on_client_start(self, client: ClientContext) -> None:
        self.seen.append(("client", client.round))


def test_hook_contexts_rounds_are_0_based_as_rounds_md_says(tmp_path) -> None:
    _Rounds.seen = []
    tiny_run(tmp_path, _Rounds, rounds=2, data_kwargs={"num_clients": 1})
    assert _Rounds.seen == [("server", 0), ("client", 0), ("server", 1), ("client", 1)]
    table = (ROOT / "docs/source/rounds.md").read_text()
    assert "`ServerContext`: `round` (0-based" in table and "`ClientContext`: `round` (0-based" in table


def test_your_code_snippet_pastes_whole_without_resuming_a_completed_run() -> None:
    # Before: the snippet ran trainer.fit(..., ckpt_path="last") right after the completed fit: RunDirError.
    text = (ROOT / "docs/source/guide/your_code.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        resumes = [line for line in block.splitlines() if 'ckpt_path="last"' in line]
        assert all(line.lstrip().startswith("#") for line in resumes), resumes


NEEDS_CLASSES = """
from torch import nn


class NeedsClasses(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))

    def forward(self, x):
        return self.body(x)
"""


def test_your_network_needing_num_classes_is_told_and_given_as_the_docs_say(tmp_path, capsys, monkeypatch) -> None:
    # Before: "error: --model.net: the following arguments are required: num_classes", and no page said how.
    (tmp_path / "fl_new_user_nets.py").write_text(NEEDS_CLASSES)
    monkeypatch.syspath_prepend(str(tmp_path))
    net = ("--model.net", "fl_new_user_nets.NeedsClasses")
    assert run(quickstart_fit_args(tmp_path / "r", *net, rounds=1)) == EXIT_CODES["bad input"]
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --model.net: the following arguments are required: num_classes; give "
        "--model.net.init_args.num_classes <value>"
    ]
    assert run(quickstart_fit_args(tmp_path / "r", *net, "--model.net.init_args.num_classes", "10", rounds=1)) == 0
    assert "--model.net mypkg.MyNet --model.net.init_args.num_classes 10" in (
        ROOT / "docs/source/guide/your_code.md"
    ).read_text().replace("\n  ", " ")

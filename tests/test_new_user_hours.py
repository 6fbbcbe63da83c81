"""A new user's first hours: messages that say what to change, and docs that match what the code does."""

from __future__ import annotations

import importlib
import re

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_run

from fl_lightning import FedAvg
from fl_lightning.cli_args import check_config_method


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

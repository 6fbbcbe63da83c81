"""A new user's first hours: messages that say what to change, and docs that match what the code does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_run

from fl_lightning import FedAvg


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

"""CPU checks of paths that otherwise only run on a GPU: 16-mixed's scaler under Flower, bf16 in Flower messages,
and the batched engine's memory-chosen group size across processes."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("flwr")

from helpers import ROOT  # noqa: E402

QUICKSTART = str(ROOT / "configs/quickstart.yaml")
TINY = "--data.num_clients 3 --federation.rounds 1 --trainer.enable_progress_bar false --federation.plots false"


def test_flower_local_update_steps_through_the_gradient_scaler(monkeypatch) -> None:
    """16-mixed on a GPU: the ClientApp's local steps go through the precision plugin's GradScaler, as a fit's do."""
    from flwr.app import ConfigRecord, RecordDict
    from lightning.pytorch.plugins.precision import MixedPrecision

    from fl_lightning import rules
    from fl_lightning.flower.build import attach, build
    from fl_lightning.flower.client_app import local_update
    from fl_lightning.flower.messages import put_tree, put_weights

    setup = build(QUICKSTART, TINY)
    scaler = torch.amp.GradScaler("cpu")  # what Lightning builds for 16-mixed (on CUDA); CPU autocast runs fp16
    setup.trainer.strategy.precision_plugin = MixedPrecision("16-mixed", "cpu", scaler=scaler)
    monkeypatch.setattr(rules, "CPU_PRECISIONS", (*rules.CPU_PRECISIONS, "16-mixed"))  # the GPU's, emulated
    attach(setup)
    content = RecordDict()
    put_weights(content, "global", setup.module.state_dict())
    put_tree(content, "payload", {})
    content["plan"] = ConfigRecord(
        {"round": 0, "client": 0, "steps": 3, "local_epochs": 1, "lr_scale": 1.0, "weight": 1.0}
    )
    local_update(setup, content, None)
    assert scaler._scale is not None, "the local update never scaled a loss"


def test_flower_messages_carry_bf16_exactly() -> None:
    from flwr.app import RecordDict

    from fl_lightning.flower.messages import get_tree, get_weights, put_tree, put_weights

    w = {"a": torch.randn(5).bfloat16(), "b": torch.randn(3), "n": torch.tensor(7)}
    content = RecordDict()
    put_weights(content, "w", w)
    put_tree(content, "t", {"c": [w["a"], 2.5]})
    back, tree = get_weights(content, "w"), get_tree(content, "t")
    for k, v in w.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v)
    assert tree["c"][0].dtype == torch.bfloat16 and torch.equal(tree["c"][0], w["a"]) and tree["c"][1] == 2.5


def test_memory_chosen_group_is_agreed_by_every_process(monkeypatch) -> None:
    """Each process offers its own fitted group (one that measured nothing offers its current one): all take the min."""
    import fl_lightning.core.distributed as distributed
    from fl_lightning import Federation
    from fl_lightning.core.gpu_memory import StackedMemory

    offered = []

    def gather(value):
        offered.append(value)
        return [value, 2]  # another process fitted 2

    monkeypatch.setattr(distributed, "is_distributed", lambda: True)  # agreed_min asks the processes
    monkeypatch.setattr(distributed, "all_gather_object", gather)
    fed = Federation(rounds=2, plots=False, engine="batched")

    class Executor:
        memory = StackedMemory()  # this process trained only padding: nothing measured

    class Recorder:
        info: dict = {}

        def say(self, trainer, line):
            pass

    fed.executor, fed.recorder, fed._budget, fed.client_group = Executor(), Recorder(), float(2**30), 5
    fed._fit_group_to_memory(trainer=None)
    assert offered == [5] and fed.client_group == 2

"""The server step inside a federation: server optimizers chosen like client steps, composed with methods, resumed."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from helpers import read_metrics, read_summary, tiny_run

from fl_lightning import FedAdam, FedAvg, Federation, FedYogi, ServerSGD


class _Initial(L.Callback):
    """Keeps the global weights the first round starts from."""

    def on_train_start(self, trainer, pl_module):
        self.weights = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}


class _Shifted(FedAvg):
    """A method whose server step moves every parameter of the average by +0.01."""

    def server_update(self, server, average, uploads):
        return {k: v + 0.01 if k in server.param_keys else v for k, v in average.items()}


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same_metrics(a, b):
    for x, y in zip(read_metrics(a), read_metrics(b), strict=True):
        for key in x:
            if key not in ("round_seconds", "elapsed_seconds"):
                assert x[key] == y[key], (key, x[key], y[key])


def test_short_options_are_a_server_sgd(tmp_path):
    tiny_run(tmp_path / "short", rounds=3, fed_kwargs={"server_lr": 0.8, "server_momentum": 0.9})
    _, fed, model = tiny_run(tmp_path / "object", rounds=3, fed_kwargs={"server_optimizer": ServerSGD(0.8, 0.9)})
    _same_metrics(tmp_path / "short", tmp_path / "object")
    tiny_run(tmp_path / "plain", rounds=3)
    assert read_metrics(tmp_path / "plain")[-1]["global_loss"] != read_metrics(tmp_path / "short")[-1]["global_loss"]
    # one momentum buffer per trainable parameter
    assert set(fed.server_optimizer.state) == {k for k, p in model.named_parameters() if p.requires_grad}


def test_fedadam_round_is_algorithm_2_applied_to_the_average(tmp_path):
    initial = _Initial()
    _, _, plain = tiny_run(tmp_path / "avg", rounds=1, callbacks=[initial])
    w0, average = initial.weights, _params(plain)
    _, _, adam = tiny_run(tmp_path / "adam", rounds=1, fed_kwargs={"server_optimizer": FedAdam(lr=0.03, tau=1e-3)})
    for key, value in adam.state_dict().items():
        delta = average[key].float() - w0[key].float()  # Δ_1: the averaged client update
        m = 0.1 * delta  # m_1 = β1·0 + (1 − β1)·Δ
        v = 0.99 * 1e-6 + 0.01 * delta**2  # v_1 = β2·τ² + (1 − β2)·Δ²
        torch.testing.assert_close(value, w0[key] + 0.03 * m / (v.sqrt() + 1e-3), rtol=1e-5, atol=1e-6)


def test_the_server_optimizer_steps_on_the_methods_server_update(tmp_path):
    initial = _Initial()
    _, _, shifted = tiny_run(tmp_path / "identity", method=_Shifted, rounds=1, callbacks=[initial])
    _, _, half = tiny_run(tmp_path / "half", method=_Shifted, rounds=1, fed_kwargs={"server_lr": 0.5})
    w0, target = initial.weights, _params(shifted)
    for key, value in half.state_dict().items():
        torch.testing.assert_close(value, w0[key] + 0.5 * (target[key] - w0[key]), rtol=1e-5, atol=1e-6)


def test_resume_with_an_adaptive_server_optimizer_is_exact(tmp_path):
    yogi = {"server_optimizer": FedYogi(lr=0.02)}
    tiny_run(tmp_path / "full", rounds=4, fed_kwargs=yogi)
    tiny_run(tmp_path / "cut", rounds=2, fed_kwargs={"server_optimizer": FedYogi(lr=0.02)})
    saved = torch.load(tmp_path / "cut" / "checkpoints" / "last.ckpt", weights_only=False)
    (state,) = [v for k, v in saved["callbacks"].items() if k.startswith("Federation")]
    assert state["server_optimizer"]["optimizer"] == "FedYogi" and state["server_optimizer"]["steps"] == 2
    assert all(set(entry) == {"m", "v"} for entry in state["server_optimizer"]["state"].values())
    tiny_run(tmp_path / "cut", rounds=4, fed_kwargs={"server_optimizer": FedYogi(lr=0.02)}, ckpt_path="last")
    assert read_summary(tmp_path / "cut")["status"] == "completed"
    _same_metrics(tmp_path / "full", tmp_path / "cut")


def test_one_server_learning_rate():
    with pytest.raises(ValueError, match="give the server step once"):
        Federation(server_lr=0.5, server_optimizer=FedAdam())
    with pytest.raises(ValueError, match="momentum"):
        Federation(server_momentum=1.0)
    assert Federation().server_optimizer.is_identity
    assert not Federation(server_lr=0.5).server_optimizer.is_identity

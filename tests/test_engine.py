"""The federation engine: aggregation arithmetic, one-fit federations, resume, divergence, bad input."""

from __future__ import annotations

import math
import signal
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from helpers import bare_trainer, read_metrics, read_summary, tiny_run

from fl_lightning import FedAvg, FederatedDataModule, Federation
from fl_lightning.core.aggregation import StateAccumulator, aggregation_weights, weighted_average
from fl_lightning.core.batches import RoundBatches
from fl_lightning.core.rounds import RoundPlan, client_steps


class TestAggregation:
    def test_weighted_average_hand_computed(self):
        # Prepare: two clients with 1 and 3 samples
        a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor(0.0), "n": torch.tensor(7)}
        b = {"w": torch.tensor([5.0, -2.0]), "b": torch.tensor(4.0), "n": torch.tensor(9)}
        # Execute
        out = weighted_average([a, b], aggregation_weights([1, 3]))
        # Assert: 0.25*a + 0.75*b; integer buffer from the first client
        assert out["w"].tolist() == [4.0, -1.0]
        assert out["b"].item() == 3.0
        assert out["n"].item() == 7 and out["n"].dtype == torch.int64

    def test_uniform_weights(self):
        assert aggregation_weights([10, 30, 60], "uniform") == pytest.approx([1 / 3] * 3)
        out = weighted_average(
            [{"w": torch.tensor(0.0)}, {"w": torch.tensor(3.0)}], aggregation_weights([1, 9], "uniform")
        )
        assert out["w"].item() == pytest.approx(1.5)

    def test_accumulator_restores_dtype(self):
        acc = StateAccumulator()
        acc.add({"w": torch.tensor([1.0], dtype=torch.float16)}, 0.5)
        acc.add({"w": torch.tensor([3.0], dtype=torch.float16)}, 0.5)
        assert acc.result({"w": torch.float16})["w"].dtype == torch.float16
        assert acc.result({"w": torch.float16})["w"].item() == 2.0

    @pytest.mark.parametrize("bad", [[], [0, 0]])
    def test_bad_weights(self, bad):
        with pytest.raises(ValueError):
            aggregation_weights(bad)

    def test_unknown_scheme(self):
        with pytest.raises(ValueError, match="uniform"):
            aggregation_weights([1], "median")


def test_round_is_average_of_clients(tmp_path):
    """After one round with every client, the global weights equal the sample-weighted mean of the local models."""
    local = {}

    class Spy(L.Callback):
        """Placed before Federation, so it sees each client's weights before they are averaged."""

        def __init__(self, fed):
            self.fed = fed

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            # one training batch is one client's whole local update
            local[self.fed.plan(trainer.current_epoch).clients[batch_idx]] = {
                k: v.clone() for k, v in pl_module.state_dict().items()
            }

    dm = FederatedDataModule("digits", num_clients=3, partition="iid", batch_size=64)
    model = FedAvg(net="lenet", num_classes=10, in_channels=1, image_size=8, lr=0.05)
    fed = Federation(rounds=1)
    bare_trainer(tmp_path, Spy(fed), fed, max_epochs=1).fit(model, datamodule=dm)
    expected = weighted_average([local[c] for c in range(3)], aggregation_weights(dm.client_sizes))
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, expected[name].to(value.dtype))
    assert not torch.equal(local[0]["net.classifier.weight"], local[1]["net.classifier.weight"])


def test_digits_federation_learns_and_writes_results(tmp_path):
    trainer, fed, _ = tiny_run(tmp_path, rounds=6, fed_kwargs={"local_epochs": 4}, plots=True)
    rows = read_metrics(tmp_path)
    assert [int(r["round"]) for r in rows] == list(range(1, 7))
    accs = [float(r["global_acc"]) for r in rows]
    assert accs[-1] > 0.85, accs
    assert accs[-1] > accs[0]
    for key in ("global_loss", "lr", "round_seconds", "acc_class_0", "acc_class_9", "forgetting"):
        assert key in rows[0]
    summary = read_summary(tmp_path)
    assert summary["status"] == "completed"
    assert summary["method"] == "fedavg" and summary["dataset"] == "digits"
    assert summary["best_acc"] == pytest.approx(max(accs))
    assert summary["final_acc"] == pytest.approx(accs[-1])
    assert summary["rounds"] == 6 and summary["num_clients"] == 5
    for name in ("partition.csv", "partition.png", "curve.png"):
        assert (tmp_path / name).stat().st_size > 0
    # one fit for the whole federation: the trainer ran exactly `rounds` epochs
    assert trainer.current_epoch == 6


def test_sampling_and_lr_decay(tmp_path):
    _, fed, _ = tiny_run(
        tmp_path, rounds=3, data_kwargs={"num_clients": 8}, fed_kwargs={"sample_ratio": 0.25, "lr_decay": 0.5}
    )
    rows = read_metrics(tmp_path)
    assert [int(r["clients"]) for r in rows] == [2, 2, 2]
    assert [float(r["lr"]) for r in rows] == pytest.approx([0.05, 0.025, 0.0125])
    plans = [fed.plan(r).clients for r in range(3)]
    assert all(len(set(p)) == 2 for p in plans)
    assert len(set(plans)) > 1  # different clients in different rounds


def test_same_seed_same_result(tmp_path):
    tiny_run(tmp_path / "a", rounds=2)
    tiny_run(tmp_path / "b", rounds=2)
    assert read_metrics(tmp_path / "a")[-1]["global_acc"] == read_metrics(tmp_path / "b")[-1]["global_acc"]


class _InterruptAt(L.Callback):
    """Raises KeyboardInterrupt (what Ctrl-C does) at the start of a round, after the previous round's checkpoint."""

    def __init__(self, round_idx: int) -> None:
        self.round_idx = round_idx

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.round_idx:
            raise KeyboardInterrupt


def test_resume_after_interrupt_is_identical(tmp_path):
    full_trainer, _, _ = tiny_run(tmp_path / "full", rounds=4, fed_kwargs={"lr_decay": 0.9})
    full_steps = full_trainer.global_step
    assert full_steps > 0
    # Lightning turns Ctrl-C into a graceful shutdown and exit(1), and ignores further SIGINTs: undo that after.
    try:
        with pytest.raises(SystemExit):
            tiny_run(tmp_path / "cut", rounds=4, fed_kwargs={"lr_decay": 0.9}, callbacks=[_InterruptAt(2)])
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert read_summary(tmp_path / "cut")["status"] == "interrupted"
    assert len(read_metrics(tmp_path / "cut")) == 2
    assert (tmp_path / "cut" / "checkpoints" / "last.ckpt").exists()
    trainer, _, _ = tiny_run(tmp_path / "cut", rounds=4, fed_kwargs={"lr_decay": 0.9}, ckpt_path="last")
    assert trainer.global_step == full_steps  # restored, not restarted
    full, resumed = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")
    assert len(resumed) == 4
    for a, b in zip(full, resumed, strict=True):
        for key in a:
            if key not in ("round_seconds", "elapsed_seconds"):
                assert a[key] == b[key], (key, a[key], b[key])
    assert read_summary(tmp_path / "cut")["status"] == "completed"


class _Exploding(FedAvg):
    def client_loss(self, x, y):
        loss = super().client_loss(x, y)
        if self.client is not None and self.client.round == 1:
            return loss * float("nan")
        return loss


def test_divergence_stops_with_status(tmp_path):
    trainer, fed, model = tiny_run(tmp_path, method=_Exploding, rounds=4)
    summary = read_summary(tmp_path)
    assert summary["status"] == "diverged"
    assert len(read_metrics(tmp_path)) == 1  # round 1 evaluated, round 2 diverged
    assert trainer.current_epoch < 4
    # the model keeps the last finite global weights
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())
    assert not math.isnan(summary["best_acc"])


class _Collapsing(FedAvg):
    """From round 3 on the server zeroes the global model: equal logits, one predicted class, chance accuracy."""

    def server_update(self, server, average, uploads):
        if server.round >= 2:
            return {k: torch.zeros_like(v) if v.is_floating_point() else v for k, v in average.items()}
        return average


def test_collapse_to_one_class_stops_as_diverged(tmp_path):
    trainer, fed, _ = tiny_run(tmp_path, _Collapsing, rounds=8, fed_kwargs={"local_epochs": 3, "collapse_rounds": 3})
    summary = read_summary(tmp_path)
    assert summary["status"] == "diverged"
    assert summary["diverged_round"] == 3  # the first collapsed round
    assert len(read_metrics(tmp_path)) == 5  # rounds 3, 4 and 5 collapsed, then it stopped
    assert fed.history[1]["global_acc"] > 0.4 and fed.history[-1]["global_acc"] < 0.2  # learning, then collapsed
    # the same federation with the check off runs past round 5 to its end
    off = {"local_epochs": 3, "collapse_rounds": None}
    _, fed_off, _ = tiny_run(tmp_path / "off", _Collapsing, rounds=6, fed_kwargs=off)
    assert fed_off.status == "completed" and len(fed_off.history) == 6


class _PredictsThePrior(FedAvg):
    """From round 2 on the server keeps only the output bias, set to the log of the test labels' frequencies: the model
    ignores its input and predicts the most frequent class, at the lowest loss an input-blind model reaches."""

    log_prior: torch.Tensor

    def server_update(self, server, average, uploads):
        if server.round < 1:
            return average
        out = {k: torch.zeros_like(v) if v.is_floating_point() else v for k, v in average.items()}
        out["net.classifier.bias"] = self.log_prior.clone()
        return out


def test_a_model_that_ignores_its_input_is_a_collapse_on_skewed_labels(tmp_path):
    """Its test loss, the labels' entropy, is below ln 10 when the classes are uneven: still a collapse."""
    from fl_lightning.core.datasets import load_dataset
    from fl_lightning.core.metrics import label_entropy

    data = load_dataset("digits")
    keep = (data.test_y < 2) | (torch.arange(len(data.test_y)) % 4 == 0)  # every 0 and 1, a quarter of the others
    test_x, test_y = data.test_x[keep], data.test_y[keep]
    counts = np.bincount(test_y.numpy(), minlength=10)
    assert label_entropy(counts) < math.log(10) - 0.1
    model = _PredictsThePrior(net="lenet", lr=0.05)
    model.log_prior = torch.log(torch.tensor(counts / counts.sum(), dtype=torch.float32))
    dm = FederatedDataModule.from_tensors(data.train_x, data.train_y, test_x, test_y, num_clients=3)
    fed = Federation(rounds=6, collapse_rounds=3, plots=False)
    bare_trainer(tmp_path, fed).fit(model, datamodule=dm)
    assert fed.status == "diverged" and fed.recorder is not None and fed.recorder.diverged_round == 2
    assert fed.history[-1]["global_loss"] == pytest.approx(label_entropy(counts), rel=1e-5)  # below ln 10


def test_a_slow_start_predicting_one_class_is_not_a_collapse(tmp_path):
    """One or two local steps a client a round: the global model predicts one class for rounds while its test loss falls
    below what ignoring the input reaches (about ln 10 on digits' stratified test set): it is learning, and runs past
    the default 10 rounds."""
    data = {"num_clients": 20, "alpha": 0.5, "batch_size": 64}
    _, fed, _ = tiny_run(tmp_path, rounds=12, data_kwargs=data, fed_kwargs={"sample_ratio": 0.5})
    assert fed.status == "completed" and len(fed.history) == 12
    assert all(row["global_acc"] == pytest.approx(0.1, abs=0.002) for row in fed.history)  # one class right
    losses = [row["global_loss"] for row in fed.history]
    assert losses[0] > math.log(10) > losses[-1] and losses == sorted(losses, reverse=True)
    # right on one class in every round: without the loss's test, a collapse from round 1 that stopped at round 10
    assert fed.recorder is not None and fed.recorder.collapsed_since(10, np.full(10, 36)) is None
    assert all(int((np.asarray(c) > 0).sum()) == 1 for c in fed.recorder.class_acc_history)


def test_a_one_class_test_set_is_never_a_collapse(tmp_path):
    from fl_lightning.core.datasets import load_dataset

    data = load_dataset("digits")
    only_zeros = data.test_y == 0
    dm = FederatedDataModule.from_tensors(
        data.train_x, data.train_y, data.test_x[only_zeros], data.test_y[only_zeros], num_clients=3, batch_size=64
    )
    fed = Federation(rounds=5, collapse_rounds=2, plots=False)
    bare_trainer(tmp_path, fed).fit(_Collapsing(net="lenet", lr=0.05), datamodule=dm)
    assert fed.status == "completed" and len(fed.history) == 5


def test_collapsed_since_counts_evaluated_rounds():
    from fl_lightning.recorder import RunRecorder

    rec = RunRecorder(Path("unused"), {}, plots=False, total_rounds=10)
    healthy, one_class = [0.5, 0.4, 0.3], [1.0, 0.0, 0.0]
    for rnd, accs in enumerate([one_class, healthy, one_class, one_class, one_class], start=1):
        rec.history.append({"round": rnd, "global_loss": 1.5})  # above ln 3 = 1.0986: no better than a uniform guess
        rec.class_acc_history.append(accs)
    balanced = np.array([10, 10, 10])
    assert rec.collapsed_since(3, balanced) == 3
    assert rec.collapsed_since(4, balanced) is None and rec.collapsed_since(None, balanced) is None
    rec.history[3]["global_loss"] = 1.0  # one class, but a loss below ln 3: learning, which ends the streak
    assert rec.collapsed_since(3, balanced) is None and rec.collapsed_since(1, balanced) == 5
    assert rec.collapsed_since(3, np.array([40, 5, 5])) == 3  # skewed labels: ignoring the input reaches 0.64


class TestBadInput:
    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"dataset": "imagenet"}, "unknown dataset"),
            ({"partition": "zipf"}, "unknown partition"),
            ({"partition": "dirichlet", "alpha": 0.0}, "positive"),
            ({"partition": "dirichlet", "alpha": -1.0}, "positive"),
            ({"partition": "shard", "shards_per_client": 0}, "shards_per_client"),
            ({"partition": "classes_per_client", "classes_per_client": 11}, "classes_per_client"),
            ({"num_clients": 0}, "num_clients"),
            ({"holdout_per_class": -1}, "holdout"),
        ],
    )
    def test_datamodule(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            FederatedDataModule(**{"dataset": "digits", **kwargs})

    def test_more_clients_than_samples(self):
        dm = FederatedDataModule("digits", num_clients=5000, partition="iid")
        with pytest.raises(ValueError, match="more clients"):
            dm.setup("fit")

    def test_missing_data_path(self, tmp_path):
        dm = FederatedDataModule("cifar10", root=str(tmp_path / "nowhere"))
        with pytest.raises(FileNotFoundError, match="nowhere"):
            dm.setup("fit")

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"rounds": 0}, "rounds"),
            ({"sample_ratio": 0.0}, "sample_ratio"),
            ({"sample_ratio": 1.5}, "sample_ratio"),
            ({"local_epochs": 0}, "local_epochs"),
            ({"aggregation": "median"}, "aggregation"),
            ({"lr_decay": 0.0}, "lr_decay"),
            ({"eval_every": 0}, "eval_every"),
            ({"client_state_mb": -1.0}, "client_state_mb"),
            ({"collapse_rounds": 0}, "collapse_rounds"),
            ({"server_lr": 0.0}, "lr must be"),
            ({"server_momentum": 1.0}, "momentum must be"),
        ],
    )
    def test_federation(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            Federation(**kwargs)

    def test_unknown_model(self):
        with pytest.raises(ValueError, match="unknown model"):
            FedAvg(net="vgg")

    @pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
    def test_fp16_on_cpu_refused(self, tmp_path):
        from fl_lightning.cli import cli_main

        with pytest.raises(ValueError, match="32-true"):
            cli_main(
                [
                    "fit",
                    "--config",
                    "configs/quickstart.yaml",
                    "--trainer.precision",
                    "16-mixed",
                    "--trainer.default_root_dir",
                    str(tmp_path),
                ]
            )

    def test_needs_federation_callback(self, tmp_path):
        trainer = L.Trainer(
            accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False, default_root_dir=str(tmp_path)
        )
        with pytest.raises(RuntimeError, match="Federation"):
            trainer.fit(FedAvg(net="lenet", image_size=8), datamodule=FederatedDataModule("digits"))


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_on_gpu(tmp_path, precision):
    dm = FederatedDataModule("digits", num_clients=3, partition="iid", batch_size=32)
    model = FedAvg(net="lenet", image_size=8, lr=0.05)
    fed = Federation(rounds=3, local_epochs=2)
    trainer = L.Trainer(
        accelerator="gpu",
        devices=1,
        precision=precision,
        callbacks=[fed],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(model, datamodule=dm)
    assert fed.recorder.history[-1]["global_acc"] > 0.5


def test_local_evaluation_metrics(tmp_path):
    _, fed, _ = tiny_run(tmp_path, rounds=3, fed_kwargs={"eval_local": True, "local_epochs": 2})
    rows = read_metrics(tmp_path)
    for row in rows:
        assert 0.0 <= float(row["local_acc_mean"]) <= 1.0
        assert float(row["local_forgetting_degree"]) <= 1.0
    # a round's local models are individually worse than their average on this skewed split, at least once
    assert any(float(r["local_acc_mean"]) < float(r["global_acc"]) for r in rows[1:])


def test_step_hooks_path_gives_the_same_result(tmp_path):
    """Lightning's manual_backward/optimizer path and the direct step compute the same update."""
    calls = []

    class GradWatcher(L.Callback):
        def on_after_backward(self, trainer, pl_module):
            calls.append(1)

    _, direct, _ = tiny_run(tmp_path / "a", rounds=2, callbacks=[GradWatcher()])
    assert calls == []
    _, hooked, _ = tiny_run(tmp_path / "b", rounds=2, callbacks=[GradWatcher()], model_kwargs={"step_hooks": True})
    assert calls
    assert [r["global_acc"] for r in direct.recorder.history] == [r["global_acc"] for r in hooked.recorder.history]
    assert direct.recorder.history[-1]["global_loss"] == pytest.approx(
        hooked.recorder.history[-1]["global_loss"], rel=1e-6
    )


def test_client_batches_are_the_per_batch_sequence():
    """One training batch per client yields exactly the batches, in the order, of a per-batch loop."""
    dm = FederatedDataModule("digits", num_clients=3, partition="dirichlet", alpha=0.5, batch_size=64)
    dm.setup("fit")
    clients = (2, 0)
    steps = tuple(client_steps(dm.client_sizes[c], 64, 2) for c in clients)
    plan = RoundPlan(round=3, clients=clients, steps=steps, local_epochs=2, lr_scale=1.0)
    rounds = RoundBatches(dm.train_x, dm.train_y, dm.client_indices, plan, 64, False, seed=0)
    per_client = list(rounds)
    assert len(per_client) == len(clients) and [len(c) for c in per_client] == list(steps)
    nested = [batch for client in per_client for batch in client.to("cpu")]
    flat = list(rounds.batches())
    assert len(nested) == len(flat) == sum(steps)
    for (x1, y1), (x2, y2) in zip(nested, flat, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    # each client's data is stored once, not once per local epoch
    assert len(per_client[0].x) == dm.client_sizes[clients[0]]
    doubled = per_client[0].with_transform(lambda x: x.float() * 2)
    assert torch.equal(next(iter(doubled))[0], nested[0][0].float() * 2)


class _StartWeights(L.Callback):
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start = torch.cat([p.detach().flatten().clone() for p in pl_module.parameters()])


@pytest.mark.parametrize("step_hooks", [False, True])
def test_clip_grad_norm_bounds_every_local_step(tmp_path, step_hooks):
    # Without momentum or weight decay, a clipped SGD step moves the weights by at most lr * clip, so one round of
    # averaged local updates moves the global model by at most lr * clip * (the most local steps of any client).
    clip, start = 1e-4, _StartWeights()
    kwargs = {"momentum": 0.0, "weight_decay": 0.0, "clip_grad_norm": clip, "step_hooks": step_hooks}
    _, _, model = tiny_run(tmp_path, rounds=1, callbacks=[start], model_kwargs=kwargs)
    moved = (torch.cat([p.detach().flatten() for p in model.parameters()]) - start.start).norm().item()
    steps = max(math.ceil(len(idx) / 32) for idx in model.trainer.datamodule.client_indices)
    assert 0 < moved <= 0.05 * clip * steps * (1 + 1e-5)
    with pytest.raises(ValueError, match="clip_grad_norm"):
        FedAvg(clip_grad_norm=0.0)

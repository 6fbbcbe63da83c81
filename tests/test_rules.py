"""The trainer rules of fl_lightning.rules, on values and on bare Trainer objects (nothing is fit)."""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import rules


def bare(tmp_path: Path, **kwargs) -> L.Trainer:
    defaults = {"accelerator": "cpu", "logger": False, "enable_progress_bar": False, "default_root_dir": str(tmp_path)}
    return L.Trainer(**{**defaults, **kwargs})


# ---- precision ----------------------------------------------------------------------------------------------------


def test_default_precision_on_the_cpu():
    assert rules.default_precision("cpu") == "32-true"
    if not torch.cuda.is_available():
        assert rules.default_precision() == "32-true" and rules.default_precision("auto") == "32-true"


def test_default_precision_on_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert rules.default_precision() == rules.default_precision("gpu") == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert rules.default_precision("cuda") == "16-mixed"
    assert rules.default_precision("cpu") == "32-true"


@pytest.mark.parametrize("precision", ["32-true", "32", 32, "bf16-mixed"])
def test_cpu_precisions_pass(precision):
    rules.check_precision(precision, on_cpu=True)


@pytest.mark.parametrize("precision", ["16-mixed", "16", 16])
def test_half_precision_on_the_cpu_is_refused(precision):
    with pytest.raises(ValueError) as err:
        rules.check_precision(precision, on_cpu=True)
    assert str(err.value) == (
        f"trainer option precision='{precision}' needs a CUDA GPU; on the CPU use --trainer.precision 32-true "
        "(or bf16-mixed; in Python L.Trainer(precision='32-true'))"
    )


@pytest.mark.parametrize("on_cpu", [True, False])
@pytest.mark.parametrize("precision", ["64-true", "64", 64, "bf16-true", "16-true", "transformer-engine"])
def test_precisions_that_convert_the_weights_are_refused(precision, on_cpu):
    """A ``*-true`` precision converts the module; the lazily transformed batches stay float32 (the fit would fail)."""
    with pytest.raises(ValueError, match="converts the weights, and the federation's batches are float32"):
        rules.check_precision(precision, on_cpu=on_cpu)


def test_16_mixed_on_a_gpu_passes_unless_the_method_counts_steps():
    rules.check_precision("16-mixed", on_cpu=False)
    rules.check_precision("bf16-mixed", on_cpu=False, exact_steps_method="scaffold")
    with pytest.raises(ValueError, match="scaffold counts local steps, and 16-mixed's gradient scaler can skip some"):
        rules.check_precision("16-mixed", on_cpu=False, exact_steps_method="scaffold")


def test_check_trainer_reads_precision_and_device(tmp_path):
    rules.check_trainer(bare(tmp_path, precision="32-true"), exact_steps_method="fednova")
    with pytest.raises(ValueError, match="trainer option accumulate_grad_batches=4 is not supported"):
        rules.check_trainer(bare(tmp_path, accumulate_grad_batches=4))


# ---- options that cut rounds --------------------------------------------------------------------------------------


def test_defaults_pass(tmp_path):
    rules.check_round_options({})
    rules.check_round_options(
        {
            "fast_dev_run": False,
            "limit_train_batches": 1.0,
            "max_steps": -1,
            "overfit_batches": 0.0,
            "accumulate_grad_batches": 1,
            "max_epochs": 5,  # not a round option: ignored here
        }
    )
    rules.check_round_options({key: None for key in rules.ROUND_OPTIONS})
    rules.check_round_options(rules.trainer_round_options(bare(tmp_path)))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("fast_dev_run", True),
        ("fast_dev_run", 3),
        ("limit_train_batches", 0.5),
        ("limit_train_batches", 2),
        ("limit_train_batches", 1),  # an int counts batches: one batch, one client
        ("max_steps", 10),
        ("overfit_batches", 2),
        ("overfit_batches", 0.1),
    ],
)
def test_options_that_cut_rounds_are_refused(key, value):
    message = (
        f"trainer option {key}={value!r} is not supported: a round trains every sampled client for its local "
        "epochs, so it would cut rounds short; for a quick run use --federation.rounds 1 --data.num_clients 2 "
        "(in Python Federation(rounds=1) and FederatedDataModule(..., num_clients=2)), or a smaller sample_ratio to "
        "train fewer clients per round"
    )
    with pytest.raises(ValueError) as err:
        rules.check_round_options({key: value})
    assert str(err.value) == message


@pytest.mark.parametrize("value", [0.5, 1, 20])
def test_validating_inside_a_round_is_refused(tmp_path, value):
    # Below 1.0, or a number of batches: the validation would see a client's local model.
    with pytest.raises(
        ValueError, match=rf"^trainer option val_check_interval={value!r} is not supported: validation "
    ):
        rules.check_round_options({"val_check_interval": value})
    with pytest.raises(ValueError, match=rf"^trainer option val_check_interval={value!r} is not supported"):
        every = None if isinstance(value, int) else 1  # Lightning's own rule: a number of batches across rounds
        rules.check_trainer(bare(tmp_path, val_check_interval=value, check_val_every_n_epoch=every))
    rules.check_round_options({"val_check_interval": 1.0})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_time": {"seconds": 0}}, "max_time={'seconds': 0.0} stops the fit before its first round"),
        ({"min_epochs": 5}, "min_epochs=5 exceeds rounds=2"),
    ],
)
def test_a_built_trainer_gets_the_command_lines_value_checks(tmp_path, kwargs, message):
    # The Python API reaches them through Federation's setup, as the command line does before it builds the Trainer.
    with pytest.raises(ValueError, match=f"^trainer option {message}"):
        rules.check_trainer(bare(tmp_path, **kwargs), rounds=2)
    rules.check_trainer(bare(tmp_path, max_time={"minutes": 1}, min_epochs=2), rounds=2)


def test_accumulating_batches_is_refused():
    with pytest.raises(ValueError, match=r"^trainer option accumulate_grad_batches=2 is not supported: every local"):
        rules.check_round_options({"accumulate_grad_batches": 2})


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"fast_dev_run": True}, "fast_dev_run=True"),  # also sets limit_train_batches and max_steps to 1
        ({"fast_dev_run": 2}, "fast_dev_run=2"),
        ({"limit_train_batches": 3}, "limit_train_batches=3"),
        ({"limit_train_batches": 1}, "limit_train_batches=1"),
        ({"limit_train_batches": 0.25}, "limit_train_batches=0.25"),
        ({"max_steps": 7}, "max_steps=7"),
        ({"overfit_batches": 2}, "overfit_batches=2"),  # also sets limit_train_batches
        ({"accumulate_grad_batches": 3}, "accumulate_grad_batches=3"),
    ],
)
def test_a_built_trainer_gets_the_same_refusal(tmp_path, kwargs, named):
    trainer = bare(tmp_path, **kwargs)
    with pytest.raises(ValueError, match=f"^trainer option {named} is not supported"):
        rules.check_round_options(rules.trainer_round_options(trainer))
    with pytest.raises(ValueError, match=f"^trainer option {named} is not supported"):
        rules.prepare_trainer(trainer, rounds=5)


# ---- max_epochs and rounds ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_epochs", [None, -1, 5])
def test_max_epochs_unset_or_equal_is_the_rounds(max_epochs):
    assert rules.check_max_epochs(max_epochs, rounds=5) == 5


@pytest.mark.parametrize("max_epochs", [7, 1, 0])
def test_max_epochs_other_than_the_rounds_is_refused(max_epochs):
    with pytest.raises(ValueError) as err:
        rules.check_max_epochs(max_epochs, rounds=5)
    assert str(err.value) == (
        f"max_epochs={max_epochs} conflicts with rounds=5: one epoch is one round; leave max_epochs unset and give "
        "the rounds to the federation (Federation(rounds=...), --federation.rounds)"
    )


@pytest.mark.parametrize("max_epochs", [None, 5, -1])
def test_prepare_trainer_sets_the_rounds(tmp_path, max_epochs):
    trainer = bare(tmp_path, max_epochs=max_epochs)
    rules.prepare_trainer(trainer, rounds=5)
    assert trainer.max_epochs == trainer.fit_loop.max_epochs == 5


def test_prepare_trainer_takes_lightnings_own_default_for_unset(tmp_path):
    trainer = bare(tmp_path)
    trainer.fit_loop.max_epochs = rules.LIGHTNING_DEFAULT_MAX_EPOCHS  # what a started fit makes of max_epochs=None
    rules.prepare_trainer(trainer, rounds=3)
    assert trainer.max_epochs == 3


def test_prepare_trainer_refuses_other_max_epochs(tmp_path):
    with pytest.raises(ValueError, match="max_epochs=7 conflicts with rounds=5"):
        rules.prepare_trainer(bare(tmp_path, max_epochs=7), rounds=5)


# ---- checkpoints --------------------------------------------------------------------------------------------------


def test_checkpoint_dir(tmp_path):
    assert rules.checkpoint_dir(tmp_path) == tmp_path / "checkpoints"
    assert rules.checkpoint_dir("runs/x") == Path("runs/x/checkpoints")


def test_prepare_trainer_puts_checkpoints_in_the_run_directory(tmp_path):
    trainer = bare(tmp_path / "run")  # enable_checkpointing's default ModelCheckpoint: no dirpath, save_last None
    rules.prepare_trainer(trainer, rounds=2)
    (default,) = trainer.checkpoint_callbacks
    assert Path(default.dirpath) == tmp_path / "run" / "checkpoints" and default.save_last is True
    from fl_lightning.checkpoint import AtomicLastCheckpoint

    assert isinstance(default, AtomicLastCheckpoint)  # one file, last.ckpt, instead of epoch=...-step=....ckpt


def test_prepare_trainer_keeps_a_chosen_folder_and_save_last(tmp_path):
    own = ModelCheckpoint(dirpath=tmp_path / "elsewhere", save_top_k=0)
    rules.prepare_trainer(bare(tmp_path / "run", callbacks=[own]), rounds=2)
    assert Path(own.dirpath) == tmp_path / "elsewhere" and own.save_last is None
    chosen = ModelCheckpoint(save_last=False, save_top_k=1)
    rules.prepare_trainer(bare(tmp_path / "run", callbacks=[chosen]), rounds=2)
    assert Path(chosen.dirpath) == tmp_path / "run" / "checkpoints" and chosen.save_last is False


# ---- a busy CPU -----------------------------------------------------------------------------------------------------


@pytest.fixture
def two_cores(monkeypatch):
    """A 2-core machine whose busy cores the test sets; OMP_NUM_THREADS unset (torch's default threads)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(rules.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)

    def load(value: float | None) -> None:
        monkeypatch.setattr(rules, "busy_cores", lambda: value)

    return load


def test_busy_cpu_note_when_other_work_holds_the_cores_threads_need(two_cores):
    two_cores(1.2)  # another run holds one of the two cores
    note = rules.busy_cpu_note(threads=2)
    assert note is not None and "keep 1.2 of 2 cores busy" in note and "2 torch threads" in note
    assert "OMP_NUM_THREADS=1" in note
    assert rules.busy_cpu_note(threads=1, processes=2) is not None  # two processes of one thread each
    assert rules.busy_cpu_note(threads=1) is None  # one thread fits the idle core


def test_no_busy_cpu_note_on_an_idle_machine_or_when_the_user_chose_threads(two_cores, monkeypatch):
    two_cores(0.3)
    assert rules.busy_cpu_note(threads=2) is None
    two_cores(1.9)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert rules.busy_cpu_note(threads=2) is None


def test_no_busy_cpu_note_where_the_load_cannot_be_read(two_cores):
    two_cores(None)
    assert rules.busy_cpu_note(threads=2) is None


def test_busy_cores_reads_proc_stat_over_the_interval_and_falls_back_to_the_load_average(monkeypatch):
    # (total, idle, CPUs) ticks: 100 ticks pass, 25 of them idle, on 2 CPUs -> 1.5 cores busy
    times = iter([(1000, 400, 2), (1100, 425, 2)])
    monkeypatch.setattr(rules, "_cpu_times", lambda: next(times))
    assert rules.busy_cores(interval=0) == pytest.approx(1.5)

    def unreadable():
        raise OSError("no /proc/stat")

    monkeypatch.setattr(rules, "_cpu_times", unreadable)
    monkeypatch.setattr(rules.os, "getloadavg", lambda: (0.7, 0.5, 0.4))
    assert rules.busy_cores(interval=0) == 0.7
    if rules.os.path.exists("/proc/stat"):  # the real reading is a number of cores
        monkeypatch.undo()
        assert 0.0 <= rules.busy_cores(interval=0.05) <= (os.cpu_count() or 1) + 0.01


def test_cpu_times_count_only_the_cpus_this_process_may_run_on(tmp_path, monkeypatch):
    # Before: the whole machine's first line was read, so a job pinned to idle cores of a busy node read busy.
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  300 0 0 60 0 0 0 0 0 0\n"
        "cpu0 100 0 0 0 0 0 0 0 0 0\n"  # busy, not ours
        "cpu1 50 0 0 40 10 0 0 0 0 0\n"
        "cpu2 100 0 0 0 0 0 0 0 0 0\n"  # busy, not ours
        "cpu3 50 0 0 10 0 0 0 0 0 0\n"
        "intr 12345 0 0\n"
    )
    monkeypatch.setattr(rules.os, "sched_getaffinity", lambda pid: {1, 3}, raising=False)
    assert rules._cpu_times(str(stat)) == (160, 60, 2)
    monkeypatch.setattr(rules.os, "sched_getaffinity", lambda pid: {7}, raising=False)
    with pytest.raises(ValueError, match="none of this process's CPUs"):
        rules._cpu_times(str(stat))


def test_a_fit_on_a_busy_cpu_warns_once_with_the_line(two_cores, tmp_path, monkeypatch):
    from helpers import tiny_run

    two_cores(1.5)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    with pytest.warns(UserWarning, match="the CPU is busy") as caught:
        tiny_run(tmp_path, rounds=1)
    assert sum("the CPU is busy" in str(w.message) for w in caught) == 1


def test_lightnings_clipping_is_refused_for_a_method_naming_its_own():
    with pytest.raises(ValueError, match=r"not supported by fedntd, .*use --model.clip_grad_norm 2.0"):
        rules.check_clipping(2.0, "fedntd")
    rules.check_clipping(2.0, None)  # a plain LightningModule: Lightning's clipping serves it
    rules.check_clipping(None, "fedntd")
    rules.check_clipping(0.0, "fedntd")

"""What a user sees when something is wrong: one line ``error: ...`` on stderr and a documented exit code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import read_summary

from fl_lightning.cli import EXIT_CODES, run
from fl_lightning.experiments.compare import CompareSpec

ROOT = Path(__file__).resolve().parent.parent
BASE = [
    "fit",
    "--config",
    str(ROOT / "configs/quickstart.yaml"),
    "--data.num_clients",
    "3",
    "--federation.rounds",
    "1",
    "--federation.local_epochs",
    "1",
    "--trainer.enable_progress_bar",
    "false",
]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "cli.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        timeout=120,
    )


@pytest.mark.slow
def test_bad_value_is_one_line_and_exit_2():
    # Before: a 35-56-line traceback or a 70-line usage wall before the one line that matters.
    out = cli("fit", "--config", "configs/quickstart.yaml", "--data.num_clients", "abc")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["error: --data.num_clients: expected int or None, got 'abc'"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--data.alpha", "0"], "error: the Dirichlet concentration must be a positive number"),
        (["--model.init_args.net", "vgg"], "error: unknown model 'vgg'"),
        (["--data.num_clientz", "3"], "error: unrecognized arguments: --data.num_clientz"),
        (["--federation.sample_ratio", "1.5"], "error: sample_ratio must be in (0, 1]"),
        (["--trainer.limit_train_batches", "2"], "error: trainer option limit_train_batches=2"),
        (["--trainer.fast_dev_run", "true"], "error: trainer option fast_dev_run=True is not supported"),
        (["--trainer.accumulate_grad_batches", "2"], "error: trainer option accumulate_grad_batches=2 is not"),
        (["--ckpt_path", "nope.ckpt"], "error: --ckpt_path nope.ckpt: no such file"),
        (["--data.dataset", "cifar10", "--data.root", "/nonexistent"], "error: CIFAR-10 python batches"),
        (["--federation.step_capture", "graph", "--trainer.accelerator", "cpu"], "error: step_capture=graph records"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_bad_input_one_line(tmp_path, capsys, extra, message):
    assert run([*BASE, "--trainer.default_root_dir", str(tmp_path / "r"), *extra]) == EXIT_CODES["bad input"]
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in err and "usage:" not in err
    assert not (tmp_path / "r").exists()  # refused before the run directory


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="positive"):
        run([*BASE, "--trainer.default_root_dir", str(tmp_path), "--data.alpha", "0"], debug=True)


def test_completed_run_exits_0(tmp_path):
    assert run([*BASE, "--trainer.default_root_dir", str(tmp_path)]) == 0


@pytest.mark.parametrize(
    ("methods", "match"),
    [([], "methods is empty"), ({"a": 1}, "methods must be a list")],
)
def test_compare_bad_methods(tmp_path, methods, match):
    # Before: methods: [] raised IndexError.
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"methods": methods, "settings": {"s": "configs/quickstart.yaml"}}))
    with pytest.raises(ValueError, match=match):
        CompareSpec.from_yaml(path)


def test_compare_method_as_a_string_is_one_method(tmp_path, monkeypatch):
    # Before: methods: fedavg was read letter by letter (f, e, d, a, v, g).
    monkeypatch.chdir(ROOT)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"methods": "fedavg", "seeds": 3, "settings": {"s": "configs/quickstart.yaml"}}))
    spec = CompareSpec.from_yaml(path)
    assert spec.methods == ["fedavg"] and spec.seeds == [3] and len(spec.runs()) == 1


def test_error_during_the_run_exits_1(tmp_path, capsys, monkeypatch):
    from fl_lightning.federation import Federation

    def boom(*_):
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(Federation, "on_train_epoch_start", boom)
    assert run([*BASE, "--trainer.default_root_dir", str(tmp_path)]) == EXIT_CODES["failed"]
    assert (
        capsys.readouterr().err.strip().splitlines()[-1]
        == "error: RuntimeError: CUDA error: device-side assert triggered"
    )


def test_diverged_run_exits_3(tmp_path):
    assert run([*BASE, "--trainer.default_root_dir", str(tmp_path), "--model.init_args.lr", "1e12"]) == 3
    assert read_summary(tmp_path)["status"] == "diverged"


def test_drop_last_error_exits_2(tmp_path, capsys):
    args = [*BASE, "--trainer.default_root_dir", str(tmp_path), "--data.drop_last", "true", "--data.batch_size", "1000"]
    assert run(args) == EXIT_CODES["bad input"]
    assert "set --data.drop_last false" in capsys.readouterr().err.strip().splitlines()[-1]


def test_drop_last_error_is_refused_at_start_not_interrupted(tmp_path, capsys):
    # Before: labelled interrupted and told to resume. Now a bad input: refused before any file is written.
    args = [*BASE, "--trainer.default_root_dir", str(tmp_path), "--data.drop_last", "true", "--data.batch_size", "1000"]
    assert run(args) == 2
    assert "drop_last" in capsys.readouterr().err
    assert not (tmp_path / "summary.json").exists()


def test_error_during_a_run_is_failed_with_its_message(tmp_path, monkeypatch):
    from fl_lightning.core.server_optim import ServerSGD

    def broken(*args, **kwargs):
        raise RuntimeError("boom in the server step")

    monkeypatch.setattr(ServerSGD, "step", broken)
    args = [*BASE, "--trainer.default_root_dir", str(tmp_path), "--federation.server_momentum", "0.5"]
    assert run(args) == 1
    summary = read_summary(tmp_path)
    assert summary["status"] == "failed" and "boom in the server step" in summary["error"]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_ends_interrupted_with_exit_4(tmp_path, sig):
    # Before: SIGTERM exited 0.
    run_dir = tmp_path / "r"
    args = [*BASE[:5], "--federation.rounds", "500", *BASE[7:], "--trainer.default_root_dir", str(run_dir)]
    proc = subprocess.Popen(
        [sys.executable, "cli.py", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.time() + 60
    while not (run_dir / "metrics.csv").exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_CODES["interrupted"]
    assert err.strip().splitlines()[-1].startswith(("error: stopped by SIGTERM", "error: interrupted"))
    assert "resume the run with --ckpt_path last" in err.strip().splitlines()[-1]
    assert read_summary(run_dir)["status"] == "interrupted"


def test_wandb_defaults_from_the_config(tmp_path):
    pytest.importorskip("wandb")
    from fl_lightning.cli import resolve_config

    run_dir = tmp_path / "my_run"
    config = resolve_config(
        [*BASE, "--trainer.default_root_dir", str(run_dir), "--trainer.logger", "WandbLogger", "--seed_everything", "3"]
    )
    args = config["trainer"]["logger"]["init_args"]
    assert args["project"] == "fl_lightning" and args["name"] == "my_run" and args["save_dir"] == str(run_dir)
    assert args["group"] == "digits_dirichlet" and args["tags"] == ["fedavg", "digits", "dirichlet", "seed3"]


def test_tensorboard_logger_as_the_readme_writes_it(tmp_path):
    pytest.importorskip("tensorboard")
    # Before: `--trainer.logger TensorBoardLogger` without a save_dir failed.
    assert run([*BASE, "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "TensorBoardLogger"]) == 0
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))

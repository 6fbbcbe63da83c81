"""A new user's first hour (issue 21): shipped configs found by name, every command in --help, methods by name,
a clean terminal and log, messages that say what to do, the recorded config, labelled rounds on every curve."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml
from helpers import read_summary

from fl_lightning import cli, shipped_configs
from fl_lightning.cli import EXIT_CODES, run
from fl_lightning.experiments.compare import CompareSpec
from fl_lightning.lightning_cli import cli_main, resolve_config

ROOT = Path(__file__).resolve().parent.parent
TINY = [
    *("--data.num_clients", "2", "--federation.rounds", "1", "--federation.local_epochs", "1"),
    *("--federation.plots", "false"),
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}


def fit_args(run_dir: Path, *extra: str, config: str = "quickstart") -> list[str]:
    return ["fit", "--config", config, *TINY, "--trainer.default_root_dir", str(run_dir), *extra]


# ---- 1. configs ship with the package and are found by name ----------------------------------------------------------


@pytest.mark.slow
def test_pip_installed_package_runs_a_shipped_config_outside_the_checkout(tmp_path):
    # Before: `fl-lightning fit --config configs/quickstart.yaml` outside a checkout: "File does not exist".
    src = tmp_path / "src"  # a copy, so that the build's build/ and egg-info stay out of the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("fl_lightning", "configs"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", ".*"))
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-compile"]
        + ["--target", str(site), str(src)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    shipped = site / "fl_lightning" / "configs"
    assert (shipped / "compare" / "fmnist_ntd_setting.yaml").is_file()
    # mark the installed copy, to tell it from the checkout's
    text = (shipped / "quickstart.yaml").read_text()
    (shipped / "quickstart.yaml").write_text(text.replace("alpha: 0.5", "alpha: 0.7"))
    work = tmp_path / "work"  # no configs/ here
    work.mkdir()
    out = subprocess.run(  # the README's command as written
        [str(site / "bin" / "fl-lightning"), *fit_args(Path("runs/r"), config="configs/quickstart.yaml")],
        cwd=work,
        env={**ENV, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert read_summary(work / "runs" / "r")["status"] == "completed"
    saved = yaml.safe_load((work / "runs" / "r" / "config.yaml").read_text())
    assert saved["data"]["alpha"] == 0.7 and saved["model"]["init_args"]["lr"] == 0.05  # the installed quickstart


def test_config_by_name_is_the_shipped_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside the checkout: no configs/ here
    by_path = shipped_configs.resolve_config_arg("configs/quickstart.yaml")
    assert Path(by_path) == shipped_configs.config_dir() / "quickstart.yaml"
    for value in ("quickstart", "quickstart.yaml", "configs/quickstart"):
        assert shipped_configs.resolve_config_arg(value) == by_path
    assert shipped_configs.find_config("compare/fmnist_ntd_setting") is not None
    (tmp_path / "quickstart.yaml").write_text("seed_everything: 5\n")
    assert shipped_configs.resolve_config_arg("quickstart.yaml") == "quickstart.yaml"  # a file wins over a name
    config = resolve_config(["fit", "--config", "quickstart"])
    assert config["data"]["dataset"] == "digits" and config["federation"]["rounds"] == 20


def test_unknown_config_name_suggests_the_closest(tmp_path, capsys):
    assert run(fit_args(tmp_path / "r", config="quickstrat")) == EXIT_CODES["bad input"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --config quickstrat: no such file")
    assert "did you mean quickstart?" in err[0]


def test_configs_command_lists_prints_and_copies(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        cli.main(["configs"])
    assert stop.value.code == 0
    listing = capsys.readouterr().out
    assert re.search(r"^  quickstart +FedAvg on scikit-learn's digits", listing, re.M)
    assert re.search(r"^  compare/fmnist_ntd_setting ", listing, re.M)
    assert shipped_configs.main(["quickstart"]) == 0
    shipped = (shipped_configs.config_dir() / "quickstart.yaml").read_text()
    assert capsys.readouterr().out == shipped.replace("  default_root_dir: runs/quickstart\n", "")  # its location
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "quickstart.yaml").write_text("edited\n")
    assert shipped_configs.main(["quickstart", "compare/fmnist_shard2_seeds", "--copy", "mine"]) == 0
    assert (tmp_path / "mine" / "quickstart.yaml").read_text() == "edited\n"  # kept, never overwritten
    assert (tmp_path / "mine" / "compare" / "fmnist_shard2_seeds.yaml").is_file()
    copied = (tmp_path / "mine" / "compare" / "fmnist_shard2_seeds.yaml").read_text()
    assert copied == (shipped_configs.config_dir() / "compare" / "fmnist_shard2_seeds.yaml").read_text()
    assert "kept 1 existing" in capsys.readouterr().out
    assert shipped_configs.main(["--copy"]) == 0  # all of them, into ./configs
    assert len(list((tmp_path / "configs").rglob("*.yaml"))) == len(shipped_configs.config_names())


def test_a_copied_comparison_runs_the_copied_configs(tmp_path, monkeypatch):
    """Before: a copied spec still named ``configs/{method}_...yaml``, so that it ran the shipped configs (or a
    checkout's), never the copies being edited."""
    monkeypatch.chdir(tmp_path)
    assert shipped_configs.main(["--copy", "mine"]) == 0
    spec = CompareSpec.from_yaml("mine/compare/fmnist_shard2_seeds.yaml")
    assert {r.config for r in spec.runs()} == {
        Path(f"mine/{m}_fmnist_shard2.yaml") for m in ("fedavg", "fedntd", "fedlmd")
    }
    # copied alone, a spec keeps naming the shipped configs (there are no copies to run)
    assert shipped_configs.main(["compare/fmnist_shard2_seeds", "--copy", "alone"]) == 0
    spec = CompareSpec.from_yaml("alone/compare/fmnist_shard2_seeds.yaml")
    assert {r.config.parent for r in spec.runs()} == {shipped_configs.config_dir()}


def test_shipped_comparison_finds_its_configs_outside_the_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = CompareSpec.from_yaml(shipped_configs.resolve_config_arg("compare/fmnist_shard2_seeds"))
    assert {r.config for r in spec.runs()} == {
        shipped_configs.config_dir() / f"{m}_fmnist_shard2.yaml" for m in ("fedavg", "fedntd", "fedlmd")
    }


# ---- 2. every command in --help, under the project's title ----------------------------------------------------------


def test_output_into_a_closed_pipe_ends_quietly():
    # Before: `fl-lightning configs | head -1` ended in a BrokenPipeError traceback and exit code 1.
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written, as after `head -1`
    try:
        done = subprocess.run(
            [sys.executable, "cli.py", "configs"], cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True, timeout=60
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize(("command", "hint"), [("fitt", "did you mean fit? "), ("train", "")])
def test_an_unknown_command_names_the_commands(command, hint, capsys):
    # Before: "invalid choice: 'fitt' (choose from 'fit', 'validate', 'test')", without compare, configs or claims.
    with pytest.raises(SystemExit) as stop:
        cli.main([command, "--config", "quickstart"])
    assert stop.value.code == EXIT_CODES["bad input"]
    assert capsys.readouterr().err.splitlines() == [
        f"error: unknown command {command!r}; {hint}the commands are fit, validate, test, compare, configs, claims "
        "(fl-lightning --help)"
    ]


@pytest.mark.parametrize("argv", [["--help"], ["-h"], []], ids=["--help", "-h", "nothing"])
def test_help_lists_every_command(argv, capsys):
    # Before: "Lightning Trainer command line tool" and {fit,validate,test,predict}; no compare.
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "fl_lightning: federated learning" in out and "Lightning Trainer command line tool" not in out
    for command in ("fit", "validate", "test", "compare", "configs"):
        assert re.search(rf"^  {command} +[A-Z]\w+ .+", out, re.M), command
    assert not re.search(r"^  predict ", out, re.M)  # predictions are tensors: a Python API


def test_validate_works_and_predict_is_not_offered(tmp_path, capsys):
    # Before: both parsed, then failed ("No `validation_step()`", "`predict_dataloader` must be implemented").
    run_dir = tmp_path / "run"
    base = ["--config", "quickstart", "--data.num_clients", "2", "--data.holdout_per_class", "5"]
    assert run(["fit", *base, "--federation.rounds", "1", "--trainer.default_root_dir", str(run_dir)]) == 0
    summary = (run_dir / "summary.json").read_bytes()
    ckpt = str(run_dir / "checkpoints" / "last.ckpt")
    assert run(["validate", *base, "--ckpt_path", ckpt, "--trainer.default_root_dir", str(run_dir)]) == 0
    assert "val/acc" in capsys.readouterr().out
    assert (run_dir / "summary.json").read_bytes() == summary  # the run's files are untouched
    assert run(["predict", "--config", "quickstart"]) == EXIT_CODES["bad input"]
    assert "invalid choice: 'predict'" in capsys.readouterr().err


def test_test_and_validate_refuse_an_untrained_model_and_find_last_as_a_resume_does(tmp_path, monkeypatch, capsys):
    # Before: `test --config quickstart` scored a freshly initialised model (test/acc 0.1000, exit 0), and so did
    # `--ckpt_path last` (Lightning only warned that there was no last checkpoint); `validate` without validation
    # data printed nothing and exited 0.
    monkeypatch.chdir(tmp_path)
    base = ["--config", "quickstart", "--data.num_clients", "2"]
    for command in ("test", "validate"):
        assert run([command, *base]) == EXIT_CODES["bad input"]
        assert f"error: {command} evaluates a trained global model: give --ckpt_path" in capsys.readouterr().err
    assert run(["test", *base, "--ckpt_path", "last"]) == EXIT_CODES["bad input"]
    assert "no checkpoints/last.ckpt in runs/quickstart (no version_N of these settings)" in capsys.readouterr().err
    assert run(["test", *base, "--ckpt_path", "no.ckpt"]) == EXIT_CODES["bad input"]  # before: Lightning's 2 lines
    assert capsys.readouterr().err.splitlines()[-1:] == [
        "error: --ckpt_path no.ckpt: no such file; give <run dir>/checkpoints/last.ckpt, or last"
    ]
    assert run(["fit", *base, "--federation.rounds", "1", "--trainer.enable_progress_bar", "false"]) == 0
    final = read_summary(tmp_path / "runs" / "quickstart" / "version_0")["final_acc"]
    capsys.readouterr()
    assert run(["test", *base, "--ckpt_path", "last"]) == 0  # the newest version of these settings, as fit finds it
    acc = re.search(r"test/acc\W+([0-9.]+)", capsys.readouterr().out)
    assert acc is not None and float(acc.group(1)) == pytest.approx(final, abs=1e-6)
    assert run(["validate", *base, "--ckpt_path", "last"]) == EXIT_CODES["bad input"]
    assert "error: validate has no validation data: give the run's --data.holdout_per_class" in capsys.readouterr().err


# ---- 3. methods by name ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [("fedntd", "FedNTD"), ("FEDNTD", "FedNTD"), ("fedlmd_tf", "FedLMDTf"), ("FedLMD-Tf", "FedLMDTf")],
)
def test_method_by_its_results_name(given, expected):
    # Before: "--model: Expected a path but fedntd either not accessible or invalid".
    config = resolve_config(["fit", "--config", "quickstart", "--model", given])
    assert config["model"]["class_path"] == f"fl_lightning.methods.{expected}"


def test_method_by_class_path_and_with_equals_sign():
    config = resolve_config(["fit", "--config", "quickstart", "--model=scaffold"])
    assert config["model"]["class_path"] == "fl_lightning.methods.SCAFFOLD"
    config = resolve_config(["fit", "--config", "quickstart", "--model", "fl_lightning.methods.MOON"])
    assert config["model"]["class_path"] == "fl_lightning.methods.MOON"


def test_unknown_method_lists_the_methods_and_suggests_the_closest(tmp_path, capsys):
    assert run(fit_args(tmp_path / "r", "--model", "FedNDT")) == EXIT_CODES["bad input"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --model FedNDT: unknown method; did you mean fedntd?")
    assert "fedavg, kd, fedntd" in err[0] and "scaffold" in err[0]
    assert not (tmp_path / "r").exists()


# ---- 4. a clean terminal and log ------------------------------------------------------------------------------------


def _visible_lines(output: str) -> list[str]:
    """What a terminal shows of each finished line: the text after its last carriage return."""
    return [line.rsplit("\r", 1)[-1] for line in output.replace("\r\n", "\n").split("\n")[:-1]]


BAR = re.compile(r"\| client \d+/\d+ \[")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pseudo-terminal as Linux has it")
def test_terminal_bar_is_erased_before_every_other_line(tmp_path):
    # Before: "...client 3/3 [00:00<00:00], acc=95.00%`Trainer.fit` stopped: ..." on one line, the bar drawn again
    # after "done:", round 2's bar showing round 1's accuracy as plain "acc=", and "GPU available: False, used: False".
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    args = fit_args(tmp_path / "r", "--federation.rounds", "2", "--data.num_clients", "3")
    proc = subprocess.Popen(
        [sys.executable, "cli.py", *args], cwd=ROOT, env=ENV, stdin=follower, stdout=follower, stderr=follower
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=120) == 0
    output = b"".join(chunks).decode()
    assert BAR.search(output), "the bar was drawn"
    assert re.search(r"round 2/2 \|[^\r\n]*round 1 acc=\d+\.\d\d%", output), "round 2's bar says whose accuracy"
    lines = _visible_lines(output)
    assert not [line for line in lines if BAR.search(line)], "a bar left on a line of its own or with a message"
    assert lines[-1].startswith("done: ") and not output.endswith("\r"), "nothing drawn after done:"
    for noise in ("GPU available:", "TPU available:", "`Trainer.fit` stopped"):
        assert noise not in output


@pytest.mark.slow
def test_redirected_output_has_one_line_per_round_and_no_frames(tmp_path):
    # Before: every bar update written to the log (~450 frames for a 21-line run log), with carriage returns.
    args = fit_args(tmp_path / "r", "--federation.rounds", "2", "--data.num_clients", "3")
    out = subprocess.run(
        [sys.executable, "cli.py", *args], cwd=ROOT, env=ENV, capture_output=True, timeout=120
    )  # bytes: no newline translation
    assert out.returncode == 0, out.stderr
    stdout = out.stdout.decode()
    everything = stdout + out.stderr.decode()
    assert "\r" not in everything and not BAR.search(everything)
    rounds = [line for line in stdout.splitlines() if line.startswith("round ")]
    assert [line.split()[1] for line in rounds] == ["1/2", "2/2"]
    assert stdout.splitlines()[-1].startswith("done: final acc")
    assert "GPU available" not in everything and "TPU available" not in everything


def test_resume_from_a_moved_run_directory_says_nothing_about_best_model_score(tmp_path):
    # Before: "The dirpath has changed from '.../a/checkpoints' to '.../b/checkpoints', therefore `best_model_score`,
    # ... won't be reloaded."
    cli_main(fit_args(tmp_path / "a", "--trainer.enable_progress_bar", "false"))
    (tmp_path / "a").rename(tmp_path / "b")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli_main(
            fit_args(tmp_path / "b", "--trainer.enable_progress_bar", "false", "--federation.rounds", "2")
            + ["--ckpt_path", "last"]
        )
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]
    summary = read_summary(tmp_path / "b")
    assert summary["status"] == "completed" and summary["rounds_done"] == 2


# ---- 5. messages that say what to do --------------------------------------------------------------------------------


def test_cifar10_not_found_reads_as_sentences(tmp_path, capsys):
    # Before: "... not found; searched: /x/cifar-10-batches-py /x Pass --data.download true ..."
    root = tmp_path / "nothing"
    assert run(fit_args(tmp_path / "r", "--data.dataset", "cifar10", "--data.root", str(root))) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(
        f"not found in {root / 'cifar-10-batches-py'} or {root}. "
        f"Pass --data.download true (in Python FederatedDataModule(download=True)) to download it with torchvision "
        f"into {root}."
    )
    assert err.startswith("error: CIFAR-10 python batches (data_batch_1, ")


@pytest.mark.parametrize("extra", [[], ["--trainer.logger.group", "mine"]], ids=["defaults", "with a W&B option"])
def test_wandb_logger_without_wandb_names_the_install(tmp_path, capsys, monkeypatch, extra):
    # Before: "--trainer.logger: ... Problem with given class_path 'lightning.pytorch.loggers.WandbLogger': Option
    # 'group' is not accepted".
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    assert run(fit_args(tmp_path / "r", "--trainer.logger", "WandbLogger", *extra)) == EXIT_CODES["bad input"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --trainer.logger WandbLogger needs the wandb package: pip install wandb "
        "(or pip install 'fl_lightning[wandb]')"
    ]


@pytest.mark.slow
def test_wandb_run_has_no_warnings_from_our_settings(tmp_path, capfd, monkeypatch):
    # Before: "wandb: WARNING The anonymous setting has no effect ..." and "wandb: WARNING git root <run dir> does not
    # exist" in every W&B run.
    pytest.importorskip("wandb")
    import wandb

    monkeypatch.setenv("WANDB_SILENT", "false")  # conftest silences W&B; its warnings are what this test reads
    wandb.teardown()  # W&B keeps its settings per process: an earlier test's silent ones would hide its lines
    run_dir = tmp_path / "not_yet_there"
    cli_main(fit_args(run_dir, "--trainer.enable_progress_bar", "false", "--trainer.logger", "WandbLogger"))
    wandb.finish()
    err = capfd.readouterr().err
    assert "Tracking run with wandb" in err  # W&B's lines are captured here
    assert "anonymous setting" not in err and "git root" not in err


# ---- 6. the recorded config ------------------------------------------------------------------------------------------


def test_recorded_hparams_hold_each_setting_once_and_no_internals(tmp_path):
    # Before: 133 lines, `alpha` and `data/alpha`, `_instantiator: lightning.pytorch.cli.instantiate_module`,
    # `config: '[Path_fsr(configs/quickstart.yaml, cwd=...)]'`.
    pytest.importorskip("tensorboard")
    cli_main(fit_args(tmp_path, "--trainer.enable_progress_bar", "false", "--trainer.logger", "TensorBoardLogger"))
    hparams = yaml.safe_load((tmp_path / "tensorboard" / "hparams.yaml").read_text())
    assert hparams["data/alpha"] == 0.5 and hparams["model/init_args/lr"] == 0.05
    assert hparams["federation/rounds"] == 1 and hparams["seed_everything"] == 0
    bare = {key for key in hparams if "/" not in key}
    assert bare <= {"seed_everything", "ckpt_path", "weights_only"}, bare  # every other setting under its group
    assert not [key for key in hparams if key.startswith("_") or key == "config"]
    assert not [value for value in hparams.values() if isinstance(value, str) and "Path_fsr" in value]


# ---- 7. the first and last round labelled on every curve -----------------------------------------------------------


def test_curves_label_the_first_and_last_round(tmp_path, figures):
    # Before: a 20-round curve ticked 3, 6, ..., 18.
    from fl_lightning.core.plots import plot_curve
    from fl_lightning.experiments.figures import plot_class_heatmap, plot_curves

    plot_curve(list(range(1, 21)), [0.5] * 20, tmp_path / "c.png")
    assert list(figures[-1].axes[0].get_xticks()) == [1, 5, 10, 15, 20]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = ["round,global_acc,acc_class_0,acc_class_1"] + [f"{r},0.5,0.4,0.6" for r in range(1, 21)]
    (run_dir / "metrics.csv").write_text("\n".join(rows) + "\n")
    (run_dir / "summary.json").write_text('{"status": "completed", "dataset": "digits"}')
    plot_curves([("s", "fedavg", 0, run_dir)], "s", tmp_path / "curves.png")
    assert list(figures[-1].axes[0].get_xticks()) == [1, 5, 10, 15, 20]
    plot_class_heatmap(run_dir, tmp_path / "heat.png", "fedavg")
    assert list(figures[-1].axes[0].get_xticks()) == [1, 5, 10, 15, 20]

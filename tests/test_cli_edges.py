"""The command line at its edges (issue 47): signals while it starts and ends, a default run location where runs never
meet, typos and broken YAML refused with the fix, value errors before the directory check, and a set-up that runs pip
only when something changed.

Each test names what a user got before.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import quickstart_fit_args, read_metrics, read_summary

from fl_lightning import cli, shipped_configs
from fl_lightning.cli import EXIT_CODES, run

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}
#: A tiny quickstart fit without a run directory: it goes to the default location.
TINY = [
    *("--data.num_clients", "2", "--federation.local_epochs", "1"),
    *("--trainer.enable_progress_bar", "false", "--federation.plots", "false"),
]
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def err_lines(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A completed 1-round run in its own directory, made once; tests that change it work on a copy."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert run(quickstart_fit_args(run_dir, rounds=1)) == 0
    return run_dir


@pytest.fixture
def done(finished, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy


# ---- 3, 4. a signal while the command starts or ends ----------------------------------------------------------------


def _wait_for_torch(pid: int, timeout: float = 60) -> None:
    """Until the process has started loading torch's libraries: the middle of the start-up imports."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if "libtorch" in Path(f"/proc/{pid}/maps").read_text():
                return
        except OSError:
            return
        time.sleep(0.01)


COMMANDS = {
    "cli.py": [sys.executable, "cli.py"],
    # what pip's `fl-lightning` script runs
    "fl-lightning": [sys.executable, "-c", "import sys; from fl_lightning.cli import main; sys.exit(main())"],
}


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/<pid>/maps")
@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(
    ("sig", "line"),
    [
        (
            signal.SIGTERM,
            "error: stopped by SIGTERM before training started; nothing was recorded: run the same command again",
        ),
        (signal.SIGINT, "error: interrupted before training started; nothing was recorded: run the same command again"),
    ],
    ids=["SIGTERM", "SIGINT"],
)
def test_signal_during_start_up_imports_exits_4_with_one_line(tmp_path, command, sig, line):
    # Before: SIGTERM while torch and Lightning were imported exited 143 without a word, Ctrl-C printed an import
    # traceback and exited 130.
    args = quickstart_fit_args(tmp_path / "r")
    proc = subprocess.Popen([*COMMANDS[command], *args], cwd=ROOT, env=ENV, stderr=subprocess.PIPE, text=True)
    _wait_for_torch(proc.pid)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_CODES["interrupted"], err
    assert err.strip().splitlines() == [line]
    assert not (tmp_path / "r").exists()


def test_importing_the_command_line_loads_neither_torch_nor_lightning():
    # Its signal handlers must be in place before those imports (pip's `fl-lightning` script imports it first).
    code = "import sys, fl_lightning.cli; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert not {m.split(".")[0] for m in out.stdout.split()} & {"torch", "lightning", "jsonargparse"}


@pytest.mark.slow
def test_repeated_ctrl_c_at_the_end_keeps_the_runs_exit_code(tmp_path):
    # Before: Ctrl-C pressed again and again (as a terminal sends it to the whole process group) while the run wrote
    # its final files ended the process by SIGINT (130, "KeyboardInterrupt" in an atexit callback of torch).
    run_dir = tmp_path / "r"
    env = {**ENV, "FL_LIGHTNING_FAULT": "during-final-writes:SIGINT"}
    proc = subprocess.Popen(
        [sys.executable, "cli.py", *quickstart_fit_args(run_dir, rounds=2)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    out = b""
    while b"round 2/2" not in out:
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        out += chunk
    sent = 0
    while proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        sent += 1
        time.sleep(0.01)
    text = (out + proc.stdout.read()).decode()
    assert sent > 0
    status = read_summary(run_dir)["status"]
    assert status in ("completed", "interrupted")
    assert proc.returncode == EXIT_CODES[status], text
    assert "Traceback" not in text and "Exception ignored" not in text


def test_main_from_python_restores_the_signal_handlers():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


# ---- 8, 13. a default run location where runs never meet ------------------------------------------------------------


def test_help_examples_run_in_order_each_in_a_new_version(tmp_path, monkeypatch, capsys):
    # Before: the second example of `fl-lightning --help` exited 2: "runs/quickstart already holds a completed run".
    monkeypatch.chdir(tmp_path)
    assert run(["fit", "--config", "quickstart", *TINY, "--federation.rounds", "1"]) == 0
    assert run(["fit", "--config", "quickstart", *TINY, "--model", "fedntd", "--federation.rounds", "1"]) == 0
    base = tmp_path / "runs" / "quickstart"
    assert sorted(p.name for p in base.iterdir()) == ["version_0", "version_1"]
    assert read_summary(base / "version_0")["method"] == "fedavg"
    assert read_summary(base / "version_1")["method"] == "fedntd"
    err = capsys.readouterr().err
    assert f"[fl_lightning] a new run in {Path('runs/quickstart/version_1')}" in err

    # --ckpt_path last resumes the newest run of the same settings (FedAvg's, not the newer FedNTD run) ...
    assert run(["fit", "--config", "quickstart", *TINY, "--federation.rounds", "2", "--ckpt_path", "last"]) == 0
    assert [row["round"] for row in read_metrics(base / "version_0")] == ["1", "2"]
    assert "extending a completed run from 1 to 2 rounds" in capsys.readouterr().err
    # ... and starts a new version when no run has these settings
    assert run(["fit", "--config", "quickstart", *TINY, "--seed_everything", "7", "--ckpt_path", "last",
                "--federation.rounds", "1"]) == 0  # fmt: skip
    assert read_summary(base / "version_2")["seed"] == 7
    assert "no run of these settings in runs/quickstart to resume: a new run in" in capsys.readouterr().err
    # --overwrite has nothing to replace in a new version: nothing is moved aside
    assert run(["fit", "--config", "quickstart", *TINY, "--federation.rounds", "1"], overwrite=True) == 0
    assert sorted(p.name for p in base.iterdir()) == [f"version_{n}" for n in range(4)]


def test_a_named_run_directory_is_used_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run(["fit", "--config", "quickstart", *TINY, "--federation.rounds", "1", "--trainer.default_root_dir",
                "mine"]) == 0  # fmt: skip
    assert read_summary(tmp_path / "mine")["status"] == "completed"
    # the run's own config names its directory: --config of it resumes there, not in a new version
    saved = str(tmp_path / "mine" / "config.yaml")
    assert run(["fit", "--config", saved, "--federation.rounds", "2", "--ckpt_path", "last"]) == 0
    assert read_summary(tmp_path / "mine")["rounds_done"] == 2
    assert not (tmp_path / "runs").exists()
    # from another directory too, and after the run was moved: the saved config names the folder it lies in
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert run(["fit", "--config", saved, "--federation.rounds", "3", "--ckpt_path", "last"]) == 0
    assert read_summary(tmp_path / "mine")["rounds_done"] == 3
    assert list((tmp_path / "elsewhere").iterdir()) == []
    shutil.move(tmp_path / "mine", tmp_path / "moved")
    moved = str(tmp_path / "moved" / "config.yaml")
    assert run(["fit", "--config", moved, "--federation.rounds", "4", "--ckpt_path", "last"]) == 0
    assert read_summary(tmp_path / "moved")["rounds_done"] == 4 and not (tmp_path / "mine").exists()


def test_a_completed_version_tells_how_to_rerun_it_as_a_versioned_command_can(tmp_path, monkeypatch, capsys):
    # Before: "pass --overwrite to rerun it", which in a versioned run starts a new version and leaves this one.
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", "quickstart", *TINY, "--federation.rounds", "1"]
    assert run(args) == 0
    capsys.readouterr()
    assert run([*args, "--ckpt_path", "last"]) == 2
    assert err_lines(capsys)[-1].endswith(
        "(raise --federation.rounds to extend it, or drop --ckpt_path to rerun it in a new version)"
    )
    assert run(args) == 0 and (tmp_path / "runs" / "quickstart" / "version_1" / "summary.json").is_file()


def test_a_run_directory_under_home_given_with_a_tilde(tmp_path, monkeypatch, capsys):
    # Before: the fit trained into ~/tr but exited 1 ("the fit stopped before its first round"), and a resume or
    # --overwrite was refused as a completed run: the claim expanded `~`, the command line's checks did not.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", "quickstart", *TINY, "--trainer.default_root_dir", "~/tr"]
    assert run([*args, "--federation.rounds", "1"]) == 0
    assert run([*args, "--federation.rounds", "2", "--ckpt_path", "last"]) == 0
    assert read_summary(tmp_path / "tr")["rounds_done"] == 2 and not (tmp_path / "~").exists()
    assert run([*args, "--federation.rounds", "1"], overwrite=True) == 0
    assert read_summary(tmp_path / "tr")["rounds_done"] == 1


def test_a_copy_of_a_shipped_config_never_writes_among_its_versions(tmp_path, monkeypatch, capsys):
    # Before: `configs quickstart > my.yaml` kept `default_root_dir: runs/quickstart`, so `fit --config my.yaml`
    # wrote a run straight into runs/quickstart beside version_0, and --overwrite then moved version_0 away with it.
    monkeypatch.chdir(tmp_path)
    assert run(["fit", "--config", "quickstart", *TINY, "--federation.rounds", "1"]) == 0
    assert shipped_configs.main(["quickstart"]) == 0
    (tmp_path / "my.yaml").write_text(capsys.readouterr().out)
    assert "default_root_dir" not in (tmp_path / "my.yaml").read_text()
    assert run(["fit", "--config", "my.yaml", *TINY, "--federation.rounds", "1"]) == 0
    assert read_summary(tmp_path / "runs" / "my" / "version_0")["status"] == "completed"
    # A directory of versioned runs named as one run's directory is refused, with --overwrite too.
    named = ["fit", "--config", "quickstart", *TINY, "--trainer.default_root_dir", "runs/quickstart"]
    for overwrite in (False, True):
        capsys.readouterr()
        assert run(named, overwrite=overwrite) == EXIT_CODES["bad input"]
        assert capsys.readouterr().err.strip().splitlines() == [
            "error: runs/quickstart holds the versioned runs of a config (version_0), not a run of its own: choose "
            "another --trainer.default_root_dir (a config file's trainer.default_root_dir names one too; with none, "
            "a fit takes a new runs/<config name>/version_N)"
        ]
    assert run([*named, "--ckpt_path", "last"]) == EXIT_CODES["bad input"]  # nothing to resume there: as fresh
    assert err_lines(capsys)[-1].startswith("error: runs/quickstart holds the versioned runs of a config (version_0)")
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["my", "quickstart"]
    assert sorted(p.name for p in (tmp_path / "runs" / "quickstart").iterdir()) == ["version_0"]
    # A logger's version_N folder (CSVLogger(save_dir=<run dir>, name="")) holds no run: the directory is usable.
    (tmp_path / "logged" / "version_0").mkdir(parents=True)
    (tmp_path / "logged" / "version_0" / "hparams.yaml").write_text("{}\n")
    assert run(["fit", "--config", "quickstart", *TINY, "--federation.rounds", "1", "--trainer.default_root_dir",
                "logged"]) == 0  # fmt: skip


def test_a_refused_fit_leaves_no_version_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run(["fit", "--config", "quickstart", *TINY, "--data.alpha", "0"]) == EXIT_CODES["bad input"]
    assert not (tmp_path / "runs").exists()
    # refused by the module's setup, once config.yaml was written: before, a version_0 holding only config.yaml
    tabular = ["--data.dataset", "helpers.TabularSource", "--data.num_clients", "2"]
    assert run(["fit", "--config", "quickstart", *TINY, *tabular]) == EXIT_CODES["bad input"]
    assert not (tmp_path / "runs").exists()
    assert run(["fit", "--config", "quickstart", *TINY, *tabular, "--trainer.default_root_dir", "mine"]) == 2
    assert not (tmp_path / "mine").exists()


def test_extending_a_completed_run_says_so_before_it_starts(done, capsys):
    # Before: a 1-round run resumed with 2 rounds was extended, and its results rewritten, without a word.
    assert run(quickstart_fit_args(done, "--ckpt_path", "last", rounds=2)) == 0
    err = capsys.readouterr().err
    note = "[fl_lightning] extending a completed run from 1 to 2 rounds: round 2 is trained, and its results"
    assert note in err


def test_scoring_a_checkpoint_of_other_rounds_than_the_config_says_so(finished, capsys):
    # Before: `test --ckpt_path last` scored the 1-round checkpoint of a config now asking for 20 rounds (a run
    # stopped early, or its rounds raised since) without a word.
    command = ["test", "--config", str(finished / "config.yaml"), "--ckpt_path", "last"]
    assert run(command) == 0
    assert not [line for line in err_lines(capsys) if "the checkpoint holds" in line]
    assert run([*command, "--federation.rounds", "20"]) == 0
    notes = [line for line in err_lines(capsys) if "the checkpoint holds" in line]
    assert notes == ["[fl_lightning] the checkpoint holds round 1 of the 20 the config asks for; scoring that model"]


# ---- 6. a completed run with a file missing is finished by the resume -----------------------------------------------


def test_a_resume_into_a_new_directory_writes_the_partition_and_keeps_the_client_state(tmp_path):
    # Before: a run resumed from another run's checkpoint into a new folder had no partition.csv, and a run finished
    # from its checkpoint (every round done) had lost summary.json's client_state.
    first = tmp_path / "first"
    assert run(quickstart_fit_args(first, "--model", "scaffold", rounds=1)) == 0
    usage = read_summary(first)["client_state"]
    assert usage["clients"] == 3
    moved = tmp_path / "moved"
    args = ["--model", "scaffold", "--ckpt_path", str(first / "checkpoints" / "last.ckpt")]
    assert run(quickstart_fit_args(moved, *args, rounds=2)) == 0
    assert (moved / "partition.csv").read_text() == (first / "partition.csv").read_text()
    (first / "summary.json").unlink()  # every round done, a file lost: the resume finishes the run
    assert run(quickstart_fit_args(first, "--model", "scaffold", "--ckpt_path", "last", rounds=1)) == 0
    assert read_summary(first)["status"] == "completed" and read_summary(first)["client_state"] == usage


@pytest.mark.parametrize("missing", ["config.yaml", "partition.csv"])
def test_completed_run_missing_a_file_is_finished_by_the_resume(done, missing):
    # Before: "holds a completed run ... nothing to resume" (exit 2), the file left missing.
    (done / missing).unlink()
    assert run(quickstart_fit_args(done, "--ckpt_path", "last", rounds=1)) == 0
    assert (done / missing).is_file() and read_summary(done)["status"] == "completed"


# ---- 9, 10. typos and broken YAML ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typo", "closest"),
    [("--federation.round", "--federation.rounds"), ("--federation.sample_rate", "--federation.sample_ratio")],
)
def test_a_misspelt_option_is_refused_with_the_closest(tmp_path, capsys, typo, closest):
    # Before: `--federation.round 3` was taken as --federation.rounds (argparse's prefix matching), and
    # `--federation.sample_rate` got no suggestion.
    assert run(quickstart_fit_args(tmp_path / "r", typo, "1", rounds=1)) == EXIT_CODES["bad input"]
    assert err_lines(capsys) == [f"error: unrecognized arguments: {typo} 1; did you mean {closest}?"]
    assert not (tmp_path / "r").exists()


def test_a_misspelt_model_option_is_refused_with_the_closest(tmp_path, capsys):
    assert run(quickstart_fit_args(tmp_path / "r", "--model", "fedntd", "--model.betta", "1")) == 2
    assert err_lines(capsys) == ["error: --model.betta: FedNTD has no option betta; did you mean --model.beta?"]


def test_a_misspelt_key_in_a_config_file_is_refused_with_the_closest(tmp_path, capsys):
    # Before: "error: Subcommand 'fit' does not accept option 'federation.round'", with no hint.
    typo = tmp_path / "typo.yaml"
    typo.write_text("federation:\n  round: 2\n")
    assert run(["fit", "--config", "quickstart", "--config", str(typo)]) == EXIT_CODES["bad input"]
    assert err_lines(capsys) == [
        "error: Subcommand 'fit' does not accept option 'federation.round'; did you mean --federation.rounds?"
    ]


def test_a_fit_without_a_method_names_the_methods(tmp_path, capsys):
    # Before: "error: the following arguments are required: fit.model".
    assert run(["fit", "--federation.rounds", "1", "--trainer.default_root_dir", str(tmp_path)]) == 2
    (line,) = err_lines(capsys)
    assert line.startswith("error: no method: give --model NAME (fedavg, kd, fedntd, ") and "configs lists" in line


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys):
    # Before: "Problems parsing config: while parsing a flow sequence ..." without the file or the line; with
    # --debug it named "<unicode string>" and exited 1.
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed_everything: 1\ntrainer:\n  default_root_dir: [a, b\nfederation:\n  rounds: 2\n")
    assert run(["fit", "--config", str(bad)]) == EXIT_CODES["bad input"]
    (line,) = err_lines(capsys)
    assert line.startswith(f"error: --config {bad}: not valid YAML at line 4, column 11: while parsing a flow")
    with pytest.raises(SystemExit) as stop:
        cli.main(["fit", "--config", str(bad), "--debug"])
    assert stop.value.code == EXIT_CODES["bad input"]  # --debug shows the traceback, with the same exit code
    err = capsys.readouterr().err
    assert "Traceback" in err and str(bad) in err


# ---- 11, 12. value errors first; more CPU processes than cores -----------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--federation.rounds", "-5"], "error: rounds must be at least 1, got -5"),
        (["--federation.sample_ratio", "0"], "error: sample_ratio must be in (0, 1], got 0.0"),
        (["--data.dataset", "nope"], "error: unknown dataset 'nope'"),
    ],
    ids=["rounds", "sample_ratio", "dataset"],
)
def test_value_errors_come_before_the_directory_check(finished, capsys, extra, message):
    # Before: with a run in the directory, each reported only "already holds a completed run".
    assert run(quickstart_fit_args(finished, *extra, rounds=1)) == EXIT_CODES["bad input"]
    assert err_lines(capsys)[-1].startswith(message)


@pytest.mark.slow
def test_more_cpu_devices_than_cores_is_said_in_one_warning(tmp_path):
    # Before: `--trainer.devices 4` on a 2-core CPU started 4 processes without a word.
    args = quickstart_fit_args(tmp_path / "r", "--trainer.accelerator", "cpu", "--trainer.devices", str(CORES + 1))
    out = subprocess.run(
        [sys.executable, "cli.py", *args, "--federation.rounds", "-5"],  # refused before anything starts
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == EXIT_CODES["bad input"]
    assert out.stderr.strip().splitlines() == [
        f"warning: --trainer.devices {CORES + 1} starts {CORES + 1} processes on {CORES} CPU cores: they take turns "
        f"on the cores and each round is slower than with --trainer.devices {CORES} or fewer",
        "error: rounds must be at least 1, got -5",
    ]


# ---- 14. a new user's other first commands -------------------------------------------------------------------------


def test_compare_help_names_the_command_not_a_source_path(capsys):
    # Before: "usage: cli.py compare" and "see fl_lightning/compare.py".
    with pytest.raises(SystemExit) as stop:
        cli.main(["compare", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: fl-lightning compare") and ".py" not in out


def test_nan_learning_rate_is_refused_in_plain_words(tmp_path, capsys):
    # Before: "--model.lr: expected float, got 'nan'".
    assert run(quickstart_fit_args(tmp_path / "r", "--model.lr", "nan")) == EXIT_CODES["bad input"]
    assert err_lines(capsys) == ["error: --model.lr: expected a finite float, got 'nan' (not a number)"]


def _fake_venv(tmp_path: Path) -> tuple[Path, Path]:
    """A virtual environment whose python and pip only write their arguments to a log."""
    venv, log = tmp_path / "venv", tmp_path / "calls.log"
    (venv / "bin").mkdir(parents=True)
    for tool in ("python", "pip", "ruff", "lint-imports", "mypy"):
        script = venv / "bin" / tool
        script.write_text(f'#!/usr/bin/env bash\necho "{tool} $*" >> "{log}"\n')
        script.chmod(0o755)
    return venv, log


@pytest.mark.parametrize("script", ["quickstart.sh", "test.sh"])
def test_set_up_runs_pip_only_when_something_changed(tmp_path, script):
    # Before: every `bash scripts/quickstart.sh` ran the pip steps again (19 s), installed torch's CUDA wheels
    # wherever it ran, and replaced the last quickstart run (another runs/quickstart.replaced-* folder each time).
    venv, log = _fake_venv(tmp_path)

    clean = {k: v for k, v in ENV.items() if k not in ("TORCH_SPEC", "TORCH_INDEX_URL")}  # the defaults are tested

    def set_up(**env: str) -> list[str]:
        log.unlink(missing_ok=True)
        subprocess.run(
            ["bash", f"scripts/{script}"], cwd=ROOT, env={**clean, "VENV": str(venv), **env}, check=True, timeout=60
        )
        return log.read_text().splitlines()

    first = set_up()
    assert [line for line in first if line.startswith("pip ")] == [
        "pip install -q --upgrade pip",
        "pip install -q torch==2.14.1 torchvision==0.29.1",
        "pip install -q -e .[dev]",
    ]
    again = set_up()
    assert [line for line in again if line.startswith("pip ")] == []
    if script == "quickstart.sh":
        assert again == ["python cli.py fit --config configs/quickstart.yaml"]  # no --overwrite: a new version
    cpu = set_up(TORCH_INDEX_URL="https://example.org/whl/cpu", TORCH_SPEC="/wheels/torch.whl")
    assert "pip install -q --index-url https://example.org/whl/cpu /wheels/torch.whl" in cpu


def test_help_says_where_runs_go(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert re.search(r"runs/<config name>/version_N", capsys.readouterr().out)


def test_fit_help_lists_the_front_doors_flags(capsys):
    # Before: --overwrite and --debug were only in the top-level --help.
    assert run(["fit", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--overwrite replaces the run a directory holds" in out and "--debug shows an error's traceback" in out


@pytest.mark.parametrize("name", ["best", "hpc", "registry"])
def test_lightnings_other_checkpoint_names_say_what_a_federation_keeps(tmp_path, monkeypatch, capsys, name):
    # Before: "--ckpt_path best: no such file", though fit --help (Lightning's text) offers best, hpc and registry.
    monkeypatch.chdir(tmp_path)
    assert run(["fit", "--config", "quickstart", *TINY, "--ckpt_path", name]) == EXIT_CODES["bad input"]
    assert err_lines(capsys) == [
        f"error: --ckpt_path {name}: a federation keeps one checkpoint, <run dir>/checkpoints/last.ckpt (the global "
        "model after the last finished round); pass --ckpt_path last, or a checkpoint file"
    ]
    assert not (tmp_path / "runs").exists()


# ---- 7. two comparisons on one output folder ------------------------------------------------------------------------


def _hold(run_dir: str, held, done) -> None:
    from fl_lightning.core.run_lock import claim_run_dir, release_run_dir

    claim_run_dir(run_dir)
    held.set()
    done.wait(120)
    release_run_dir(run_dir)


@pytest.mark.slow
def test_compare_says_when_another_process_took_a_run_after_its_check(tmp_path, monkeypatch, capsys):
    # Before: a second comparison whose fit found the run directory held (the other comparison's fit claimed it
    # between this one's check and its fit) reported "digits/fedavg/seed0: completed (exit code 2)" and "did not
    # finish ...; run again to retry", never that another process was running it.
    import multiprocessing

    import yaml

    from fl_lightning.experiments import compare

    base = yaml.safe_load((ROOT / "configs/quickstart.yaml").read_text())
    base["data"]["num_clients"] = 2
    base["federation"].update({"rounds": 1, "local_epochs": 1})
    (tmp_path / "fedavg.yaml").write_text(yaml.safe_dump(base))
    spec = {"name": "tiny", "output_dir": str(tmp_path / "out"), "methods": ["fedavg"], "seeds": [0]}
    spec["settings"] = {"digits": str(tmp_path / "{method}.yaml")}
    (tmp_path / "compare.yaml").write_text(yaml.safe_dump(spec))
    run_dir = compare.CompareSpec.from_yaml(tmp_path / "compare.yaml").runs()[0].run_dir
    monkeypatch.setattr(compare.Run, "in_use", lambda self: None)  # the other process claims it after this check
    ctx = multiprocessing.get_context("fork")
    held, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(run_dir), held, done))
    holder.start()
    try:
        assert held.wait(30)
        assert compare.main(["--config", str(tmp_path / "compare.yaml")]) == 1
    finally:
        done.set()
        holder.join(30)
    out = capsys.readouterr().out
    assert f"digits/fedavg/seed0: skipped: {run_dir} is in use by another fit (pid {holder.pid})" in out
    assert "1 run(s) were being run by another process" in out
    assert "exit code 2" not in out and "did not finish" not in out


def test_a_value_error_during_the_rounds_is_a_failed_run(tmp_path, monkeypatch, capsys):
    # Before: exit 2 ("nothing was run") for a run that had started and was recorded as failed.
    from fl_lightning.federation import Federation

    def broken(*_):
        raise ValueError("a bad value met in round 1")

    monkeypatch.setattr(Federation, "on_train_epoch_start", broken)
    assert run(quickstart_fit_args(tmp_path / "r", rounds=1)) == EXIT_CODES["failed"]
    assert read_summary(tmp_path / "r")["status"] == "failed"
    assert err_lines(capsys)[-1] == "error: ValueError: a bad value met in round 1"


def test_a_fit_stopped_before_its_first_round_says_so(tmp_path, monkeypatch, capsys):
    # Before: exit 1 with no line at all (a Timer whose max_time was spent, or any callback stopping the fit at its
    # start, ends it before the federation records anything).
    (tmp_path / "stop_at_start.py").write_text(
        "from lightning.pytorch.callbacks import Callback\n\n\n"
        "class StopAtStart(Callback):\n"
        "    def on_fit_start(self, trainer, pl_module):\n"
        "        trainer.should_stop = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    args = quickstart_fit_args(tmp_path / "r", "--trainer.callbacks", "stop_at_start.StopAtStart", rounds=1)
    assert run(args) == EXIT_CODES["failed"]
    lines = err_lines(capsys)
    assert lines[-1] == (
        "error: the fit stopped before its first round (a callback asked it to, e.g. --trainer.max_time already "
        "spent); nothing was recorded"
    ), lines


def test_one_callback_on_the_command_line(tmp_path):
    # Before: `--trainer.callbacks X` (one callback, not a list) failed with "NSKeyError: Key must be a string, got: 0."
    early = "lightning.pytorch.callbacks.EarlyStopping"
    options = ("--trainer.callbacks.monitor", "global_acc", "--trainer.callbacks.mode", "max")
    stop = ("--trainer.callbacks.patience", "0", "--trainer.callbacks.min_delta", "1.0")  # no round gains 100 points
    args = quickstart_fit_args(tmp_path / "r", "--trainer.callbacks", early, *options, *stop, rounds=3)
    assert run(args) == 0
    summary = read_summary(tmp_path / "r")
    assert summary["status"] == "completed" and summary["stopped_early_round"] == 2


@pytest.mark.parametrize(
    ("args", "shown", "key"),
    [
        (["--federation.rounds", "1", "--config", "quickstart"], "--federation.rounds 1", "federation.rounds"),
        (["--model", "FedNTD", "-c", "quickstart"], "--model FedNTD", "model"),
        (["--model.init_args.lr=0.1", "--config=quickstart"], "--model.init_args.lr 0.1", "model.lr"),
    ],
)
def test_an_option_a_later_config_sets_again_is_refused(tmp_path, capsys, args, shown, key):
    # Before: the config's value won silently (`--federation.rounds 1 --config quickstart` trained 20 rounds).
    option = "-c" if "-c" in args else "--config"
    root = ["--trainer.default_root_dir", str(tmp_path / "r")]
    assert run(["fit", *args, *root]) == EXIT_CODES["bad input"]
    assert err_lines(capsys) == [
        f"error: {shown} comes before {option} quickstart, which sets {key} again (options apply from left to right, "
        f"so the file's value would be used): give {option} first, then {shown}"
    ]
    assert not (tmp_path / "r").exists()


def test_an_option_before_a_config_that_leaves_it_alone_or_given_again_is_taken(tmp_path):
    piece = tmp_path / "piece.yaml"
    piece.write_text("data:\n  alpha: 0.3\n")
    args = ["fit", "--federation.rounds", "1", "--config", "quickstart", "--federation.rounds", "2"]
    args += ["--data.num_clients", "4", "--config", str(piece), "--trainer.default_root_dir", str(tmp_path / "r")]
    assert run([*args, "--trainer.enable_progress_bar", "false"]) == 0
    assert read_summary(tmp_path / "r")["rounds_done"] == 2

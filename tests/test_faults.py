"""No fault leaves a run stuck, mixed or silently wrong (issue 22).

Each test reproduces one of the failures found by trying faults on the quickstart as a user would, and checks what
must hold instead. Signals are sent at exact moments through the test hook ``FL_LIGHTNING_FAULT=<moment>:<SIGNAL>``
(:mod:`fl_lightning.core.faults`), never after a sleep.
"""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml
from helpers import one_thread, quickstart_fit_args, read_summary, tiny_run

from fl_lightning import cli
from fl_lightning.core.files import (
    DamagedCheckpoint,
    seal_checkpoint,
    temporary_name,
    verify_checkpoint,
    write_text_atomic,
)
from fl_lightning.core.run_lock import claim_run_dir, release_run_dir
from fl_lightning.core.rundir import RunDirError, check_run_dir
from fl_lightning.experiments.compare_spec import CompareSpec, Run

ROOT = Path(__file__).resolve().parent.parent
TIMING = {"round_seconds", "elapsed_seconds"}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def fit_args(run_dir: Path, *extra: str, rounds: int = 3) -> list[str]:
    """A tiny quickstart fit with its plots: a finished run's files here include ``curve.png``."""
    return quickstart_fit_args(run_dir, *extra, rounds=rounds, plots=True)


def subprocess_fit(run_dir: Path, fault: str, *extra: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "cli.py", *fit_args(run_dir, *extra)],
        cwd=ROOT,
        env={**ENV, "FL_LIGHTNING_FAULT": fault},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv") as f:
        return [{k: v for k, v in row.items() if k not in TIMING} for row in csv.DictReader(f)]


def last_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def temporaries(run_dir: Path) -> list[Path]:
    return [p for d in (run_dir, run_dir / "checkpoints") for p in d.glob(".*.tmp*")]


@pytest.fixture(scope="module", autouse=True)
def in_one_thread():
    """In-process fits use one thread, as the subprocess fits (ENV) do, so that their metrics can be compared."""
    with one_thread():
        yield


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """A completed 3-round run, made once; tests that change it work on a copy."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    assert cli.run(fit_args(run_dir)) == 0
    return run_dir


@pytest.fixture
def copy(reference, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    return out


# ---- 1. a run with every round done can always be finished ------------------------------------------------------


def test_sigterm_after_the_last_round_then_resume_finishes_the_run(tmp_path, reference, monkeypatch, capsys, caplog):
    # Before: the run stayed `interrupted` (exit 4) for ever; `--ckpt_path last` wrote nothing (max_epochs reached).
    run_dir = tmp_path / "run"
    monkeypatch.setenv("FL_LIGHTNING_FAULT", "after-last-round:SIGTERM")
    assert cli.run(fit_args(run_dir)) == 4
    assert last_error_line(capsys) == "error: stopped by SIGTERM; resume the run with --ckpt_path last"
    assert read_summary(run_dir)["status"] == "interrupted"
    (run_dir / "curve.png").unlink()
    monkeypatch.delenv("FL_LIGHTNING_FAULT")
    with pytest.raises(RunDirError, match="resume it with --ckpt_path last"):
        cli.cli_main(fit_args(run_dir))  # a plain re-run advises the resume ...
    assert cli.run(fit_args(run_dir, "--ckpt_path", "last")) == 0  # ... which works
    assert "all 3 rounds are done: writing what is missing, marking the run completed" in caplog.text
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["rounds_done"] == 3
    assert (run_dir / "curve.png").exists() and rows(run_dir) == rows(reference)


@pytest.mark.slow
def test_sigkill_after_the_last_checkpoint_then_resume_finishes_the_run(tmp_path, reference):
    # Before: `running` with a dead pid, and `--ckpt_path last` exited 1 without writing anything.
    run_dir = tmp_path / "run"
    proc = subprocess_fit(run_dir, "after-last-checkpoint:SIGKILL")
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert read_summary(run_dir)["status"] == "running" and not (run_dir / "curve.png").exists()
    assert cli.run(fit_args(run_dir, "--ckpt_path", "last")) == 0
    assert read_summary(run_dir)["status"] == "completed"
    assert (run_dir / "curve.png").exists() and rows(run_dir) == rows(reference)


@pytest.mark.parametrize("fault", ["summary deleted", "summary says interrupted", "summary says running, pid gone"])
def test_a_finished_run_with_a_damaged_record_is_finished_by_resume(copy, reference, fault):
    # Before: a deleted or edited summary left the run unfinishable (exit 4 or 1, nothing written).
    summary = read_summary(copy)
    (copy / "curve.png").unlink()
    if fault == "summary deleted":
        (copy / "summary.json").unlink()
    else:
        summary.update(status=fault.split()[2].strip(","), pid=2**22 + 12345)
        (copy / "summary.json").write_text(json.dumps(summary))
    assert cli.run(fit_args(copy, "--ckpt_path", "last")) == 0
    assert read_summary(copy)["status"] == "completed"
    assert (copy / "curve.png").exists() and rows(copy) == rows(reference)


@pytest.mark.parametrize("lost", ["config.yaml", "partition.csv"])
def test_a_completed_run_lacking_one_file_is_completed_by_resume(copy, reference, lost):
    # config.yaml: Lightning writes it again before the Federation looks, which then took the run for whole.
    (copy / lost).unlink()
    assert cli.run(fit_args(copy, "--ckpt_path", "last")) == 0
    assert (copy / lost).exists() and read_summary(copy)["status"] == "completed" and rows(copy) == rows(reference)


@pytest.mark.slow
def test_compare_finishes_a_run_instead_of_retrying_it(tmp_path, capsys):
    # Before: compare resumed the run on every call, the resume exited 4, and compare exited 0.
    spec = _tiny_spec(tmp_path)
    run = spec.runs()[0]
    assert cli.run(spec.fit_args(run)) == 0  # the run exactly as compare makes it
    summary = read_summary(run.run_dir)
    summary["status"] = "interrupted"
    (run.run_dir / "summary.json").write_text(json.dumps(summary))
    (run.run_dir / "curve.png").unlink()
    assert run.state() == "partial"
    assert _compare(spec) == 0
    assert run.state() == "done" and (run.run_dir / "curve.png").exists()
    assert "all 2 rounds" in (run.run_dir / "stdout.log").read_text()


# ---- 2. a signal at any moment: one status, its exit code, and a recommendation that works ----------------------


def _send_sigint_before_plotting(monkeypatch):
    import fl_lightning.core.plots

    real = fl_lightning.core.plots.plot_curve

    def plot_curve(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(fl_lightning.core.plots, "plot_curve", plot_curve)


@pytest.mark.parametrize(
    "inject", ["hook SIGINT", "hook SIGTERM", "SIGINT as the plot is drawn"], ids=lambda v: v.replace(" ", "-")
)
def test_signal_during_the_final_writes_leaves_a_whole_completed_run(tmp_path, monkeypatch, capsys, caplog, inject):
    # Before: SIGINT there left `completed` in the summary but exit 4 "interrupted; resume" (refused), no curve.png.
    run_dir = tmp_path / "run"
    if inject.startswith("hook"):
        monkeypatch.setenv("FL_LIGHTNING_FAULT", f"during-final-writes:{inject.split()[1]}")
    else:
        _send_sigint_before_plotting(monkeypatch)
    assert cli.run(fit_args(run_dir, rounds=1)) == 0
    assert "received: the final files of the run (completed) were written before it took effect" in caplog.text
    assert "error:" not in capsys.readouterr().err and "resume" not in caplog.text
    assert read_summary(run_dir)["status"] == "completed"
    assert (run_dir / "curve.png").exists() and not temporaries(run_dir)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are back


@pytest.mark.slow
def test_sigterm_during_start_up_is_interrupted_with_one_line(tmp_path):
    # Before: exit 143, no message, no summary.
    run_dir = tmp_path / "run"
    proc = subprocess_fit(run_dir, "after-data-line:SIGTERM")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 4
    assert err.strip().splitlines()[-1] == (
        "error: stopped by SIGTERM before training started; nothing was recorded: run the same command again"
    )
    assert not (run_dir / "summary.json").exists()
    assert cli.run(fit_args(run_dir, rounds=1)) == 0  # the same command again works


def test_ctrl_c_during_start_up_is_interrupted_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FL_LIGHTNING_FAULT", "after-data-line:SIGINT")
    assert cli.run(fit_args(tmp_path / "run", rounds=1)) == 4
    assert last_error_line(capsys).startswith("error: interrupted before training started; nothing was recorded")
    assert not (tmp_path / "run" / "summary.json").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C works again in this process


# ---- 3. a checkpoint is verified before any resume ----------------------------------------------------------------


def _flip_bytes_in_a_weight(ckpt: Path, count: int = 400) -> None:
    """Flip ``count`` bytes in the middle of the checkpoint's largest tensor (its zip record stays well-formed)."""
    blob = bytearray(ckpt.read_bytes())
    with zipfile.ZipFile(ckpt) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
        data = archive.read(info)
    start = blob.find(data) + len(data) // 2 - count // 2
    blob[start : start + count] = bytes(b ^ 0x5A for b in blob[start : start + count])
    ckpt.write_bytes(bytes(blob))


def test_a_corrupted_checkpoint_is_refused_not_trusted(copy, capsys):
    # Before: the resume ran from the damaged weights (every later round at 0.0972) and ended `completed`, exit 0.
    summary = read_summary(copy)
    summary["status"] = "interrupted"
    (copy / "summary.json").write_text(json.dumps(summary))
    _flip_bytes_in_a_weight(copy / "checkpoints" / "last.ckpt")
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    assert cli.run(fit_args(copy, "--ckpt_path", "last", rounds=5)) == 2
    line = last_error_line(capsys)
    assert line.startswith(f"error: checkpoint {copy / 'checkpoints' / 'last.ckpt'} cannot be loaded")
    assert "does not match its" in line  # its checksum, or the CRC-32 of the record the bytes are in
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("damage", ["truncated", "random bytes", "a YAML file"])
def test_a_damaged_checkpoint_given_by_path_is_refused_with_one_line(copy, capsys, damage):
    # Before: exit 1 with torch's "Invalid argument" or its long "Weights only load failed" text, no file named.
    ckpt = copy / "checkpoints" / "last.ckpt"
    if damage == "truncated":
        ckpt.write_bytes(ckpt.read_bytes()[:100_000])
    elif damage == "random bytes":
        ckpt.write_bytes(os.urandom(50_000))
    else:
        shutil.copy(ROOT / "configs/quickstart.yaml", ckpt)
    assert cli.run(fit_args(copy, "--ckpt_path", str(ckpt), rounds=5)) == 2
    line = last_error_line(capsys)
    assert line.startswith(f"error: checkpoint {ckpt} cannot be loaded")
    said = {
        "truncated": "(cut short: its archive ends early); it is damaged",
        "random bytes": "it is no PyTorch checkpoint; give --ckpt_path a checkpoint file",
        "a YAML file": "it is a text file, not a checkpoint (a config goes to --config); give --ckpt_path a checkpoint",
    }[damage]
    assert said in line, line


def test_checksum_round_trip(tmp_path):
    import torch

    path = tmp_path / "c.ckpt"
    torch.save({"state_dict": {"w": torch.arange(1000.0)}, "callbacks": {}}, path)
    assert verify_checkpoint(path) is False  # torch's own CRCs only
    seal_checkpoint(path)
    assert verify_checkpoint(path) is True
    assert torch.load(path, weights_only=True)["state_dict"]["w"].sum() == 499500
    _flip_bytes_in_a_weight(path, count=8)
    with pytest.raises(DamagedCheckpoint, match="cannot be loaded"):
        verify_checkpoint(path)


def test_python_api_refuses_a_corrupted_checkpoint(tmp_path):
    # Before: trainer.fit(ckpt_path=...) trained on from the damaged weights.
    tiny_run(tmp_path, rounds=1)
    last = (tmp_path / "checkpoints" / "last.ckpt").resolve()
    _flip_bytes_in_a_weight(last)
    with pytest.raises(RunDirError, match="cannot be loaded"):
        tiny_run(tmp_path, rounds=2, ckpt_path=str(last))


# ---- 4. a full disk ---------------------------------------------------------------------------------------------


def _mount_tmpfs(path: Path, size: int) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


def _fill_disk_on_second_checkpoint(monkeypatch) -> None:
    """Without a small file system: the second checkpoint write fails as on a full disk, after writing a part."""
    import errno

    from lightning.pytorch.callbacks import ModelCheckpoint

    real = ModelCheckpoint._save_checkpoint
    calls = []

    def save(self, trainer, filepath):
        calls.append(filepath)
        if len(calls) == 2:
            Path(filepath).write_bytes(b"part of a checkpoint")
            raise OSError(errno.ENOSPC, "No space left on device", filepath)
        return real(self, trainer, filepath)

    monkeypatch.setattr(ModelCheckpoint, "_save_checkpoint", save)


@pytest.mark.parametrize("disk", ["tmpfs", "patched write"])
def test_full_disk_fails_cleanly_and_resumes_exactly(tmp_path, reference, monkeypatch, capsys, disk):
    # Before: the summary stayed `running` with a dead pid and no error, and `.last.tmp.ckpt` kept the disk full.
    mount = tmp_path / "disk"
    ckpt_size = (reference / "checkpoints" / "last.ckpt").stat().st_size
    others = sum(-(-p.stat().st_size // 4096) * 4096 for p in reference.glob("*") if p.is_file())
    if disk == "tmpfs":
        if not _mount_tmpfs(mount, others + ckpt_size * 3 // 2):
            pytest.skip("cannot mount a small tmpfs here (needs root); the patched write covers the case")
    else:
        mount.mkdir()
        _fill_disk_on_second_checkpoint(monkeypatch)
    try:
        run_dir = mount / "run"
        assert cli.run(fit_args(run_dir)) == 1
        assert "No space left on device" in last_error_line(capsys)
        summary = read_summary(run_dir)
        assert summary["status"] == "failed" and "No space left on device" in summary["error"]
        assert not temporaries(run_dir)
        assert verify_checkpoint(run_dir / "checkpoints" / "last.ckpt")
        monkeypatch.undo()
        if disk == "tmpfs":
            subprocess.run(["mount", "-o", "remount,size=20m", str(mount)], check=True)
        assert cli.run(fit_args(run_dir, "--ckpt_path", "last")) == 0
        assert read_summary(run_dir)["status"] == "completed" and rows(run_dir) == rows(reference)
    finally:
        if disk == "tmpfs":
            subprocess.run(["umount", str(mount)], check=False)


class _FullDiskFile:
    """A file opened for writing on a disk that fills up: its first write writes a part, then fails (ENOSPC)."""

    def __init__(self, file) -> None:
        self.file = file

    def __enter__(self) -> _FullDiskFile:
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()

    def write(self, data) -> int:
        import errno

        self.file.write(bytes(data[:100]))
        raise OSError(errno.ENOSPC, "No space left on device")  # as a write's own error: naming no file


def test_a_full_disk_names_the_checkpoint_not_its_temporary(tmp_path, monkeypatch, capsys):
    # Before: "OSError: [Errno 28] No space left on device: '<run>/checkpoints/.last.tmp-<pid>-<n>.ckpt'", the
    # temporary's name, which is gone when the user looks, and no word on what to do.
    import fl_lightning.core.files

    opened: list[str] = []

    def open_on_a_full_disk(path, mode="r", *args, **kwargs):
        file = open(path, mode, *args, **kwargs)
        if str(path).endswith(".ckpt") and "w" in mode:
            opened.append(str(path))
            if len(opened) == 2:  # the second round's checkpoint
                return _FullDiskFile(file)
        return file

    monkeypatch.setattr(fl_lightning.core.files, "open", open_on_a_full_disk, raising=False)
    run_dir = tmp_path / "run"
    assert cli.run(fit_args(run_dir, "--federation.plots", "false")) == 1
    line = last_error_line(capsys)
    target = run_dir / "checkpoints" / "last.ckpt"
    assert line == (
        f"error: OSError: [Errno 28] No space left on device (ENOSPC) writing the checkpoint {target}: free space on "
        "that disk and resume (--ckpt_path last, in Python trainer.fit(..., ckpt_path='last')), or give "
        "--trainer.default_root_dir (in Python L.Trainer(default_root_dir=...)) a folder on another disk"
    )
    assert not temporaries(run_dir) and read_summary(run_dir)["rounds_done"] == 2
    assert verify_checkpoint(target)  # the first round's, whole


def test_a_full_disk_names_a_checkpoint_of_your_own_model_checkpoint(tmp_path, monkeypatch):
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    import fl_lightning.core.files
    from fl_lightning.checkpoint import VerifiedCheckpointIO

    monkeypatch.setattr(fl_lightning.core.files, "open", lambda *args: _FullDiskFile(open(*args)), raising=False)
    target = tmp_path / "epoch=1.ckpt"
    with pytest.raises(OSError, match=rf"\(ENOSPC\) writing the checkpoint {target}: free space") as err:
        VerifiedCheckpointIO(TorchCheckpointIO()).save_checkpoint({"w": 1}, target)
    assert err.value.errno == 28 and not list(tmp_path.iterdir())


def test_checkpoints_are_written_beside_the_run_not_in_the_systems_temporary_folder(tmp_path, reference, monkeypatch):
    # Before: Lightning's fsspec transaction staged each checkpoint in $TMPDIR: a full /tmp failed the run in round
    # 1 ("No space left on device", naming no file) though the run's own disk had room.
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no such folder"))
    run_dir = tmp_path / "run"
    assert cli.run(fit_args(run_dir)) == 0
    assert verify_checkpoint(run_dir / "checkpoints" / "last.ckpt") and rows(run_dir) == rows(reference)
    assert not temporaries(run_dir)


def test_summary_of_a_failure_is_written_even_when_no_temporary_fits(tmp_path, monkeypatch):
    import errno
    from types import SimpleNamespace

    import fl_lightning.recorder
    from fl_lightning.recorder import RunRecorder

    recorder = RunRecorder(tmp_path, {"method": "FedAvg"}, plots=False, total_rounds=2)
    trainer = SimpleNamespace(is_global_zero=True, loggers=[], progress_bar_callback=None)
    recorder.start(trainer)

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(fl_lightning.recorder, "write_text_atomic", full)
    recorder.finish(trainer, "failed", "OSError: [Errno 28] No space left on device")
    summary = read_summary(tmp_path)
    assert summary["status"] == "failed" and "No space left" in summary["error"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


# ---- 5. two runs never mix ----------------------------------------------------------------------------------------


def _race(run_dir: str, start, tried, results) -> None:
    """One of several processes starting a fit in the same directory at the same moment."""
    start.wait()
    try:
        claim_run_dir(run_dir)
        check_run_dir(run_dir, {}, resume=False, overwrite=False)  # refuses a directory another fit wrote
        Path(run_dir, "summary.json").write_text(json.dumps({"status": "completed", "writer": os.getpid()}))
        results.put("ran")
    except RunDirError:
        results.put("refused")
    tried.wait()  # the winner holds the directory until every other process has tried
    release_run_dir(run_dir)


@pytest.mark.slow
def test_concurrent_starts_never_share_a_directory(tmp_path):
    # Before: the directory check ran before anything claimed the directory; 2 of 7 concurrent fits mixed.
    ctx = multiprocessing.get_context("fork")
    for attempt in range(25):
        run_dir = str(tmp_path / f"run{attempt}")
        start, tried, results = ctx.Barrier(4), ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_race, args=(run_dir, start, tried, results)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        outcomes = sorted(results.get(timeout=5) for _ in procs)
        assert outcomes == ["ran", "refused", "refused", "refused"], f"attempt {attempt}: {outcomes}"


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except OSError:
        return False


def _pending(pid: int, sig: int) -> bool:
    """Whether a signal sent to the process waits for it (it is stopped)."""
    status = Path(f"/proc/{pid}/status").read_text()
    pending = next(line.split()[1] for line in status.splitlines() if line.startswith("ShdPnd:"))
    return bool(int(pending, 16) & (1 << (sig - 1)))


def _wait_stopped(proc: subprocess.Popen) -> None:
    deadline = time.time() + 120
    while not _stopped(proc.pid) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)  # waiting for the hook's SIGSTOP, not timing the fault
    assert _stopped(proc.pid), "the fit never reached the after-claim hook"


@pytest.mark.slow
def test_a_second_fit_is_refused_while_the_first_runs(tmp_path, capsys):
    # Before: both fits wrote into the directory: config/partition of one seed, summary/metrics of the other.
    run_dir = tmp_path / "run"
    first = subprocess_fit(run_dir, "after-claim:SIGSTOP", "--seed_everything", "1")
    try:
        _wait_stopped(first)
        assert cli.run(fit_args(run_dir)) == 2  # the command line ...
        assert last_error_line(capsys) == (
            f"error: {run_dir} is in use by another fit (pid {first.pid}); wait for it to end or stop it, "
            "or choose another --trainer.default_root_dir (in Python L.Trainer(default_root_dir=...))"
        )
        with pytest.raises(RunDirError, match="is in use by another fit"):
            tiny_run(run_dir, rounds=1)  # ... and the Python API
    finally:
        first.send_signal(signal.SIGCONT)
    first.communicate(timeout=120)
    assert first.returncode == 0
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["seed"] == 1
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["seed_everything"] == 1
    assert not (run_dir / ".lock").exists()


def _write_many(path: str, n: int, errors) -> None:
    try:
        for i in range(n):
            write_text_atomic(Path(path), f"{os.getpid()} {i}\n" * 50)
    except Exception as err:  # noqa: BLE001
        errors.put(repr(err))


def test_processes_writing_the_same_file_never_collide(tmp_path):
    # Before: two comparisons sharing an output folder wrote the same temporary; one failed with FileNotFoundError.
    ctx = multiprocessing.get_context("fork")
    target, errors = str(tmp_path / "results.md"), ctx.Queue()
    procs = [ctx.Process(target=_write_many, args=(target, 200, errors)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert errors.empty(), errors.get()
    assert len(set(Path(target).read_text().splitlines())) == 1  # one writer's whole file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.md"]
    assert temporary_name(Path(target)) != temporary_name(Path(target))


def _tiny_spec(tmp_path: Path, overrides: list[str] | None = None) -> CompareSpec:
    base = yaml.safe_load((ROOT / "configs/quickstart.yaml").read_text())
    base["data"]["num_clients"] = 3
    base["federation"].update({"rounds": 2, "local_epochs": 1})
    (tmp_path / "fedavg.yaml").write_text(yaml.safe_dump(base))
    spec = {
        "name": "tiny",
        "output_dir": str(tmp_path / "out"),
        "methods": ["fedavg"],
        "seeds": [0],
        "settings": {"digits": str(tmp_path / "{method}.yaml")},
        "overrides": overrides or [],
    }
    (tmp_path / "compare.yaml").write_text(yaml.safe_dump(spec))
    return CompareSpec.from_yaml(tmp_path / "compare.yaml")


def _compare(spec: CompareSpec) -> int:
    from fl_lightning.experiments.compare import main

    return main(["--config", str(spec.output_dir.parent / "compare.yaml")])


@pytest.mark.slow
def test_compare_exits_1_when_a_run_fails(tmp_path, capsys):
    # Before: compare exited 0 with failed runs.
    spec = _tiny_spec(tmp_path, overrides=["--data.alpha", "0"])
    assert _compare(spec) == 1
    assert "1 run(s) did not finish: digits/fedavg/seed0" in capsys.readouterr().out


def _hold(run_dir: str, held, done) -> None:
    claim_run_dir(run_dir)
    held.set()
    done.wait(60)
    release_run_dir(run_dir)


def test_compare_leaves_a_run_that_another_process_runs(tmp_path, capsys):
    # Before: a second comparison started a second fit in the same run directory.
    spec = _tiny_spec(tmp_path)
    run = spec.runs()[0]
    ctx = multiprocessing.get_context("fork")
    held, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(run.run_dir), held, done))
    holder.start()
    try:
        assert held.wait(30)
        assert _compare(spec) == 1
    finally:
        done.set()
        holder.join(30)
    out = capsys.readouterr().out
    assert f"skipped: {run.run_dir} is in use by another fit (pid {holder.pid})" in out
    assert not (run.run_dir / "stdout.log").exists()


def test_ctrl_c_on_compare_is_one_line(tmp_path, monkeypatch, capsys):
    # Before: a traceback.
    import fl_lightning.experiments.compare

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    spec = _tiny_spec(tmp_path)
    monkeypatch.setattr(fl_lightning.experiments.compare, "run_comparison", interrupted)
    try:
        with pytest.raises(SystemExit) as stop:
            cli.main(["compare", "--config", str(spec.output_dir.parent / "compare.yaml")])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C on compare escaped as a traceback")
    assert stop.value.code == 4
    assert last_error_line(capsys).startswith("error: compare interrupted; run the same command again")


@pytest.mark.slow
def test_ctrl_c_on_compare_stops_its_fits(tmp_path):
    spec = _tiny_spec(tmp_path)
    run = spec.runs()[0]
    compare = subprocess.Popen(
        [sys.executable, "cli.py", "compare", "--config", str(tmp_path / "compare.yaml")],
        cwd=ROOT,
        env={**ENV, "FL_LIGHTNING_FAULT": "after-claim:SIGSTOP"},  # the fit stops itself once it holds its dir
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # Ctrl-C as in a terminal
    )
    deadline = time.time() + 120
    fit = None
    while fit is None and compare.poll() is None and time.time() < deadline:
        tasks = Path(f"/proc/{compare.pid}/task").glob("*/children")  # the fits start from compare's threads
        children = [pid for task in tasks for pid in task.read_text().split()]
        fit = next((int(pid) for pid in children if _stopped(int(pid))), None)
        time.sleep(0.02)
    assert fit is not None, "the comparison's fit never reached the after-claim hook"
    compare.send_signal(signal.SIGINT)
    while not _pending(fit, signal.SIGINT) and time.time() < deadline + 60:
        time.sleep(0.02)  # until compare has passed its Ctrl-C on to the fit (taken once it continues)
    os.kill(fit, signal.SIGCONT)
    _, err = compare.communicate(timeout=120)
    assert compare.returncode == 4
    assert err.strip().splitlines()[-1].startswith("error: compare interrupted")
    assert "Traceback" not in err
    assert run.state() != "done"


# ---- 6. the reason of every bad value ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (["--model.lr", "abc"], "error: --model.lr: expected float, got 'abc'"),
        (["--model.init_args.momentum", "x"], "error: --model.momentum: expected float, got 'x'"),
        (
            ["--model", "fl_lightning.methods.FedNTD", "--model.beta", "abc"],
            "error: --model.beta: expected float, got 'abc'",
        ),
        (
            ["--federation.server_optimizer", "fl_lightning.FedAdam", "--federation.server_optimizer.lr", "abc"],
            "error: --federation.server_optimizer.lr: expected float, got 'abc'",
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_a_bad_value_inside_a_class_names_its_reason(tmp_path, capsys, extra, line):
    # Before: `error: --model: Parser key "model": Problem with given class_path ...: Parser key "lr":`
    assert cli.run(fit_args(tmp_path / "r", *extra)) == 2
    assert last_error_line(capsys) == line
    assert not (tmp_path / "r").exists()


def test_run_state_resumes_a_failed_run_with_a_checkpoint(copy):
    summary = read_summary(copy)
    summary.update(status="failed", error="OSError: [Errno 28] No space left on device")
    (copy / "summary.json").write_text(json.dumps(summary))
    assert Run("s", "fedavg", 0, Path("x"), copy).state() == "partial"


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_starts_again_on_resume(tmp_path):
    # The round was recorded, the checkpoint never written: `--ckpt_path last` has nothing to resume and starts anew.
    run_dir = tmp_path / "run"
    proc = subprocess_fit(run_dir, "after-last-round:SIGKILL", "--federation.rounds", "1")
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL and not (run_dir / "checkpoints").exists()
    assert cli.run(fit_args(run_dir, "--ckpt_path", "last", rounds=2)) == 0
    assert read_summary(run_dir)["status"] == "completed" and len(rows(run_dir)) == 2

"""A simulation across nodes: two nodes on one host (one process each) end cleanly with one run written.

Each node is its own ``torchrun --nnodes 2`` launcher, as on two machines sharing a filesystem, or a task with the
environment ``srun --nodes 2 --ntasks-per-node 1`` gives it (SLURM); the tests check the exit codes, a bounded wall
time and that the per-round metrics equal a single process's.
"""

from __future__ import annotations

import csv
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
FIT = ["cli.py", "fit", "--config", "configs/quickstart.yaml", "--federation.rounds", "2"]
QUIET = ["--trainer.enable_progress_bar", "false", "--federation.plots", "false"]
LIMIT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    # A clean environment: what other tests of this process left behind (a master port, a run directory, a rank)
    # must not reach the launchers.
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV", "WANDB_MODE", "WANDB_SILENT")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **extra}


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children first found, then theirs), read from ``/proc``."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _start_nodes(
    run_dir: Path, node_env: dict[int, dict[str, str]] | None = None, node_args: dict[int, list[str]] | None = None
) -> list[subprocess.Popen[str]]:
    """Two torchrun launchers (one process each), each in a session of its own (its group can be killed)."""
    port = _free_port()
    procs = []
    for rank in (0, 1):
        cmd = [
            *TORCHRUN,
            "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
            "--master-addr", "127.0.0.1", "--master-port", str(port),
            *FIT, *QUIET,
            "--trainer.devices", "1", "--trainer.num_nodes", "2", "--trainer.strategy", "ddp",
            "--trainer.accelerator", "cpu", "--trainer.default_root_dir", str(run_dir),
            *(node_args or {}).get(rank, []),
        ]  # fmt: skip
        env = _env(**(node_env or {}).get(rank, {}))
        out = subprocess.PIPE
        procs.append(
            subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True
            )
        )
    return procs


def _two_nodes(
    run_dir: Path, node_env: dict[int, dict[str, str]] | None = None, node_args: dict[int, list[str]] | None = None
) -> tuple[list[int], list[str], float]:
    start = time.monotonic()
    procs = _start_nodes(run_dir, node_env, node_args)
    outputs, codes = [], []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            for p in procs:
                os.killpg(p.pid, signal.SIGKILL)
            said = "\n---\n".join((p.communicate()[0] or "")[-3000:] for p in procs)
            raise AssertionError(f"a node did not exit within {LIMIT_S} s:\n{said}") from None
        outputs.append(out)
        codes.append(proc.returncode)
    return codes, outputs, time.monotonic() - start


def _slurm_nodes(run_dir: Path) -> tuple[list[int], list[str]]:
    """Two tasks with the variables SLURM sets for ``srun --nodes 2 --ntasks-per-node 1`` (Lightning reads them)."""
    port = str(_free_port())
    procs = []
    for rank in (0, 1):
        slurm = {
            "SLURM_NTASKS": "2", "SLURM_PROCID": str(rank), "SLURM_LOCALID": "0", "SLURM_NODEID": str(rank),
            "SLURM_JOB_ID": "42", "SLURM_JOB_NAME": "fl", "SLURM_NODELIST": "127.0.0.1",
            "SLURM_JOB_NODELIST": "127.0.0.1", "SLURM_NTASKS_PER_NODE": "1", "MASTER_PORT": port,
        }  # fmt: skip
        cmd = [
            sys.executable, *FIT, *QUIET, "--trainer.devices", "1", "--trainer.num_nodes", "2",
            "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu", "--trainer.default_root_dir", str(run_dir),
        ]  # fmt: skip
        env, out = _env(**slurm), subprocess.PIPE
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True))
    outputs = [proc.communicate(timeout=LIMIT_S)[0] for proc in procs]
    return [proc.returncode for proc in procs], outputs


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_two_nodes_end_cleanly_with_one_process_results(tmp_path: Path) -> None:
    from fl_lightning.cli import run

    single = tmp_path / "single"  # one process: this one
    fit = [*FIT[1:], *QUIET, "--trainer.default_root_dir", str(single)]
    fit[fit.index("configs/quickstart.yaml")] = str(ROOT / "configs/quickstart.yaml")
    assert run(fit) == 0

    nodes = tmp_path / "nodes"
    codes, outputs, wall = _two_nodes(nodes)
    assert codes == [0, 0], "\n---\n".join(out[-2000:] for out in outputs)
    assert wall < LIMIT_S
    one, two = _rows(single), _rows(nodes)
    assert [r["round"] for r in two] == ["1", "2"]
    for a, b in zip(one, two, strict=True):
        for key in ("global_acc", "global_loss", "train_loss"):
            assert float(b[key]) == pytest.approx(float(a[key]), abs=1e-4), key
    # One run written, by global rank 0: one summary, and no second copy of the files.
    assert sorted(p.name for p in nodes.iterdir() if p.name.startswith("summary")) == ["summary.json"]


@pytest.mark.slow
def test_two_slurm_nodes_end_cleanly(tmp_path: Path) -> None:
    codes, outputs = _slurm_nodes(tmp_path / "run")
    assert codes == [0, 0], "\n---\n".join(out[-2000:] for out in outputs)
    assert [r["round"] for r in _rows(tmp_path / "run")] == ["1", "2"]


@pytest.mark.slow
def test_a_failing_node_says_why_and_the_other_stops(tmp_path: Path) -> None:
    # Node 1 kills itself once its data is set up, as a crashed machine would; node 0 must not wait for it.
    codes, outputs, wall = _two_nodes(tmp_path / "run", {1: {"FL_LIGHTNING_FAULT": "after-data-line:SIGKILL"}})
    assert codes[0] != 0 and codes[1] != 0, codes
    assert wall < LIMIT_S
    assert "error:" in outputs[0], outputs[0][-2000:]


@pytest.mark.parametrize("launcher", [{"WORLD_SIZE": "2", "RANK": "0"}, {"SLURM_NTASKS": "2", "SLURM_PROCID": "1"}])
def test_nodes_must_name_their_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], launcher: dict[str, str]
) -> None:
    """The default runs/<config>/version_N is chosen by each process: a launched process refuses it at start.

    What torchrun (``WORLD_SIZE``) or srun (``SLURM_NTASKS``) sets is all the check reads, so one process in this one
    stands for every node (the launchers themselves run in the tests above).
    """
    from fl_lightning.cli import EXIT_CODES, run

    for name, value in launcher.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # where the default run directory would go
    fit = [*FIT[1:], *QUIET]
    fit[fit.index("configs/quickstart.yaml")] = str(ROOT / "configs/quickstart.yaml")
    assert run(fit) == EXIT_CODES["bad input"]
    said = capsys.readouterr().err.strip().splitlines()
    assert said[-1].startswith("error: ") and "name its directory with --trainer.default_root_dir" in said[-1], said
    assert list(tmp_path.iterdir()) == []


_END_GROUP = """
import sys, time
import torch.distributed as dist
from fl_lightning.core.distributed import end_process_group
rank, port, late = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
if rank == 1:
    time.sleep(late)
start = time.monotonic()
ended = end_process_group(wait_s=1.0)
after, start = time.monotonic() - start, time.monotonic()
again = end_process_group(wait_s=1.0)  # as at exit, after the command's own call
print(f"again={again} in {time.monotonic() - start:.1f}", flush=True)
print(f"ended={ended} initialized={dist.is_initialized()} after={after:.1f}", flush=True)
"""


def _two_gloo_processes(script: str, *args: str) -> tuple[list[int], list[str]]:
    """``script`` run by two processes with ``rank port *args`` as arguments; their exit codes and outputs."""
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(rank), port, *args],
            cwd=ROOT,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    return [p.returncode for p in procs], outs


@pytest.mark.slow
@pytest.mark.parametrize("late", [0.0, 3.0], ids=["together", "one-late"])
def test_a_finished_process_ends_its_process_group(late: float) -> None:
    """What the command does after a fit (``fl_lightning.cli.run``): the gloo group is destroyed before exit once
    both processes got there, not left to the interpreter's shutdown, which can abort a process that finished its
    run; a process that does not come in time is not waited for, and its group is left as it is, without a second
    wait at exit."""
    codes, outs = _two_gloo_processes(_END_GROUP, str(late))
    assert codes == [0, 0], outs
    said = [out.strip().splitlines()[-1] for out in outs]
    # a second call (the one at exit) never waits again: the group is gone, or was waited for once and left
    assert all(out.strip().splitlines()[-2] == "again=False in 0.0" for out in outs), outs
    if late == 0.0:
        assert all(line.startswith("ended=True initialized=False") for line in said), said
    else:  # rank 0 gives up after its 1 s and leaves the group; rank 1 then finds no one to end it with
        assert said[0].startswith("ended=False initialized=True"), said
        assert float(said[0].rsplit("=", 1)[1]) < 2.5, said


_END_AT_EXIT = """
import atexit, sys
import torch.distributed as dist
from fl_lightning.core.distributed import end_process_group_at_exit
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
atexit.register(lambda: print(f"at exit: initialized={dist.is_initialized()}", flush=True))  # runs last
end_process_group_at_exit()
"""


@pytest.mark.slow
def test_a_fit_from_python_ends_its_process_group_at_exit() -> None:
    """What the ``Federation`` callback arranges in a fit of several processes (a script under ``torchrun``): the
    gloo group is destroyed at exit, before the interpreter's shutdown."""
    codes, outs = _two_gloo_processes(_END_AT_EXIT)
    assert codes == [0, 0], outs
    for out in outs:
        lines = out.strip().splitlines()
        assert lines[-1] == "at exit: initialized=False", out


def test_the_end_at_exit_is_registered_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from fl_lightning.core import distributed

    registered: list[object] = []
    monkeypatch.setattr(distributed.atexit, "register", registered.append)
    monkeypatch.setattr(distributed.atexit, "unregister", lambda f: registered.remove(f) if f in registered else None)
    distributed.end_process_group_at_exit()
    distributed.end_process_group_at_exit()  # a second fit in the same process
    assert registered == [distributed.end_process_group]


def test_the_callback_arranges_the_end_with_several_processes_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers import tiny_run

    import fl_lightning.federation as federation

    arranged: list[bool] = []
    monkeypatch.setattr(federation, "end_process_group_at_exit", lambda: arranged.append(True))
    tiny_run(tmp_path / "one", rounds=1)
    assert arranged == []  # one process: no group to end
    monkeypatch.setattr(federation, "is_distributed", lambda: True)  # as in each of several processes
    tiny_run(tmp_path / "several", rounds=1)
    assert arranged == [True]


# ---- the nodes' settings agree ---------------------------------------------------------------------------------------


def test_the_settings_fingerprint_leaves_out_what_a_node_may_have_of_its_own() -> None:
    from fl_lightning.core.agreement import differences, settings_fingerprint

    base = {
        "seed_everything": 0,
        "data": {"root": "/data/a", "download": True, "alpha": 0.5, "num_workers": 2},
        "federation": {"rounds": 2},
        "trainer": {"default_root_dir": "/mnt/a/run", "logger": {"save_dir": "/a"}, "enable_progress_bar": True},
        "ckpt_path": "/mnt/a/run/checkpoints/last.ckpt",
    }
    other = {
        "seed_everything": 0,
        "data": {"root": "/data/b", "download": False, "alpha": 0.5, "num_workers": 0},
        "federation": {"rounds": 2.0},  # the same number
        "trainer": {"default_root_dir": "/mnt/b/run", "logger": False, "enable_progress_bar": False},
        "ckpt_path": "/mnt/b/run/checkpoints/last.ckpt",  # another mount of the same run: both resume
    }
    assert differences(settings_fingerprint(base), settings_fingerprint(other)) == []
    fresh = {**other, "ckpt_path": None, "seed_everything": 1, "federation": {"rounds": 3}}
    assert differences(settings_fingerprint(base), settings_fingerprint(fresh)) == [
        "ckpt_path: resume -> fresh",
        "federation.rounds: 2 -> 3",
        "seed_everything: 0 -> 1",
    ]


def test_the_fingerprint_takes_one_setting_as_one_however_it_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by review: a class path by its alias, an option left None, or (for Flower) the precision a node's own GPU
    # chose were refused as differences between identically started nodes.
    from fl_lightning.core import agreement
    from fl_lightning.core.agreement import differences, settings_fingerprint

    alias, full = (
        {"model": {"class_path": "fl_lightning.FedAvg"}},
        {"model": {"class_path": "fl_lightning.module.FedAvg"}},
    )
    assert differences(settings_fingerprint(alias), settings_fingerprint(full)) == []
    assert differences(settings_fingerprint({"data": {"new_option": None}}), settings_fingerprint({})) == []
    cpu, gpu = {"trainer": {"precision": "32-true"}}, {"trainer": {"precision": "bf16-mixed"}}
    assert differences(settings_fingerprint(cpu, science_only=True), settings_fingerprint(gpu, science_only=True)) == []
    monkeypatch.setattr(agreement, "is_distributed", lambda: True)
    monkeypatch.setattr(agreement, "all_gather_object", lambda own: [own, (1, settings_fingerprint(gpu))])
    with pytest.raises(ValueError, match=r"precision: 32-true -> bf16-mixed \(the precision each machine's GPU chose"):
        agreement.check_same_settings(cpu, 0)  # torchrun's processes train together: refused, saying why


def test_nodes_with_other_settings_are_refused_on_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """What each rank does with the gathered fingerprints (the gather itself runs in the two-node test below)."""
    from fl_lightning.core import agreement
    from fl_lightning.core.agreement import settings_fingerprint

    config = {"seed_everything": 0, "federation": {"rounds": 2}, "model": {"init_args": {"lr": 0.1}}}
    node1 = {"seed_everything": 0, "federation": {"rounds": 3}, "model": {"init_args": {"lr": 0.1}}}
    monkeypatch.setattr(agreement, "is_distributed", lambda: True)
    monkeypatch.setattr(agreement, "all_gather_object", lambda own: [own, (1, settings_fingerprint(node1))])
    with pytest.raises(ValueError) as err:
        agreement.check_same_settings(config, 0)
    line = str(err.value)
    assert "\n" not in line and line.startswith(
        "rank 1 (node 1) was started with other settings than rank 0 (node 0): federation.rounds: 2 -> 3 (rank 0's"
    ), line
    assert "start every node with the same command line" in line and "data.root" in line, line
    monkeypatch.setattr(agreement, "all_gather_object", lambda own: [own, own])
    agreement.check_same_settings(config, 0)  # the same settings: no refusal


def test_a_fit_from_python_compares_its_live_settings() -> None:
    """Without a command line, the nodes compare the module's, the data's, the federation's and the Trainer's."""
    from types import SimpleNamespace

    from fl_lightning.core.agreement import differences, fit_settings, settings_fingerprint

    def settings(lr: float, seed: int) -> dict[str, str]:
        module = SimpleNamespace(hparams={"lr": lr, "net": object()})  # an object: named by its class, not its address
        trainer = SimpleNamespace(datamodule=SimpleNamespace(hparams={"root": "/x", "seed": seed}), precision="32")
        return settings_fingerprint(fit_settings(trainer, module, {"rounds": 2}))

    assert differences(settings(0.1, 0), settings(0.1, 0)) == []
    assert differences(settings(0.1, 0), settings(0.2, 1)) == ["data.seed: 0 -> 1", "model.init_args.lr: 0.1 -> 0.2"]


@pytest.mark.slow
def test_nodes_started_with_other_settings_are_refused(tmp_path: Path) -> None:
    codes, outputs, wall = _two_nodes(tmp_path / "run", node_args={1: ["--seed_everything", "1"]})
    # torchrun exits 1 for any worker that failed; its report names the worker's own exit code (2: bad input)
    assert codes == [1, 1], "\n---\n".join(out[-2000:] for out in outputs)
    for out in outputs:
        said = [line for line in out.splitlines() if line.startswith("error: ")]
        assert len(said) == 1, out[-3000:]
        assert said[0].startswith("error: rank 1 (node 1) was started with other settings than rank 0 (node 0): ")
        assert "seed_everything: 0 -> 1" in said[0], said
        assert "exitcode  : 2" in out, out[-2000:]
    assert wall < 60
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.slow
def test_a_frozen_node_fails_the_other_within_the_process_timeout(tmp_path: Path) -> None:
    """Node 1 stops itself (SIGSTOP, as a frozen machine) once its data is set up; node 0 fails at its next collective
    within ``--federation.process_timeout``, saying so, instead of waiting torch's 30 minutes."""
    limit = ["--federation.process_timeout", "5"]
    start = time.monotonic()
    procs = _start_nodes(tmp_path / "run", {1: {"FL_LIGHTNING_FAULT": "after-data-line:SIGSTOP"}}, {0: limit, 1: limit})
    try:
        out, _ = procs[0].communicate(timeout=LIMIT_S)
        wall = time.monotonic() - start
    finally:
        for proc in procs:  # node 1's launcher and its stopped process (torchrun starts it in a group of its own)
            for pid in [*_descendants(proc.pid), proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.communicate(timeout=60)
    assert procs[0].returncode != 0, out[-3000:]
    said = [line for line in out.splitlines() if line.startswith("error: ")]
    assert said and "another process did not answer within 5s" in said[0], out[-3000:]
    assert "--federation.process_timeout" in said[0], said
    assert wall < 90, wall
    print(f"node 0 failed after {wall:.1f}s: {said[0]}")


def test_the_process_group_timeout_says_what_to_change() -> None:
    from fl_lightning.cli_errors import one_line

    gloo = RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 300000ms for recv operation")
    line = one_line(gloo)
    assert line.startswith("another process did not answer within 300s") and "--federation.process_timeout" in line


@pytest.mark.slow
def test_ctrl_c_on_one_node_ends_both_promptly(tmp_path: Path) -> None:
    """A Ctrl-C in node 0's terminal reaches its torchrun (which starts its process in a session of its own and
    passes SIGINT on): the process records the run ``interrupted``, says so and exits at once instead of waiting
    at exit for the other node, which fails, until torchrun kills it 30 s later."""
    run_dir = tmp_path / "run"
    procs = _start_nodes(run_dir, node_args={0: ["--federation.rounds", "40"], 1: ["--federation.rounds", "40"]})
    try:
        deadline = time.monotonic() + LIMIT_S
        while time.monotonic() < deadline and len(_rows(run_dir) if (run_dir / "metrics.csv").exists() else []) < 2:
            time.sleep(0.2)
        interrupted = time.monotonic()
        os.kill(procs[0].pid, signal.SIGINT)
        outs, after = [], []
        for proc in procs:
            outs.append(proc.communicate(timeout=LIMIT_S)[0])
            after.append(time.monotonic() - interrupted)
    finally:
        for proc in procs:
            for pid in [*_descendants(proc.pid), proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    print(f"exit codes {[p.returncode for p in procs]}, {after[0]:.1f}s and {after[1]:.1f}s after the Ctrl-C")
    assert "error: interrupted; resume the run with --ckpt_path last" in outs[0], outs[0][-3000:]
    assert max(after) < 20, after  # torchrun's own grace period is 30 s
    assert procs[0].returncode != 0 and procs[1].returncode != 0  # torchrun exits 1 for any process that failed
    assert read_status(run_dir) == "interrupted"


def read_status(run_dir: Path) -> str:
    import json

    return str(json.loads((run_dir / "summary.json").read_text())["status"])


def test_a_process_that_left_its_group_does_not_wait_at_exit() -> None:
    """After a failed or interrupted fit the command leaves the group: the end at exit then waits for no one."""
    import torch.distributed as dist

    from fl_lightning.core import distributed

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        distributed.leave_process_group()
        assert distributed.end_process_group() is False and dist.is_initialized()  # left as it is
    finally:
        distributed._LEFT.discard(id(dist.group.WORLD))
        dist.destroy_process_group()

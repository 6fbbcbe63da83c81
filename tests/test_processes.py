"""Several processes share a round's clients (DDP on CPU, gloo) and give the single-process results."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _federate_processes import federate
from helpers import one_thread, read_summary

from fl_lightning.methods import METHODS

SCRIPT = Path(__file__).with_name("_federate_processes.py")
# FedAvg, a distillation method, and a method with server and client state.
PROC_METHODS = ["fedavg", "fedntd", *(["scaffold"] if "scaffold" in METHODS else ["fedka"])]
#: The batched engine across processes: FedAvg, and SCAFFOLD's control variates stacked per client.
BATCHED = ["fedavg", PROC_METHODS[-1]]


def _run(out: Path, devices: int, rounds: int, *extra: str) -> None:
    """The script in one process, or in ``devices`` processes that ``torchrun`` starts once for all their fits."""
    # One thread per process in both runs, so that every client's arithmetic is the same kernel for kernel.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(devices)]
    cmd = [*(launcher if devices > 1 else [sys.executable]), str(SCRIPT), str(out), str(devices), str(rounds)]
    proc = subprocess.run([*cmd, *PROC_METHODS, *extra], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_two_processes_match_one_and_write_the_results_once(tmp_path: Path) -> None:
    """Each method's rounds and final weights with two processes equal one process's, with the sequential and the
    batched engine; rank 0 alone writes the run.

    One test for all (not one per method): the federation of several processes is its cost, and pytest-xdist would
    run a shared fixture once on each worker. The single process is this one (one thread, as each of the two).
    """
    # The two-process run stops after round 2 and resumes: its rounds 1-2 are a plain two-process run, its round 3
    # a resumed one, so one run checks both against the single process.
    runs = {"one": tmp_path / "one", "two": tmp_path / "two"}
    with one_thread():
        federate(runs["one"], 1, 3, PROC_METHODS, resume_from=2)
    _run(runs["two"], 2, 3, "--resume-from", "2", "--batched", *BATCHED)
    for method in PROC_METHODS:
        one, two = _rows(runs["one"] / method), _rows(runs["two"] / method)
        assert [r["round"] for r in two] == ["1", "2", "3"], method
        for a, b in zip(one, two, strict=True):
            for key in ("global_acc", "global_loss", "train_loss"):
                assert float(b[key]) == pytest.approx(float(a[key]), abs=1e-4), (method, key)
        w1 = torch.load(runs["one"] / method / "weights.pt")
        w2 = torch.load(runs["two"] / method / "weights.pt")
        for name, value in w1.items():
            torch.testing.assert_close(w2[name], value, atol=1e-5, rtol=0, msg=f"{method}: {name}")
    run_dir = runs["two"] / "fedavg"
    assert (run_dir / "summary.json").exists()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.ckpt"]

    # The batched engine's two rounds across the two processes: the single process's first two sequential rounds.
    for method in BATCHED:
        one, two = runs["one"] / method, runs["two"] / "batched" / method
        assert read_summary(one)["engine"] == "sequential" and read_summary(two)["engine"] == "batched"
        rows_one, rows_two = _rows(one)[:2], _rows(two)
        assert [r["round"] for r in rows_two] == ["1", "2"]
        for a, b in zip(rows_one, rows_two, strict=True):
            assert float(b["train_loss"]) == pytest.approx(float(a["train_loss"]), abs=1e-5)
            assert float(b["global_loss"]) == pytest.approx(float(a["global_loss"]), abs=1e-5)
        # Two rounds across processes: SCAFFOLD's control variates carry one round's rounding into the next (on some
        # CPUs 4.7e-5 after round 2), so the weights get a round's worth more room than one round's 1e-5.
        w1, w2 = torch.load(one / "weights_2.pt"), torch.load(two / "weights.pt")
        for name, value in w1.items():
            torch.testing.assert_close(w2[name], value, atol=1e-4, rtol=0, msg=f"{method} batched: {name}")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_gpus_match_one_gpu(tmp_path: pytest.TempPathFactory) -> None:
    _run(tmp_path / "one", 1, 2, "--accelerator", "gpu")
    _run(tmp_path / "two", 2, 2, "--accelerator", "gpu")
    for method in PROC_METHODS:
        one, two = _rows(tmp_path / "one" / method), _rows(tmp_path / "two" / method)
        for a, b in zip(one, two, strict=True):
            assert float(b["global_acc"]) == pytest.approx(float(a["global_acc"]), abs=1e-3)


_UNSENDABLE = """
import sys
import lightning as L
from fl_lightning import FedAvg, FederatedDataModule, Federation

class KeepsAFunction(FedAvg):
    def on_client_start(self, client):
        if self.trainer.global_rank == 1:  # one process's clients only: the other must not wait for it
            client.state["fn"] = lambda: 0

trainer = L.Trainer(
    accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, callbacks=[Federation(rounds=2, plots=False)],
    logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    default_root_dir=sys.argv[1],
)
try:
    trainer.fit(KeepsAFunction(net="lenet", lr=0.05), datamodule=FederatedDataModule("digits", num_clients=4))
except TypeError as err:
    print(f"rank {trainer.global_rank}: {err}", flush=True)
"""


@pytest.mark.slow
def test_a_client_state_processes_cannot_send_is_named_in_one_line_on_every_process(tmp_path: Path) -> None:
    # Before: the process holding it raised pickle's "Can't pickle local object", the other gloo's "Connection closed
    # by peer".
    script = tmp_path / "unsendable.py"
    script.write_text(_UNSENDABLE)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*launcher, str(script), str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=300
    )
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank "))
    assert len(lines) == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    for rank, line in enumerate(lines):
        assert re.fullmatch(
            rf"rank {rank}: client \d+'s state\['fn'\] holds a function \(KeepsAFunction.on_client_start.<locals>."
            r"<lambda>\), which processes cannot send each other: keep only tensors, .* in on_client_start\)",
            line,
        ), line

"""The Fashion-MNIST FedNTD-paper setting the diagnostics in ``bench/`` share (run them as ``python bench/<x>.py``)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml

from fl_lightning import FederatedDataModule

ROOT = Path(__file__).resolve().parents[1]


def bare_trainer(root: str | Path, *callbacks: L.Callback, **overrides: Any) -> L.Trainer:
    """A CPU Trainer for a measurement: no logger, checkpoint, progress bar or model summary."""
    kwargs: dict[str, Any] = {
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": str(root),
    }
    return L.Trainer(callbacks=list(callbacks), **{**kwargs, **overrides})


def fmnist_ntd_datamodule(partition: str = "shard") -> FederatedDataModule:
    """100 clients, shard s = 2 (``shard``) or LDA α = 0.1 (``dirichlet``), batch 50, 64 per class held out."""
    return FederatedDataModule(
        "fashion_mnist",
        partition=partition,
        shards_per_client=2,
        alpha=0.1,
        num_clients=100,
        batch_size=50,
        holdout_per_class=64,
    )


def cli_fit(config: str | Path, out: Path, *extra: str, env: dict[str, str] | None = None) -> list[dict[str, str]]:
    """``cli.py fit --config config`` into ``out`` as a user runs it (no plots, no progress bar): its metrics rows.

    ``extra``: more CLI arguments. Exits with the fit's last error line when it fails.
    """
    cmd = [sys.executable, str(ROOT / "cli.py"), "fit", "--config", str(config), "--federation.plots", "false"]
    cmd += ["--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(out), *extra]
    done = subprocess.run(cmd, cwd=ROOT, env=env or dict(os.environ), capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        sys.exit(f"{Path(config).name} {' '.join(extra)}: the fit failed: {last}")
    with open(out / "metrics.csv") as f:
        return list(csv.DictReader(f))


def run_setting(ckpt: str | Path) -> tuple[dict[str, Any], FederatedDataModule, dict[str, Any], dict[str, Any]]:
    """A saved run's setting, read from its checkpoint and from the ``config.yaml`` beside its ``checkpoints/``.

    Returns the checkpoint, the run's datamodule (set up), its module's arguments and its ``federation`` section.
    Exits with one line when the checkpoint does not sit in the run directory that wrote it.
    """
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    config = Path(ckpt).resolve().parents[1] / "config.yaml"
    if not config.is_file():
        sys.exit(f"{ckpt}: no {config}; name a checkpoint inside the run directory that wrote it")
    federation = yaml.safe_load(config.read_text()).get("federation") or {}
    data = {k: v for k, v in state["datamodule_hyper_parameters"].items() if not k.startswith("_")}
    dm = FederatedDataModule(**data)
    dm.setup("fit")
    model = {k: v for k, v in state["hyper_parameters"].items() if not k.startswith("_")}
    return state, dm, model, federation


def rounds_done(state: dict[str, Any], federation: dict[str, Any]) -> int:
    """The last round whose global model a checkpoint holds (a diverged run keeps its last finite one).

    Read from the evaluated rounds, so the run must have evaluated every round (``eval_every: 1``, the default);
    exits with one line otherwise.
    """
    if int(federation.get("eval_every", 1)) != 1:
        sys.exit("a checkpoint of a run with eval_every > 1 does not say which round its weights are from")
    history = state["callbacks"]["Federation"]["record"]["history"]
    return int(history[-1]["round"]) if history else 0


def round_lr_scale(state: dict[str, Any], federation: dict[str, Any]) -> float:
    """The learning-rate scale of the round after the checkpoint's: ``lr_decay`` to the rounds done."""
    return float(federation.get("lr_decay", 1.0)) ** rounds_done(state, federation)


def run_seed(state: dict[str, Any]) -> int:
    """The run's seed: the federation's (sampling and batch order), which ``seed_everything`` also gives the data."""
    return int(state["callbacks"]["Federation"]["seed"])

"""Tiny digits federations, each an ordinary ``Trainer.fit``, for the several-process tests to compare.

One process: ``python tests/_federate_processes.py OUT_DIR 1 ROUNDS METHOD ...`` (or :func:`federate` called in the
test's process). Several: ``python -m torch.distributed.run --standalone --nproc-per-node N
tests/_federate_processes.py OUT_DIR N ROUNDS METHOD ...`` (DDP, gloo on CPU): the launcher starts the N processes
once and every fit runs in them, as a job script's fits do, instead of Lightning starting N - 1 new processes per fit.

For every method it writes ``OUT_DIR/<method>/`` (the run directory) and, on rank 0, ``weights.pt`` with the final
global weights. With ``--resume-from K`` it first runs K rounds (saving ``weights_K.pt``), then resumes from
``last.ckpt`` up to ROUNDS. ``--batched M ...`` then runs those methods with the batched engine for K rounds (ROUNDS
without ``--resume-from``) into ``OUT_DIR/batched/<method>/``.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import FederatedDataModule, Federation
from fl_lightning.methods import METHODS


def fit(
    method: str,
    run_dir: Path,
    devices: int,
    rounds: int,
    ckpt_path: str | None,
    accelerator: str,
    engine: str = "sequential",
    weights: str = "weights.pt",
) -> None:
    dm = FederatedDataModule(
        "digits", num_clients=6, partition="dirichlet", alpha=0.5, batch_size=32, holdout_per_class=2, seed=0
    )
    L.seed_everything(0, verbose=False)
    model = METHODS[method](net="lenet", num_classes=10, in_channels=1, image_size=8, lr=0.05)
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=rounds,
        callbacks=[
            Federation(rounds=rounds, sample_ratio=0.5, local_epochs=2, plots=False, engine=engine),
            ModelCheckpoint(dirpath=run_dir / "checkpoints", save_last=True, save_top_k=0),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(run_dir),
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    if trainer.is_global_zero:
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, run_dir / weights)


def federate(
    out: Path,
    devices: int,
    rounds: int,
    methods: Sequence[str],
    resume_from: int = 0,
    accelerator: str = "cpu",
    batched: Sequence[str] = (),
) -> None:
    """Every method's fits (see the module's docstring), one after another in this process (or these processes)."""
    for method in methods:
        run_dir = out / method
        if resume_from:
            fit(method, run_dir, devices, resume_from, None, accelerator, weights=f"weights_{resume_from}.pt")
            last = str(run_dir / "checkpoints" / "last.ckpt")
            fit(method, run_dir, devices, rounds, last, accelerator)
        else:
            fit(method, run_dir, devices, rounds, None, accelerator)
    for method in batched:
        fit(method, out / "batched" / method, devices, resume_from or rounds, None, accelerator, "batched")


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("devices", type=int)
    parser.add_argument("rounds", type=int)
    parser.add_argument("methods", nargs="+")
    parser.add_argument("--resume-from", type=int, default=0)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--batched", nargs="*", default=[])
    args = parser.parse_args()
    federate(args.out, args.devices, args.rounds, args.methods, args.resume_from, args.accelerator, args.batched)


if __name__ == "__main__":
    main()

"""Run tiny digits federations with N CPU processes (DDP, gloo) and save what the tests compare.

Usage: python tests/_federate_processes.py OUT_DIR DEVICES ROUNDS [--resume-from ROUND] [--accelerator gpu]
[--engine batched] METHOD ...

For every method it writes ``OUT_DIR/<method>/`` (the run directory) and, on rank 0, ``weights.pt`` with the final
global weights. With ``--resume-from K`` it first runs K rounds, then resumes from ``last.ckpt`` up to ROUNDS.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import FederatedDataModule, Federation
from fl_lightning.methods import METHODS

warnings.filterwarnings("ignore")


def fit(
    method: str,
    run_dir: Path,
    devices: int,
    rounds: int,
    ckpt_path: str | None,
    accelerator: str,
    engine: str = "sequential",
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
        torch.save({k: v.cpu() for k, v in model.state_dict().items()}, run_dir / "weights.pt")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("devices", type=int)
    parser.add_argument("rounds", type=int)
    parser.add_argument("methods", nargs="+")
    parser.add_argument("--resume-from", type=int, default=0)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--engine", default="sequential", choices=["sequential", "batched", "auto"])
    args = parser.parse_args()
    for method in args.methods:
        run_dir = args.out / method
        if args.resume_from:
            fit(method, run_dir, args.devices, args.resume_from, None, args.accelerator, args.engine)
            last = str(run_dir / "checkpoints" / "last.ckpt")
            fit(method, run_dir, args.devices, args.rounds, last, args.accelerator, args.engine)
        else:
            fit(method, run_dir, args.devices, args.rounds, None, args.accelerator, args.engine)


if __name__ == "__main__":
    main()

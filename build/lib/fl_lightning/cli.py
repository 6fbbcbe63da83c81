"""The command line: ``python cli.py fit --config configs/<name>.yaml`` (LightningCLI)."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from typing_extensions import override

from fl_lightning import methods  # noqa: F401  (registers the methods so that `--model FedNTD` resolves)
from fl_lightning.data import FederatedDataModule
from fl_lightning.federation import Federation
from fl_lightning.module import FedAvg

# Lightning 2.6 calls a torch pytree API that torch 2.14 deprecates, once per epoch: noise for a CLI user.
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")


class RunConfigSaver(SaveConfigCallback):
    """Saves the resolved config as ``config.yaml`` in the run directory and sends it to the loggers."""

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.already_saved or stage != "fit":
            return
        if trainer.is_global_zero:
            run_dir = trainer.default_root_dir
            os.makedirs(run_dir, exist_ok=True)
            self.parser.save(self.config, os.path.join(run_dir, self.config_filename), skip_none=False, overwrite=True)
            config = self.config.clone().as_dict() if hasattr(self.config, "as_dict") else dict(self.config)
            for logger in trainer.loggers:
                logger.log_hyperparams(_flatten(config))
        self.already_saved = True


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}/"))
        else:
            out[name] = value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
    return out


class FLCLI(LightningCLI):
    """LightningCLI with the federation settings under ``--federation.*`` and the data facts linked to the model."""

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(Federation, "federation")
        for attr in ("num_classes", "in_channels", "image_size"):
            parser.link_arguments(f"data.{attr}", f"model.init_args.{attr}", apply_on="instantiate")
        parser.link_arguments("federation.rounds", "trainer.max_epochs")
        parser.link_arguments("seed_everything", "data.seed")
        parser.link_arguments("seed_everything", "federation.seed")
        parser.set_defaults(
            {
                "trainer.logger": False,
                "trainer.default_root_dir": "runs/default",
                "trainer.num_sanity_val_steps": 0,
                "trainer.enable_model_summary": False,
            }
        )

    @override
    def before_instantiate_classes(self) -> None:
        # Mixed precision on a GPU, plain float32 on the CPU, unless --trainer.precision says otherwise.
        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer = config.get("trainer")
        if trainer is None:
            return
        accelerator = str(trainer.get("accelerator") or "auto")
        gpu = torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda")
        precision = trainer.get("precision")
        if precision is None:
            trainer["precision"] = (
                "bf16-mixed" if gpu and torch.cuda.is_bf16_supported() else "16-mixed" if gpu else "32-true"
            )
        elif str(precision) in ("16-mixed", "16", "16-true", "transformer-engine") and not gpu:
            # Lightning would quietly switch 16-mixed to bf16-mixed on the CPU; say so instead.
            raise ValueError(
                f"--trainer.precision {precision} needs a CUDA GPU; on the CPU use --trainer.precision 32-true "
                "(or bf16-mixed)"
            )

    @override
    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        # Checkpoints live in the run directory whatever the logger, so that `--ckpt_path last` finds them.
        for cb in trainer.checkpoint_callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.dirpath is None:
                cb.dirpath = os.path.join(trainer.default_root_dir, "checkpoints")
        return trainer


def cli_main(args: list[str] | None = None, run: bool = True) -> FLCLI:
    """Build (and by default run) the command line."""
    return FLCLI(
        FedAvg,
        FederatedDataModule,
        subclass_mode_model=True,
        seed_everything_default=0,
        save_config_callback=RunConfigSaver,
        trainer_defaults={"callbacks": [ModelCheckpoint(save_last="link", save_top_k=1)]},
        args=args,
        run=run,
        auto_configure_optimizers=False,
    )


def main(argv: list[str] | None = None) -> None:
    """``fit``/``validate``/``test`` go to LightningCLI; ``compare`` runs a comparison (fl_lightning.compare)."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "compare":
        from fl_lightning.compare import main as compare_main

        sys.exit(compare_main(args[1:]))
    cli_main(None if argv is None else args)


if __name__ == "__main__":
    main()

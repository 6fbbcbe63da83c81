"""The pieces of a federation, built from the same YAML config (and options) a user passes to ``cli.py fit``.

:func:`build` parses the config with fl_lightning's command line (:func:`~fl_lightning.lightning_cli.cli_main`, not
run), so that every option, default, link and check is the ``fit`` command's: the same seed, the same initial
network, the same data partition and the same :class:`~fl_lightning.Federation` settings. The Trainer is not fitted:
it is attached to the module once (:func:`attach`), so that the method's local steps, which take their optimizer
from it, run without Lightning's training loop, and it lends its loggers, precision context and progress bar to the
run's record.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import lightning as L

from fl_lightning import rules
from fl_lightning.data import FederatedDataModule
from fl_lightning.federation import Federation
from fl_lightning.module import FedAvg, FederatedHooks


@dataclass
class FlowerSetup:
    """A federation's pieces on one side of a Flower run: the Trainer (attached, not fitted), module, data, settings."""

    trainer: L.Trainer
    module: L.LightningModule
    datamodule: FederatedDataModule
    federation: Federation
    #: The resolved config (as ``config.yaml`` would hold it): what a node and the server compare before the rounds.
    config: dict = field(default_factory=dict)  # not dict[str, Any]: Sphinx cannot resolve that as an attribute's type

    @property
    def hooks(self) -> FederatedHooks | None:
        """The module's federated hooks (``None`` for a plain LightningModule, federated as FedAvg)."""
        return self.module if isinstance(self.module, FederatedHooks) else None

    @property
    def method_name(self) -> str:
        """The method's short name (``fedavg`` for a module without hooks)."""
        return self.hooks.method_name if self.hooks is not None else "fedavg"


def split_options(options: str | Sequence[str] | None) -> list[str]:
    """Command-line options given as one string (Flower's run config) or a list.

    >>> split_options("--federation.rounds 3 --model.lr 0.1")
    ['--federation.rounds', '3', '--model.lr', '0.1']
    """
    if options is None:
        return []
    return shlex.split(options) if isinstance(options, str) else list(options)


def build(config: str, options: str | Sequence[str] | None = None) -> FlowerSetup:
    """The federation that ``cli.py fit --config <config> <options>`` would train, built and attached, not run.

    Raises ``ValueError`` when the module is not a method (the Flower apps train fl_lightning methods) and whatever
    the command line raises for a bad config.
    """
    from fl_lightning.lightning_cli import cli_main

    cli = cli_main(["--config", config, *split_options(options)], run=False)
    trainer, module, datamodule = cli.trainer, cli.model, cli.datamodule
    callbacks = cast(list, trainer.callbacks)  # type: ignore[attr-defined]  # set by Lightning
    federations = [cb for cb in callbacks if isinstance(cb, Federation)]
    if not federations:
        raise ValueError("the config builds no Federation callback")
    if not isinstance(module, FedAvg):
        raise ValueError(
            f"the Flower apps train fl_lightning methods (FedAvg and its subclasses), not {type(module).__name__}"
        )
    if not isinstance(datamodule, FederatedDataModule):
        raise ValueError(f"the Flower apps need a FederatedDataModule, got {type(datamodule).__name__}")
    setup = FlowerSetup(trainer, module, datamodule, federations[0], cli.resolved_dict(cli.config))
    attach(setup)
    return setup


def attach(setup: FlowerSetup) -> None:
    """Set the data up and attach the Trainer to the module once, as a fit would before its first round.

    The module gets its device, the datamodule's input normalisation and its optimizer; its local steps call the
    optimizer directly (the path a fit on one device without a gradient scaler takes), or, with a gradient scaler
    (``16-mixed``) or ``step_hooks``, through Lightning's backward and optimizer step, as such a fit does.
    """
    trainer, module, dm = setup.trainer, setup.module, setup.datamodule
    assert isinstance(module, FedAvg)
    dm.setup("fit")
    rules.check_pieces(trainer, module, dm, module.holdout_per_class_required)  # the checks a fit makes at setup
    # and its precision check: a gradient scaler (16-mixed) can skip steps that SCAFFOLD, FedNova, ... count
    exact = module.method_name if module.needs_exact_steps else None
    rules.check_precision(str(trainer.precision), trainer.strategy.root_device.type == "cpu", exact)
    trainer.strategy.connect(module)
    module.trainer = trainer
    module.configure_model()
    trainer.precision_plugin.convert_module(module)  # as a fit's strategy setup does (no-op for the allowed precisions)
    module.to(trainer.strategy.root_device)
    if dm.transform is not None:
        module.input_normalization.copy_from(dm.transform, module.device)
    trainer.optimizers = [module.configure_optimizers()]
    # As a fit on one device decides (FedAvg.on_fit_start): a gradient scaler (16-mixed) or step_hooks needs
    # Lightning's backward and optimizer step, which scale the loss and unscale, check and step through the scaler.
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    module._direct_step = scaler is None and not module.hparams.get("step_hooks", False)

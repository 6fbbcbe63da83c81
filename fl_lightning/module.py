"""The client update as a LightningModule. FedAvg is the base class; every method overrides its loss."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch import Tensor, nn

from fl_lightning.context import ClientContext, ServerContext
from fl_lightning.models import MODELS, build_model


class FedAvg(L.LightningModule):
    """FedAvg's local update (McMahan et al., AISTATS 2017, arXiv:1602.05629): L = CE(z, y).

    Methods subclass this and override :meth:`client_loss` (and, if they need server or client state, the
    per-round hooks :meth:`on_round_start`, :meth:`on_client_start`, :meth:`on_client_end`), which the
    :class:`~fl_lightning.Federation` callback calls.

    Args:
        net: network name: ``lenet``, ``cnn``, ``tcnn``, ``resnet8``, ``resnet18`` or ``resnet50``.
        num_classes: number of classes (linked from the datamodule by the CLI).
        in_channels: image channels (linked from the datamodule by the CLI).
        image_size: image side in pixels (linked from the datamodule by the CLI).
        lr: initial local learning rate lr_0 (the Federation callback decays it per round).
        momentum: SGD momentum (local only: optimizer state is reset for every client and round).
        weight_decay: SGD weight decay.
        step_hooks: run each local step through Lightning's backward/optimizer machinery, so that callbacks'
            ``on_before_backward``/``on_after_backward``/``on_before_optimizer_step`` hooks fire. Off by default on a
            single device without a gradient scaler, where calling backward and the optimizer directly is cheaper
            (see ``bench/``); always on with a gradient scaler (``16-mixed``) or a distributed strategy.
        clip_grad_norm: clip every local step's gradient to this total L2 norm (``None``: no clipping, as in every
            paper). Not part of any method; it keeps unbounded regularisers stable where the paper's step size is
            not (FedKA on LeNet/Fashion-MNIST, see the README).
    """

    #: Short name used in results and tables.
    method_name = "fedavg"
    #: Whether the frozen global model is run as a teacher on every batch.
    uses_teacher = False
    #: Server holdout samples per class the method needs (``--data.holdout_per_class``).
    holdout_per_class_required = 0
    #: Whether the method needs every optimizer step to happen (no fp16 GradScaler skipping).
    needs_exact_steps = False

    def __init__(
        self,
        net: str = "lenet",
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 28,
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 1e-5,
        step_hooks: bool = False,
        clip_grad_norm: float | None = None,
    ) -> None:
        super().__init__()
        if net not in MODELS:
            raise ValueError(f"unknown model {net!r}; choose one of {', '.join(MODELS)}")
        if lr <= 0:
            raise ValueError(f"lr must be positive, got {lr}")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if clip_grad_norm is not None and clip_grad_norm <= 0:
            raise ValueError(f"clip_grad_norm must be positive (or None for no clipping), got {clip_grad_norm}")
        self.save_hyperparameters()
        # Manual optimization: one explicit step per batch is both what FL local training is and measurably cheaper
        # than Lightning's closure machinery on small CPU models (see bench/).
        self.automatic_optimization = False
        self.net = build_model(net, in_channels, image_size, num_classes)
        self.num_classes = num_classes
        self.client: ClientContext | None = None
        # Kept in a list so that the teacher is neither a submodule nor part of the state dict.
        self._teacher: list[nn.Module] = []
        self._direct_step = False
        self._clip_grad_norm = clip_grad_norm

    def forward(self, x: Tensor) -> Tensor:
        """Class logits."""
        return self.net(x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Local SGD; its state is reset at the start of every client's update."""
        return torch.optim.SGD(
            self.parameters(),
            lr=self.hparams.lr,
            momentum=self.hparams.momentum,
            weight_decay=self.hparams.weight_decay,
        )

    def training_step(self, batch: Iterable[tuple[Tensor, Tensor]], batch_idx: int) -> Tensor:
        """One client's local update: a step on each of its batches (``batch_idx`` is the client's slot in the round).

        Returns the mean training loss over its steps.
        """
        total = None
        steps = 0
        for x, y in batch:
            loss = self.local_step(x, y)
            total = loss if total is None else total + loss
            steps += 1
        if total is None:
            raise ValueError(f"client slot {batch_idx} has no local batch")
        return total / steps

    def local_step(self, x: Tensor, y: Tensor) -> Tensor:
        """One local optimizer step on one (augmented, normalised) batch; returns its detached loss."""
        loss = self.client_loss(x, y)
        opt = self.optimizers()
        opt.zero_grad()
        if self._direct_step:
            loss.backward()
            self.before_local_step()
            self._clip_gradients()
            # Lightning's own step bookkeeping (global_step, which checkpointing keys on), without its hook chain.
            opt._on_before_step()
            opt.optimizer.step()
            opt._on_after_step()
        else:
            self.manual_backward(loss)
            self.before_local_step()
            opt.step()
        return loss.detach()

    def on_fit_start(self) -> None:
        """Decide whether local steps may bypass Lightning's per-step hooks (see ``step_hooks``)."""
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        single = isinstance(self.trainer.strategy, SingleDeviceStrategy)
        self._direct_step = not self.hparams.get("step_hooks", False) and scaler is None and single

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """With ``step_hooks`` (or a gradient scaler), clip here: Lightning has unscaled the gradients by now."""
        self._clip_gradients()

    def _clip_gradients(self) -> None:
        if self._clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.parameters(), self._clip_grad_norm)

    def before_local_step(self) -> None:
        """Called between the backward pass and the optimizer step (e.g. to correct gradients)."""

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """The method's local objective on one (augmented, normalised) batch."""
        return F.cross_entropy(self(x), y)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Accuracy and loss of the (global) model on the test set, for ``trainer.test``."""
        x, y = batch
        logits = self(x).float()
        self.log("test/loss", F.cross_entropy(logits, y))
        self.log("test/acc", (logits.argmax(1) == y).float().mean())

    # ---- federation hooks -------------------------------------------------------------------------------------

    def on_round_start(self, server: ServerContext) -> dict[str, Any]:
        """Server side, once per round with the global weights loaded: return what every client receives."""
        return {}

    def on_client_start(self, client: ClientContext) -> None:
        """Client side, after the global weights are loaded and before the first local step."""
        self.client = client
        if self.uses_teacher:
            if not self._teacher:
                teacher = copy.deepcopy(self.net)
                teacher.requires_grad_(False)
                self._teacher.append(teacher)
            self._teacher[0].load_state_dict(self.net.state_dict())
            self._teacher[0].to(self.device).eval()

    def on_client_end(self, client: ClientContext) -> None:
        """Client side, after the last local step and before the weights are sent."""

    # ---- teacher ------------------------------------------------------------------------------------------------

    @property
    def teacher(self) -> nn.Module:
        """The frozen copy of this round's global network (evaluation mode, no gradients)."""
        if not self._teacher:
            raise RuntimeError(f"{type(self).__name__} has no teacher before its first client starts")
        return self._teacher[0]

    @torch.no_grad()
    def teacher_logits(self, x: Tensor) -> Tensor:
        """z_g: the global model's logits on ``x``, with no gradient."""
        return self.teacher(x)

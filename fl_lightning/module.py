"""The client update as a LightningModule. FedAvg is the base class; every method overrides its loss."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, cast

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn

from fl_lightning.core.augment import BatchTransform, InputNormalization
from fl_lightning.core.batches import ClientGroup
from fl_lightning.core.context import ClientContext, ServerContext, checked_payload, checked_upload
from fl_lightning.core.distributed import all_reduce_sum_
from fl_lightning.core.evaluation import Counts, Evaluation, add_counts, batch_counts, unpadded
from fl_lightning.core.messages import require_bool, require_integer, require_number
from fl_lightning.core.models import MODELS, build_model, net_name, trainable
from fl_lightning.lightning_internals import (
    counted_step,
    has_trainer,
    python_scalar_hparams,
    record_initial_hparam,
    set_logged_batch_size,
)

#: Where a method's checkpoint holds its :class:`~fl_lightning.core.augment.InputNormalization` statistics.
INPUT_NORMALIZATION_KEY = "input_normalization"


class FederatedHooks:
    """The hooks the :class:`~fl_lightning.Federation` callback calls on a module, all empty by default.

    :class:`FedAvg` and every method inherit them; a user's own LightningModule can mix this class in to take part
    in the same protocol (a module without it is federated as plain FedAvg). Overrides never need ``super()``.

    Per round, in this order:

    ======================================  ======  =========================================================
    hook                                    side    what it does / returns
    ======================================  ======  =========================================================
    ``on_round_start(server)``              server  with the global weights loaded; returns the payload every
                                                    client receives as ``client.server``
    ``on_client_start(client)``             client  after the global weights, a fresh optimizer and (if
                                                    :meth:`teacher_needed`) a fresh teacher are in place
    ``align_client_attributes(attrs)``      client  batched engine only, after every client of a group ran
                                                    ``on_client_start``: their attributes, made one structure
                                                    where that is exact, so that they train as one stack
    ``local_gradient(grads)``               client  the gradients each local step descends (pure function)
    ``before_local_step()``                 client  between each backward pass and optimizer step
    ``on_client_end(client)``               client  after the last local step, local weights still loaded;
                                                    returns the upload (``dict`` of tensors) or ``None``
    ``server_update(server, average, up)``  server  after all clients: gets the weighted average of their
                                                    weights and their reduced uploads; returns the new
                                                    global weights
    ======================================  ======  =========================================================

    Uploads are reduced as ``Σ_k p_k·u_k`` over the round's clients (``p_k`` = ``client.weight``), or as ``Σ_k u_k``
    for the keys that :attr:`upload_reduce` maps to ``"sum"``. Persistent state lives in ``server.state`` (the
    method's server state) and ``client.state`` (one dict per client, on the CPU or disk between rounds); the
    callback checkpoints both, so a resumed run continues exactly. MOON keeps each client's previous model in
    ``client.state``; SCAFFOLD keeps the server control variate in ``server.state``. ``server.round`` and
    ``client.round`` are 0-based: the run's first round, printed ``round 1/...``, is round 0.
    """

    #: Short name used in results and tables (``summary.json``'s ``method``); a subclass that does not set its own
    #: gets its class's name in lower case, so that a method of yours is never recorded as the one it extends.
    method_name: ClassVar[str] = "fedavg"
    #: Whether a frozen copy of the round's global network is kept as a teacher (see :meth:`teacher_logits`).
    uses_teacher: ClassVar[bool] = False
    #: Whether the method needs every optimizer step to happen (no fp16 GradScaler skipping).
    needs_exact_steps: ClassVar[bool] = False
    #: How each upload key is reduced over clients: ``"mean"`` (Σ p_k·u_k, the default) or ``"sum"`` (Σ u_k).
    upload_reduce: ClassVar[Mapping[str, str]] = {}
    #: The attributes ``on_client_start`` sets per client and ``client_loss`` (or :meth:`local_gradient`) reads:
    #: tensors, ``None`` or containers of them. The batched engine stacks them over the clients it trains together
    #: and binds each client's own while its loss runs; a method whose ``on_client_start`` sets others trains on the
    #: sequential engine, with a warning that names them.
    #: On a GPU its step is recorded as a CUDA graph: what ``client_loss`` reads besides these (the module's tensors,
    #: its public settings) is fixed at recording, and a private attribute changed between rounds is not seen.
    client_attributes: ClassVar[tuple[str, ...]] = ()
    #: Whether the batched engine (``--federation.engine batched``) may train this method's clients together.
    batchable: ClassVar[bool] = True
    #: Whether ``client_loss`` is a mean over the batch's samples of per-sample terms, plus terms that do not depend on
    #: the batch (a proximal term, say). The batched engine then pads a client's short last batch to the full batch
    #: size with weight-0 samples and trains it in its step's one stacked call. Read from the class that defines
    #: ``client_loss`` only: a subclass that overrides ``client_loss`` declares it again (a loss that couples samples,
    #: such as a contrastive loss over the batch, must not).
    sample_mean_loss: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "method_name" not in cls.__dict__:
            cls.method_name = cls.__name__.lower()

    @property
    def holdout_per_class_required(self) -> int:
        """Server holdout samples per class the method needs (``--data.holdout_per_class``)."""
        return 0

    def on_round_start(self, server: ServerContext) -> dict[str, Any]:
        """Server side, once per round with the global weights loaded: return what every client receives."""
        return {}

    def on_client_start(self, client: ClientContext) -> None:
        """Client side, after the global weights (and teacher) are loaded and before the first local step."""

    def before_local_step(self) -> None:
        """Client side, between the backward pass and the optimizer step (e.g. to correct gradients)."""

    def local_gradient(self, grads: list[Tensor]) -> list[Tensor]:
        """Client side: the gradients a local step descends (default: the loss's, one per trainable parameter).

        ``grads`` follow ``parameters()`` order. A pure function of ``grads`` and the client's attributes (SCAFFOLD
        adds c − c_k): both engines call it, the batched one on each client's slice. Prefer it to
        :meth:`before_local_step`, which edits ``p.grad`` in place and keeps a method on the sequential engine.
        """
        return grads

    def on_client_end(self, client: ClientContext) -> Mapping[str, Tensor] | None:
        """Client side, after the last local step: return the upload sent with the weights (or ``None``)."""
        return None

    def align_client_attributes(self, attributes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Batched engine only: the clients' :attr:`client_attributes`, made one structure where that is exact.

        ``attributes`` holds one dict per client of a group (up to ``group_size`` clients), in order, before the
        group is split into stacks. Return them with every client's loss unchanged, so that they stack as one: the
        returned attributes are what ``client_loss``, ``local_gradient`` and ``on_client_end`` see in the batched
        engine. Clients whose attributes still differ in structure (tensor shapes, ``None``) train in separate stacks,
        one after another. Default: unchanged. FedKA pads its anchor sets to the largest and weights the padding 0.
        """
        return [dict(item) for item in attributes]

    def server_update(
        self, server: ServerContext, average: dict[str, Tensor], uploads: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """Server side, after every client: the new global weights from the clients' average and uploads."""
        return average

    # ---- teacher ------------------------------------------------------------------------------------------------

    def teacher_needed(self, client: ClientContext) -> bool:
        """Whether this client's update uses the teacher (default: :attr:`uses_teacher`)."""
        return self.uses_teacher

    def teacher_network(self) -> nn.Module:
        """The network the teacher copies (default: the module's ``net`` attribute); override if it lives elsewhere."""
        net = getattr(self, "net", None)
        if not isinstance(net, nn.Module):
            raise TypeError(
                f"{type(self).__name__} uses a teacher but has no `net` attribute; "
                "override teacher_network() to return the network to distil from"
            )
        return net

    def refresh_teacher(self) -> None:
        """Make the teacher a frozen copy of the network's current (global) weights; called by the callback."""
        net = self.teacher_network()
        teachers: list[nn.Module] = self.__dict__.setdefault("_teacher_store", [])
        if not teachers:
            teacher = copy.deepcopy(net)
            teacher.requires_grad_(False)
            teachers.append(teacher)
        teachers[0].load_state_dict(net.state_dict())
        param = next(net.parameters(), None)
        if param is not None:
            teachers[0].to(param.device)
        teachers[0].eval()

    @property
    @torch.jit.unused
    def teacher(self) -> nn.Module:
        """The frozen copy of this round's global network (evaluation mode, no gradients).

        There is none before a client of a fit has started: then it raises ``AttributeError``, so that
        ``hasattr(module, "teacher")`` is False and introspection (``inspect.getmembers``, TorchScript) passes it by.
        """
        teachers = self.__dict__.get("_teacher_store")
        if not teachers:
            raise AttributeError(f"{type(self).__name__} has no teacher before its first client starts")
        return teachers[0]

    @torch.no_grad()
    def teacher_logits(self, x: Tensor) -> Tensor:
        """z_g: the global model's logits on ``x``, with no gradient."""
        teachers = self.__dict__.get("_teacher_store")
        if not teachers:
            raise RuntimeError(
                f"{type(self).__name__} has no teacher: set `uses_teacher = True` on the class (or return True from "
                "teacher_needed(client)) so that the Federation callback refreshes it before each client starts"
            )
        return frozen_forward(teachers[0], x)


def round_payload(module: object, server: ServerContext) -> dict[str, Any]:
    """What every client of the round receives: the module's ``on_round_start``, checked (``{}`` without hooks)."""
    if not isinstance(module, FederatedHooks):
        return {}
    return checked_payload(type(module).__name__, module.on_round_start(server))


def client_upload(module: object, client: ClientContext) -> Mapping[str, Tensor]:
    """What a client sends up with its weights: the module's ``on_client_end``, checked (``{}`` without hooks)."""
    if not isinstance(module, FederatedHooks):
        return {}
    if isinstance(module, L.LightningModule):  # a self.log(..., on_epoch=True) there counts once per client
        set_logged_batch_size(module, 1)
    return checked_upload(type(module).__name__, module.on_client_end(client))


class TeacherMixin(FederatedHooks):
    """Mix into your own LightningModule to distil from the global model: ``self.teacher_logits(x)`` in your step.

    Example::

        class MyNTD(TeacherMixin, MyModule):
            def training_step(self, batch, batch_idx):
                x, y = batch
                z = self(x)
                return F.cross_entropy(z, y) + ntd_loss(z, self.teacher_logits(x), y)
    """

    uses_teacher = True


class FedAvg(FederatedHooks, L.LightningModule):
    """FedAvg's local update (McMahan et al., AISTATS 2017, arXiv:1602.05629): L = CE(z, y).

    Methods subclass this and override :meth:`client_loss` and, if they need server or client state, the per-round
    hooks of :class:`FederatedHooks` (table there), which the :class:`~fl_lightning.Federation` callback calls.

    Args:
        net: the network: an ``nn.Module`` returning logits (used as given; in YAML ``{"class_path": "mypkg.MyNet",
            "init_args": {...}}``), or a built-in name: ``lenet``, ``cnn``, ``tcnn``, ``resnet8``, ``resnet18`` or
            ``resnet50``.
        num_classes: number of classes (linked from the datamodule by the CLI; taken from the datamodule at fit
            start when left out).
        in_channels: image channels, for a built-in network (as ``num_classes``).
        image_size: image side, or (height, width), for a built-in network (as ``num_classes``).
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

    Initialisation: a built-in network given with all of ``num_classes``, ``in_channels`` and ``image_size`` is built
    in the constructor from torch's global generator (seed it with ``L.seed_everything``, as the CLI does). Without
    them it is built once, at fit start (``configure_model``), for the datamodule's data and under a torch seed taken
    from the datamodule's ``seed``, so a plain-Python run is reproducible without ``seed_everything``. A network
    passed as a module is initialised by whoever built it.
    """

    sample_mean_loss = True

    def __init__(
        self,
        # str first: jsonargparse tries a union's types in order, and resolving a name as an nn.Module class walks
        # every nn.Module subclass (slow with torchvision loaded).
        net: str | nn.Module = "lenet",
        num_classes: int | None = None,
        in_channels: int | None = None,
        image_size: int | tuple[int, int] | None = None,
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 1e-5,
        step_hooks: bool = False,
        clip_grad_norm: float | None = None,
    ) -> None:
        super().__init__()
        if isinstance(net, str) and net not in MODELS and "." in net:
            # A network's class path as results and checkpoints record it: the network itself is not saved.
            raise ValueError(
                f"unknown model {net!r}: it names a network of your own (a checkpoint records only its class path); "
                f"pass the network itself: net=MyNet(), and for a checkpoint "
                f"{type(self).__name__}.load_from_checkpoint(path, net=MyNet())"
            )
        if isinstance(net, str) and net not in MODELS:
            raise ValueError(
                f"unknown model {net!r}; choose one of {', '.join(MODELS)}, or pass an nn.Module "
                '(in YAML: {"class_path": "mypkg.MyNet"}; on the command line: --model.net mypkg.MyNet)'
            )
        if not isinstance(net, nn.Module | str):
            raise TypeError(f"net must be an nn.Module or a built-in network's name, got {type(net).__name__}")
        for name, count in (("num_classes", num_classes), ("in_channels", in_channels)):
            require_integer(name, count, least=1, optional=True)
        pair = isinstance(image_size, tuple | list) and len(image_size) == 2  # (height, width)
        for i, side in enumerate(cast(Sequence[Any], image_size) if pair else (image_size,)):
            require_integer(f"image_size[{i}]" if pair else "image_size", side, least=1, optional=not pair)
        require_number("lr", lr, "> 0")
        require_number("momentum", momentum, "[0, 1)")
        require_number("weight_decay", weight_decay, ">= 0", hint="give 0 for none")
        require_bool("step_hooks", step_hooks)
        require_number("clip_grad_norm", clip_grad_norm, "> 0", optional=True, hint="give None for no clipping")
        # The network itself is not a hyper-parameter; results, checkpoints and loggers record its name or class path.
        self.save_hyperparameters(ignore=["net"])
        python_scalar_hparams(self)
        self.hparams["net"] = net_name(net)
        # Manual optimization: one explicit step per batch is both what FL local training is and measurably cheaper
        # than Lightning's closure machinery on small CPU models (see bench/).
        self.automatic_optimization = False
        self._num_classes = num_classes
        self.net: nn.Module | None = None
        if isinstance(net, nn.Module):
            self.net = net
        elif num_classes is not None and in_channels is not None and image_size is not None:
            self.net = build_model(net, in_channels, image_size, num_classes)
        self.client: ClientContext | None = None
        self._direct_step = False
        self._clip_grad_norm = clip_grad_norm
        #: Raw inputs → the network's inputs (the datamodule's normalisation, taken at fit start): see predict_step.
        self.input_normalization = InputNormalization()

    @property
    @torch.jit.unused
    def num_classes(self) -> int:
        """Number of classes C (raises AttributeError until known: given, or taken from the datamodule at fit)."""
        if self._num_classes is None:
            raise AttributeError(f"{type(self).__name__}.num_classes is not known before fit starts")
        return self._num_classes

    @num_classes.setter
    def num_classes(self, value: int) -> None:
        self._num_classes = int(value)

    def configure_model(self) -> None:
        """Build a built-in network left unbuilt by the constructor, for the datamodule's data (see the class doc)."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if self._num_classes is None:
            if datamodule is None or getattr(datamodule, "num_classes", None) is None:
                raise ValueError(
                    f"{type(self).__name__} does not know the number of classes: pass num_classes=..., "
                    "or fit with a FederatedDataModule"
                )
            self.num_classes = datamodule.num_classes
            self._record_hparam("num_classes", self.num_classes)
        if self.net is not None:
            return
        for attr in ("in_channels", "image_size"):
            if self.hparams.get(attr) is None:
                value = getattr(datamodule, attr, None)
                if value is None:
                    raise ValueError(
                        f"the built-in network {self.hparams['net']!r} needs images, and the data has none "
                        f"({attr} unknown); pass net=<your nn.Module> for tabular or other inputs"
                    )
                self._record_hparam(attr, value)
        seed = int(getattr(datamodule, "seed", 0))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = build_model(
                self.hparams["net"], self.hparams["in_channels"], self.hparams["image_size"], self.num_classes
            ).to(self.device)

    def _record_hparam(self, name: str, value: Any) -> None:
        """Record a value resolved at fit start in the hyper-parameters (checkpoints) and what loggers receive."""
        record_initial_hparam(self, name, value)

    def forward(self, x: Tensor) -> Tensor:
        """Class logits of normalised inputs (what training and evaluation batches are; raw ones: predict_step)."""
        if self.net is None:
            raise AttributeError(_no_network(self))
        return self.net(x)

    def predict_step(self, batch: Tensor | Sequence[Tensor], batch_idx: int = 0, dataloader_idx: int = 0) -> Tensor:
        """Class logits of raw inputs: a tensor, or a batch ``(x,)`` or ``(x, y)`` (e.g. of a ``TensorDataset``).

        Raw means as the datamodule holds them (uint8 images, features on their own scale): the module's
        :attr:`input_normalization` (saved in its checkpoints) maps them to the network's inputs, with the same
        arithmetic as the federation's evaluation.
        """
        x = batch[0] if isinstance(batch, tuple | list) else batch
        return self(self.input_normalization(x))

    def to_torchscript(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's ``to_torchscript`` of :meth:`forward`, once the network exists (``AttributeError`` before)."""
        self._require_net()
        return super().to_torchscript(*args, **kwargs)

    def to_onnx(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's ``to_onnx`` of :meth:`forward`, once the network exists (``AttributeError`` before)."""
        self._require_net()
        return super().to_onnx(*args, **kwargs)

    def _require_net(self) -> None:
        if self.net is None:
            raise AttributeError(_no_network(self))

    # ---- probing: outside a fit, missing things are AttributeErrors ------------------------------------------------

    @property
    def trainer(self) -> L.Trainer:
        """The Trainer this module is attached to.

        Without one it raises ``AttributeError`` (Lightning raises ``RuntimeError``), so that ``hasattr``,
        ``inspect.getmembers`` and other probing pass a module outside a fit by.
        """
        if not has_trainer(self):
            raise AttributeError(f"{type(self).__name__} is not attached to a `Trainer`")
        # mypy types LightningModule.trainer as the property's value, not the property (here and in the setter).
        return L.LightningModule.trainer.fget(self)  # type: ignore[attr-defined]

    @trainer.setter
    def trainer(self, trainer: L.Trainer | None) -> None:
        L.LightningModule.trainer.fset(self, trainer)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            # Python lands here when a property's getter raises AttributeError; nn.Module would answer "has no
            # attribute": raise the getter's own error (e.g. "num_classes is not known before fit starts") instead.
            prop = getattr(type(self), name, None)
            if isinstance(prop, property) and prop.fget is not None:
                return prop.fget(self)
            raise

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Local SGD over the trainable parameters; its state is reset at the start of every client's update."""
        return torch.optim.SGD(
            [p for _, p in trainable(self)],
            lr=self.hparams["lr"],
            momentum=self.hparams["momentum"],
            weight_decay=self.hparams["weight_decay"],
        )

    def training_step(self, batch: Iterable[tuple[Tensor, Tensor]] | ClientGroup, batch_idx: int) -> Tensor | None:
        """One client's local update: a step on each of its batches (``batch_idx`` is the client's slot in the round).

        Returns the mean training loss over its steps (``None`` for the empty updates that pad a process's share).
        A :class:`~fl_lightning.data.ClientGroup` (the batched engine) trains its clients together instead.
        """
        if isinstance(batch, ClientGroup):
            if batch.run is None:
                raise RuntimeError("a ClientGroup is trained by the Federation callback's batched engine")
            return batch.run(self, batch)
        total = None
        steps = 0
        for x, y in batch:
            loss = self.local_step(x, y)
            total = loss if total is None else total + loss
            steps += 1
        return None if total is None else total / steps

    def local_step(self, x: Tensor, y: Tensor) -> Tensor:
        """One local optimizer step on one (augmented, normalised) batch; returns its detached loss."""
        set_logged_batch_size(self, len(y))  # a self.log(..., on_epoch=True) in client_loss is weighted by it
        loss = self.client_loss(x, y)
        opt = cast(LightningOptimizer, self.optimizers())  # configure_optimizers returns one optimizer
        opt.zero_grad()
        if self._direct_step:
            loss.backward()
            self._apply_local_gradient()
            self.before_local_step()
            self._clip_gradients()
            # Lightning's own step bookkeeping (global_step, which checkpointing keys on), without its hook chain.
            counted_step(opt)
        else:
            self.manual_backward(loss)
            self._apply_local_gradient()
            self.before_local_step()
            opt.step()
        return loss.detach()

    def _apply_local_gradient(self) -> None:
        if type(self).local_gradient is FederatedHooks.local_gradient:
            return
        params = [p for _, p in trainable(self)]
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        for p, g in zip(params, self.local_gradient(grads), strict=True):
            p.grad = g

    def on_fit_start(self) -> None:
        """Take the datamodule's input normalisation; decide whether local steps may bypass Lightning's step hooks.

        Local steps bypass the hooks unless ``step_hooks`` is set or a gradient scaler or distributed strategy is used.
        """
        datamodule = self.trainer.datamodule  # type: ignore[attr-defined]  # assigned by Lightning, undeclared
        transform = getattr(datamodule, "transform", None)
        if isinstance(transform, BatchTransform):
            self.input_normalization.copy_from(transform, self.device)
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        single = isinstance(self.trainer.strategy, SingleDeviceStrategy)
        self._direct_step = not self.hparams.get("step_hooks", False) and scaler is None and single

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Save the input normalisation with the weights (it is not in ``state_dict()``, which clients average)."""
        checkpoint[INPUT_NORMALIZATION_KEY] = self.input_normalization.stats()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the input normalisation (a checkpoint without it leaves it as it is)."""
        # The local SGD's state is reset for every client, so a checkpoint's is never used; one written before frozen
        # parameters were left out of the SGD lists them too, which torch would refuse to load: give it today's shape.
        count = len(trainable(self))
        for state in checkpoint.get("optimizer_states", []):
            groups = state.get("param_groups", [])
            if len(groups) == 1 and len(groups[0].get("params", [])) != count:
                groups[0]["params"] = list(range(count))
                state["state"] = {}
        stats = checkpoint.get(INPUT_NORMALIZATION_KEY)
        if stats is not None:
            self.input_normalization.set_stats(stats.get("mean"), stats.get("std"), self.device)
        elif self._trainer is None or self._trainer.state.fn != TrainerFn.FITTING:  # a fit takes the datamodule's
            rank_zero_warn(
                "this checkpoint holds no input normalisation (it was written by an earlier fl_lightning): "
                "predict_step only maps uint8 inputs to [0, 1]; give it normalised inputs, or set "
                "model.input_normalization.set_stats(mean, std)"
            )

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """With ``step_hooks`` (or a gradient scaler), clip here: Lightning has unscaled the gradients by now."""
        self._clip_gradients()

    def _clip_gradients(self) -> None:
        if self._clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.parameters(), self._clip_grad_norm)

    def client_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """The method's local objective on one (augmented, normalised) batch."""
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Sum the loss and per-class hits of a validation batch (the datamodule's ``val``, else the holdout).

        Under :class:`~fl_lightning.Federation` it validates the round's global model after the round's last client;
        ``val/loss`` and ``val/acc`` join ``metrics.csv`` and can be monitored.
        """
        self._add_eval_counts("val", batch)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Sum the test loss and per-class hits of a batch (``trainer.test``; the same counts as the federation's)."""
        self._add_eval_counts("test", batch)

    def on_validation_epoch_end(self) -> None:
        """Log ``val/loss`` and ``val/acc`` over the whole validation set (summed over processes)."""
        self._log_eval_counts("val")

    def on_test_epoch_end(self) -> None:
        """Log ``test/loss`` and ``test/acc`` over the whole test set (summed over processes)."""
        self._log_eval_counts("test")

    def _add_eval_counts(self, stage: str, batch: tuple[Tensor, Tensor]) -> None:
        x, y = batch
        seen: dict[str, int] = self.__dict__.setdefault("_eval_seen", {})
        loaders = self.trainer.val_dataloaders if stage == "val" else self.trainer.test_dataloaders
        loader = loaders[0] if isinstance(loaders, list | tuple) else loaders
        keep = unpadded(getattr(loader, "sampler", None), seen.get(stage, 0), len(y))  # several processes: no repeats
        seen[stage] = seen.get(stage, 0) + len(y)
        if keep == 0:
            return
        logits = self(x[:keep])
        counts: dict[str, Counts] = self.__dict__.setdefault("_eval_counts", {})
        counts[stage] = add_counts(counts.get(stage), batch_counts(logits, y[:keep], logits.shape[-1]))

    def _log_eval_counts(self, stage: str) -> None:
        self.__dict__.get("_eval_seen", {}).pop(stage, None)
        counts = self.__dict__.get("_eval_counts", {}).pop(stage, None)
        if counts is None:
            return
        all_reduce_sum_(counts)
        result = Evaluation.from_counts(counts)
        # Every process holds the same values (the counts are summed above): the max over them is each value exactly,
        # and a synced key spares several processes Lightning's advice to pass sync_dist=True.
        self.log(f"{stage}/loss", result.loss, sync_dist=True, reduce_fx="max")
        self.log(f"{stage}/acc", result.acc, sync_dist=True, reduce_fx="max")


def has_batch_norm(module: nn.Module) -> bool:
    """Whether ``module`` holds a BatchNorm layer (its batch statistics mix samples: padding a batch is not exact)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


def frozen_forward(net: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """``net(x)`` for a frozen network that a loss runs on its batch (the teacher, MOON's global model).

    Inside the batched engine's ``vmap`` under autocast it runs in float32 with autocast off: there the frozen
    network's weights are not stacked, and CUDA autocast hands such a network's convolutions a bf16 input with a
    float32 bias (a RuntimeError). Elsewhere it is plain ``net(x)``.
    """
    if torch.is_autocast_enabled(x.device.type) and torch._C._functorch.maybe_current_level() is not None:
        with torch.autocast(x.device.type, enabled=False):
            return net(x.float() if x.is_floating_point() else x)
    return net(x)


def _no_network(module: nn.Module) -> str:
    return (
        f"{type(module).__name__}'s built-in network is built at fit start (it needs the data's shapes); "
        "pass num_classes, in_channels and image_size to build it now"
    )

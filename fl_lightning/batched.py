"""The batched engine's executor: a round's clients trained in groups, each group as one stacked model.

:class:`BatchedClients` is the executor the :class:`~fl_lightning.Federation` callback uses with
``engine="batched"``: each training batch is a group of clients (:class:`~fl_lightning.data.ClientGroup`), which it
starts and ends like every executor (:class:`~fl_lightning.executor.ClientExecutor`) and trains together with
:func:`~fl_lightning.stacked.train_stacked`.

What a method computes per client in ``on_client_start`` and reads in ``client_loss`` is named in its
:attr:`~fl_lightning.module.FederatedHooks.client_attributes`; the engine stacks those attributes over the group and
binds each client's slice while its loss runs. Clients whose attributes differ in structure (FedDyn's first-time
clients without ``h_k``, FedKA's clients without anchors) are stacked separately, unless the method's
``align_client_attributes`` makes them one structure exactly (FedKA pads its anchor sets of different sizes and
weights the padding 0, except on a BatchNorm network). A method that turns out not to be batchable while it runs
(:class:`NotBatchable`), or whose stacked step fails, trains one client after another from then on.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

from fl_lightning.core.augment import BatchTransform
from fl_lightning.core.batches import ClientBatches, ClientGroup
from fl_lightning.core.context import ClientContext
from fl_lightning.core.evaluation import Evaluation
from fl_lightning.core.gpu_memory import PeakMemory, StackedMemory
from fl_lightning.core.messages import first_line, option, options
from fl_lightning.core.stacked_sgd import SGDSettings
from fl_lightning.core.stacking import (
    ClientRNG,
    HeldMetrics,
    attribute_ids,
    attribute_structure,
    bound_attributes,
    overrides,
    tensor_versions,
)
from fl_lightning.core.state import ClientStateStore
from fl_lightning.core.step_capture import StepCache
from fl_lightning.data import FederatedDataModule
from fl_lightning.executor import ClientExecutor
from fl_lightning.lightning_internals import count_optimizer_steps
from fl_lightning.module import FedAvg, FederatedHooks, client_upload
from fl_lightning.stacked import StackedClient, train_stacked


class NotBatchable(RuntimeError):
    """Raised inside the batched engine when a method turns out not to be batchable; it then trains sequentially."""


class StateChangedInStep(RuntimeError):
    """The stacked step updated a torchmetrics metric: put back (it trains sequentially), or changed in place."""

    def __init__(self, module: nn.Module, restored: Sequence[str], in_place: Sequence[str]) -> None:
        self.restorable = not in_place
        why = (
            f"{type(module).__name__}.client_loss updates torchmetrics states ({', '.join([*in_place, *restored])}), "
            "which the batched engine cannot stack: it runs every client's loss at once under vmap; "
        )
        super().__init__(
            why + "restored as before the step"
            if self.restorable
            else why
            + f"changed in place, which cannot be undone: train with {option('federation.engine', 'sequential')}"
        )


def client_attributes(module: FederatedHooks) -> dict[str, Any]:
    """The module's per-client attributes (:attr:`~fl_lightning.module.FederatedHooks.client_attributes`) now."""
    return {name: getattr(module, name, None) for name in module.client_attributes}


def undeclared_changes(module: nn.Module, before: Mapping[str, int]) -> list[str]:
    """Attributes that ``on_client_start`` replaced without declaring them.

    ``before``: the module's :func:`~fl_lightning.core.stacking.attribute_ids` before ``on_client_start``.
    """
    declared = set(getattr(module, "client_attributes", ())) | {"client"}
    after = attribute_ids(module)
    return sorted(k for k, v in after.items() if k not in declared and before.get(k) != v)


class BatchedClients(ClientExecutor):
    """The round's clients trained in stacks: each training batch is a :class:`~fl_lightning.data.ClientGroup`.

    Per group: each client starts as in every executor (:meth:`~fl_lightning.executor.ClientExecutor.start_client`:
    its seed, context and ``on_client_start`` on the global weights; one teacher, shared by the group), clients with
    attributes of one structure are trained together by :func:`~fl_lightning.stacked.train_stacked`, then each
    client's ``on_client_end`` runs on its own weights and its results go to the round
    (:meth:`~fl_lightning.executor.ClientExecutor.end_client`). A group that cannot train stacked trains one client
    after another, and so does every later group. The arguments are :class:`~fl_lightning.executor.ClientExecutor`'s,
    and ``capture``: the fit's cache of built (captured) steps, kept across rounds; ``conv``: how stacked 2-d
    convolutions are computed (:data:`~fl_lightning.core.stacked_conv.STACKED_CONVS`).
    """

    def __init__(
        self,
        datamodule: FederatedDataModule,
        client_states: ClientStateStore,
        seed: int,
        evaluate_local: Callable[[L.LightningModule], Evaluation] | None = None,
        capture: StepCache | None = None,
        conv: str = "grouped",
    ) -> None:
        super().__init__(datamodule, client_states, seed, evaluate_local)
        #: How the stacked steps compute 2-d convolutions (:func:`~fl_lightning.stacked.train_stacked`'s ``conv``).
        self.conv = conv
        #: The fit's built stacked steps (``None``: every step runs uncaptured, :func:`train_stacked`'s ``capture``).
        self.capture = capture
        #: The largest peak GPU memory per stacked client measured so far (zero off CUDA).
        self.memory = StackedMemory()
        #: Why the clients train one by one from now on (a failure of the stacked step), or ``None``.
        self.fallback: str | None = None
        #: Told the reason when the engine falls back.
        self.on_fallback: Callable[[str], None] | None = None

    def on_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        """Attach the group's training to the batch, which the method's ``training_step`` runs."""
        rnd = self.round
        assert rnd is not None
        if not isinstance(batch, ClientGroup):
            raise TypeError(f"the batched engine trains ClientGroup batches, got {type(batch).__name__}")
        batch.run = functools.partial(self._train_group, trainer, rnd.group_positions(batch_idx))

    def _train_group(
        self, trainer: L.Trainer, positions: Sequence[int], module: FedAvg, group: ClientGroup
    ) -> Tensor | None:
        rnd = self.round
        assert rnd is not None
        if not positions:
            return None
        if self.fallback is None:
            done = rnd.done
            try:
                return self._train_stacks(trainer, positions, module, group)
            except NotBatchable as err:
                reason = str(err)
            except StateChangedInStep as err:
                if rnd.done != done or not err.restorable:  # nothing to redo, or a module beyond repair
                    raise
                reason = str(err)
            except torch.OutOfMemoryError as err:  # not the method's fault: fewer clients at once would fit
                raise torch.OutOfMemoryError(
                    f"the batched engine's step of {len(positions)} stacked clients ran out of GPU memory; lower "
                    + options("federation.group_size", "federation.memory_budget_gb", joint=" or ")
                    + f" ({first_line(err)})"
                ) from err
            except Exception as err:  # noqa: BLE001 - a loss or network vmap cannot run: say so, train sequentially
                if rnd.done != done:  # clients of this group already reached the round: nothing to redo
                    raise
                first = first_line(err)
                reason = f"the stacked step failed ({type(err).__name__}: {first[:200]})"
            self.fallback = reason
            module.client = None
            module.load_state_dict(rnd.global_weights)
            if self.on_fallback is not None:
                self.on_fallback(reason)
        return self._train_one_by_one(trainer, positions, module, group)

    def _train_one_by_one(
        self, trainer: L.Trainer, positions: Sequence[int], module: FedAvg, group: ClientGroup
    ) -> Tensor | None:
        """The group's clients one after another, each on its own training batch, as the sequential engine trains."""
        rnd = self.round
        assert rnd is not None
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        losses = []
        for i, pos in enumerate(positions):
            self.reset(trainer, module)
            ctx = self.client_context(pos, module.device, lr)
            self.start_client(module, ctx)
            loss = module.training_step(group.clients[i], pos)
            value = 0.0 if loss is None else float(loss)
            losses.append(value)
            self.end_client(module, pos, ctx, value)
        module.load_state_dict(rnd.global_weights)
        return torch.tensor(sum(losses) / len(losses)) if losses else None

    def _train_stacks(
        self, trainer: L.Trainer, positions: Sequence[int], module: FedAvg, group: ClientGroup
    ) -> Tensor | None:
        rnd = self.round
        assert rnd is not None
        sgd = SGDSettings.from_optimizer(trainer.optimizers[0])
        transform = self.dm.transform
        random_batches = isinstance(transform, BatchTransform) and transform.augments
        contexts: list[ClientContext] = []
        stacks: dict[Any, list[int]] = {}
        members: list[StackedClient] = []
        needs_teacher = False
        for pos in positions:
            ctx = self.client_context(pos, module.device, sgd.lr)
            contexts.append(ctx)
            needs_teacher = needs_teacher or module.teacher_needed(ctx)
        if needs_teacher:
            module.refresh_teacher()  # the global model, shared by every client of the group
        versions = tensor_versions(module)
        for i, ctx in enumerate(contexts):
            before = attribute_ids(module)
            self.start_client(module, ctx, refresh_teacher=False)
            if tensor_versions(module) != versions:
                raise NotBatchable(
                    f"{type(module).__name__}.on_client_start changes the module's weights or buffers "
                    "(the batched engine starts every client from the global weights)"
                )
            changed = undeclared_changes(module, before)
            if changed:
                raise NotBatchable(
                    f"{type(module).__name__}.on_client_start sets {', '.join(changed)} without declaring "
                    f"{'it' if len(changed) == 1 else 'them'} in client_attributes"
                )
            attrs = client_attributes(module)
            rng = ClientRNG(module.device) if random_batches else None
            source = group.clients[i]
            members.append(
                StackedClient(
                    iter(source), ctx.steps, attrs, rng, source if isinstance(source, ClientBatches) else None
                )
            )
        module.client = None  # a loss that reads self.client in the batched engine fails loudly
        aligned = module.align_client_attributes([member.attributes for member in members])
        if len(aligned) != len(members) or any(
            not isinstance(a, Mapping) or set(a) != set(m.attributes) for a, m in zip(aligned, members, strict=True)
        ):
            raise NotBatchable(
                f"{type(module).__name__}.align_client_attributes must return one dict per client with the keys of "
                "client_attributes"
            )
        for i, (member, attrs) in enumerate(zip(members, aligned, strict=True)):
            member.attributes = dict(attrs)
            stacks.setdefault(attribute_structure(attrs), []).append(i)
        opt = module.optimizers()
        template = module.state_dict()
        losses = []
        for stack in stacks.values():
            held = HeldMetrics(module)
            try:
                with PeakMemory(module.device) as peak, _no_logging(module):
                    result = train_stacked(
                        module,
                        [members[i] for i in stack],
                        sgd,
                        module._clip_grad_norm,
                        on_step=functools.partial(_count_steps, opt),
                        augment=transform if random_batches else None,
                        capture=self.capture,
                        conv=self.conv,
                    )
            except torch.OutOfMemoryError:
                raise
            except Exception as err:
                altered = held.restore()
                if any(altered):  # the likelier cause of the failure, and what a fallback must not inherit
                    raise StateChangedInStep(module, *altered) from err
                raise
            altered = held.restore()
            if any(altered):
                raise StateChangedInStep(module, *altered)
            self.memory.record(len(stack), peak.bytes)
            # The local weights go into the module only for a method that reads them at its client's end.
            load = overrides(module, "on_client_end", FederatedHooks) or self.evaluate_local is not None
            for k, i in enumerate(stack):
                ctx = contexts[i]
                weights = result.client_state(k, template)
                upload: Mapping[str, Tensor] = {}
                if load:
                    module.load_state_dict(weights)
                    module.client = ctx
                    rng = members[i].rng
                    with (
                        bound_attributes(module, members[i].attributes),
                        rng.active() if rng is not None else contextlib.nullcontext(),
                    ):
                        upload = client_upload(module, ctx)
                loss = result.losses[k]
                losses.append(loss)
                self.end_client(module, positions[i], ctx, loss, weights, upload)
            if load:
                module.load_state_dict(rnd.global_weights)
        module.client = None
        return torch.tensor(sum(losses) / len(losses)) if losses else None


@contextlib.contextmanager
def _no_logging(module: L.LightningModule) -> Iterator[None]:
    """``self.log`` and ``self.log_dict`` raise :class:`NotBatchable` while the stacked step runs the method's loss.

    Under ``vmap`` a logged value is every stacked client's at once, which Lightning would record as one number (the
    wrong one), or which escapes ``vmap`` as an error at the round's end: the clients train one by one instead.
    """
    refuse = _REFUSALS.get(module)
    if refuse is None:  # one per module: a built step's fingerprint of the module holds the attribute's identity
        refuse = _REFUSALS[module] = functools.partial(_refuse_logging, type(module).__name__)
    own = {name: vars(module)[name] for name in ("log", "log_dict") if name in vars(module)}
    module.log = module.log_dict = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        for name in ("log", "log_dict"):
            if name in own:
                setattr(module, name, own[name])
            else:
                delattr(module, name)


_REFUSALS: weakref.WeakKeyDictionary[nn.Module, Callable[..., None]] = weakref.WeakKeyDictionary()


def _refuse_logging(method: str, *args: Any, **kwargs: Any) -> None:
    raise NotBatchable(
        f"{method}.client_loss logs with self.log, which the batched engine cannot stack (it runs every client's "
        "loss at once under vmap); log in on_client_end to keep the batched engine"
    )


def _count_steps(opt: Any, n: int) -> None:
    """Lightning's step bookkeeping (``global_step``), once per client step, as the sequential engine keeps it."""
    count_optimizer_steps(opt, n)

"""One communication round without Lightning: plan → local updates → reduce → server step → evaluate.

The :class:`~fl_lightning.Federation` callback drives these units from Lightning's hooks; each is testable alone:

- :func:`plan_round` (pure): the round's clients, their local steps and learning-rate scale;
  :func:`process_share`: which of them this process trains.
- :class:`RoundState`: one round in progress: which training batch starts and ends which client, the clients'
  results (weights, uploads, losses, states) as they finish, and the reduce over clients and processes.
- the server step: the method's ``server_update``, then a :mod:`~fl_lightning.core.server_optim` optimizer.
- :func:`~fl_lightning.core.evaluation.evaluate`: the global model on the test set.

Running the round's local updates is the one step an executor owns (inside Lightning's training loop: one client
after another, or a group of clients per training batch with the batched engine); planning, the reduce, the server
step and evaluation do not depend on it.

>>> plan = plan_round(0, seed=0, client_sizes=[40, 10, 30, 20], sample_ratio=0.5, batch_size=10, local_epochs=2)
>>> plan.clients, plan.steps
((0, 3), (8, 4))
>>> process_share(plan, rank=1, world=2)
([1], RoundPlan(round=0, clients=(3,), steps=(4,), local_epochs=2, lr_scale=1.0))
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from fl_lightning.core.aggregation import StateAccumulator, UploadAccumulator
from fl_lightning.core.distributed import all_gather_object, assign_clients, is_distributed, to_device
from fl_lightning.core.evaluation import Evaluation
from fl_lightning.core.messages import first_line
from fl_lightning.core.metrics import forgetting_degree
from fl_lightning.core.state import unstorable_state


@dataclass(frozen=True)
class RoundPlan:
    """What the clients of one round train on: who, how many local batches each, and at which learning-rate scale.

    A client id of -1 (with 0 steps) is an empty update that pads a process's share (see :func:`process_share`).
    """

    round: int
    clients: tuple[int, ...]
    steps: tuple[int, ...]
    local_epochs: int
    lr_scale: float


@runtime_checkable
class RoundPlanner(Protocol):
    """What a :class:`~fl_lightning.FederatedDataModule` asks of the callback that plans its rounds (``Federation``)."""

    #: Communication rounds (the Trainer's ``max_epochs``).
    rounds: int
    #: Whether a training batch is a whole client's update (fl_lightning methods) or one local step.
    client_batches: bool
    #: Clients per training batch for the batched engine (``None``: one client, or one step, per batch).
    client_group: int | None
    #: Seed of client sampling, local shuffling and augmentation.
    seed: int

    def local_plan(self, round_idx: int) -> RoundPlan:
        """The clients this process trains in round ``round_idx``."""

    def prepare_trainer(self, trainer: Any) -> None:
        """Apply the federation's trainer rules when the datamodule is attached (before Lightning reads them)."""


def round_seed(*parts: int) -> int:
    """A 63-bit seed derived from integers (seed, round, client, ...), stable across runs and platforms.

    >>> round_seed(0, 1) == round_seed(0, 1) != round_seed(0, 2)
    True
    """
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint64)[0]) >> 1


def seed_torch(seed: int, device: torch.device | str = "cpu") -> None:
    """``torch.manual_seed(seed)``, for a run on the CPU or a CUDA device: the CPU and every initialised CUDA device.

    ``torch.manual_seed`` also queues a lazy seed for each backend that is not initialised, formatting a stack trace
    each time: milliseconds per client, a fifth of a small round. On any other device it is what runs.
    """
    if torch.device(device).type not in ("cpu", "cuda"):
        torch.manual_seed(seed)
        return
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)


def client_steps(num_samples: int, batch_size: int, local_epochs: int, drop_last: bool = False) -> int:
    """Local optimizer steps of a client holding ``num_samples`` for ``local_epochs`` epochs.

    >>> client_steps(25, 10, 2), client_steps(25, 10, 2, drop_last=True)
    (6, 4)
    """
    per_epoch = num_samples // batch_size if drop_last else -(-num_samples // batch_size)
    return local_epochs * per_epoch


def num_sampled(num_clients: int, sample_ratio: float) -> int:
    """Clients per round: ``round(sample_ratio · N)``, at least 1.

    >>> num_sampled(100, 0.1), num_sampled(3, 0.1)
    (10, 1)
    """
    return max(1, int(round(sample_ratio * num_clients)))


def plan_round(
    round_idx: int,
    *,
    seed: int,
    client_sizes: Sequence[int],
    sample_ratio: float,
    batch_size: int,
    local_epochs: int,
    drop_last: bool = False,
    lr_decay: float = 1.0,
) -> RoundPlan:
    """Round ``round_idx``'s plan, a pure function of its arguments.

    The clients are ``round(sample_ratio · N)`` drawn without replacement by a generator seeded with (seed, round),
    sorted; each trains ``local_epochs`` passes over its data; the learning rate is scaled by ``lr_decay^round``.
    """
    n = len(client_sizes)
    rng = np.random.default_rng(round_seed(seed, round_idx))
    clients = tuple(int(c) for c in np.sort(rng.choice(n, num_sampled(n, sample_ratio), replace=False)))
    steps = tuple(client_steps(client_sizes[c], batch_size, local_epochs, drop_last) for c in clients)
    return RoundPlan(round_idx, clients, steps, local_epochs, lr_decay**round_idx)


def process_share(plan: RoundPlan, rank: int = 0, world: int = 1) -> tuple[list[int], RoundPlan]:
    """This process's slots (positions in ``plan.clients``) and the plan of the clients it trains.

    Slots are shared so that processes finish together (:func:`~fl_lightning.core.distributed.assign_clients`). Every
    process gets as many clients as the largest share: the shorter shares are padded with empty updates (client
    -1, no steps), since Lightning keeps processes in step at every training batch.
    """
    if world == 1:
        return list(range(len(plan.clients))), plan
    shares = assign_clients(plan.steps, world)
    slots = shares[rank]
    padding = max(map(len, shares)) - len(slots)
    local = RoundPlan(
        plan.round,
        tuple(plan.clients[s] for s in slots) + (-1,) * padding,
        tuple(plan.steps[s] for s in slots) + (0,) * padding,
        plan.local_epochs,
        plan.lr_scale,
    )
    return slots, local


def _finite(values: Mapping[str, Tensor]) -> bool:
    """Whether every floating tensor of ``values`` is finite: one check and one wait per device and dtype."""
    flat: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for v in values.values():
        if torch.is_floating_point(v):
            flat.setdefault((v.device, v.dtype), []).append(v.detach().reshape(-1))
    return all(bool(torch.isfinite(torch.cat(found)).all()) for found in flat.values())


@dataclass
class RoundState:
    """One round in progress in one process: its clients' training batches, their results and the reduce.

    An executor reports each training batch to :meth:`client_starting` / :meth:`step_loss` / :meth:`client_ending`
    and each finished client to :meth:`add_client`; the same code serves a method that trains a whole client per
    batch (``batches_per_client=None``: one batch each) and a module that trains one batch per local step (the
    client's steps). ``batches_per_client`` may list more positions than :attr:`slots`: the empty updates that pad
    a process's share, whose batches start and end no client; :meth:`is_last_batch` tells when the round's training
    batches are done. After every client, :meth:`reduce` sums over processes and returns the weighted average of the
    weights and the reduced uploads.

    >>> import torch
    >>> plan = RoundPlan(0, clients=(3, 5), steps=(2, 1), local_epochs=1, lr_scale=1.0)
    >>> rnd = RoundState(plan, slots=[0, 1], weights=[0.25, 0.75], batches_per_client=plan.steps)
    >>> [(rnd.client_starting(b), rnd.client_ending(b), rnd.is_last_batch(b)) for b in range(3)]
    [(0, None, False), (None, 0, False), (1, 1, True)]
    >>> rnd.add_client(0, {"w": torch.tensor([4.0])}, loss=0.5)
    True
    >>> rnd.add_client(1, {"w": torch.tensor([8.0])}, loss=0.1)
    True
    >>> average, uploads = rnd.reduce({"w": torch.float32})
    >>> average["w"].tolist(), rnd.train_loss
    ([7.0], 0.3)
    """

    plan: RoundPlan
    slots: list[int]
    weights: Sequence[float]
    batches_per_client: Sequence[int] | None = None
    upload_reduce: Mapping[str, str] | None = None
    group_size: int | None = None
    global_weights: dict[str, Tensor] = field(default_factory=dict)
    lr: float = float("nan")  # the learning rate the round's clients train with
    started_at: float = 0.0
    received_class_acc: np.ndarray = field(default_factory=lambda: np.zeros(0))
    losses: dict[int, float] = field(default_factory=dict)
    local_evals: dict[int, tuple[float, np.ndarray]] = field(default_factory=dict)
    client_states: dict[int, dict[str, Any]] = field(default_factory=dict)
    received_states: dict[int, dict[str, Any]] = field(default_factory=dict)
    diverged: list[str] = field(default_factory=list)
    done: int = 0

    def __post_init__(self) -> None:
        per_client = [1] * len(self.slots) if self.batches_per_client is None else list(self.batches_per_client)
        bounds = np.cumsum([0, *per_client]).tolist()
        # Batch index -> position in `slots`, for the batches where a client starts and ends (none for padding).
        self._starts = {b: i for i, b in enumerate(bounds[:-1]) if i < len(self.slots) and per_client[i] > 0}
        self._ends = {b - 1: i for i, b in enumerate(bounds[1:]) if i < len(self.slots) and per_client[i] > 0}
        self._last_batch = bounds[-1] - 1
        if self.group_size is not None:  # the batched engine: training batch b holds clients b·g .. b·g + g − 1
            self._last_batch = -(-len(per_client) // self.group_size) - 1
        self._step_losses: list[Tensor] = []
        self._states = StateAccumulator()
        self._uploads = UploadAccumulator(self.upload_reduce)

    def group_positions(self, batch_idx: int) -> list[int]:
        """The positions (in :attr:`slots`) of the clients that training batch ``batch_idx`` trains together."""
        assert self.group_size is not None, "group_positions needs a group_size"
        start = batch_idx * self.group_size
        return list(range(start, min(start + self.group_size, len(self.slots))))

    def client_starting(self, batch_idx: int) -> int | None:
        """The position (in :attr:`slots`) of the client whose first training batch is ``batch_idx``, if any."""
        if batch_idx in self._starts:
            self._step_losses = []
        return self._starts.get(batch_idx)

    def step_loss(self, loss: Tensor | None) -> None:
        """Record a training batch's loss (``None``: the batch reported none)."""
        if loss is not None:
            self._step_losses.append(loss.detach().float())

    def client_ending(self, batch_idx: int) -> int | None:
        """The position of the client whose last training batch is ``batch_idx``, if any."""
        return self._ends.get(batch_idx)

    def is_last_batch(self, batch_idx: int) -> bool:
        """Whether ``batch_idx`` is this process's last training batch of the round."""
        return batch_idx >= self._last_batch

    def client_loss(self) -> Tensor:
        """The mean training loss over the current client's batches (0 when it reported none)."""
        return torch.stack(self._step_losses).mean() if self._step_losses else torch.tensor(0.0)

    def add_client(
        self,
        pos: int,
        weights: Mapping[str, Tensor],
        upload: Mapping[str, Tensor] | None = None,
        loss: float | Tensor = 0.0,
        client: int | None = None,
        state: dict[str, Any] | None = None,
    ) -> bool:
        """Add a finished client's local weights, upload, mean training loss and state; ``False`` if not finite.

        A client with a non-finite loss, weight or upload is left out of the reduce and noted in :attr:`diverged`.
        """
        slot, upload = self.slots[pos], upload or {}
        self.done += 1
        loss = float(loss)
        if not (np.isfinite(loss) and _finite(weights) and _finite(upload)):
            self.diverged.append(f"client {client} produced a non-finite loss or weights")
            return False
        self._states.add(weights, self.weights[slot], order=slot)
        self._uploads.add(upload, self.weights[slot])
        self.losses[slot] = loss
        if client is not None and state is not None:
            self.client_states[client] = state
        return True

    def add_local_eval(self, pos: int, result: Evaluation) -> None:
        """A finished client's local model evaluated on the test set (``eval_local``)."""
        self.local_evals[self.slots[pos]] = (result.acc, result.class_acc)

    def gather_divergence(self) -> list[str]:
        """Every process's divergence messages (all processes must call it together)."""
        return [msg for msgs in all_gather_object(self.diverged) for msg in msgs]

    def reduce(self, dtypes: Mapping[str, torch.dtype] | None = None) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Sum over processes: the weighted average of the clients' weights and their reduced uploads.

        Every process also receives every other process's client states (in :attr:`received_states`), losses and
        local evaluations (all processes must call it together).
        """
        if self.done != len(self.slots):
            raise RuntimeError(f"round {self.plan.round + 1} ended after {self.done} of its {len(self.slots)} clients")
        self._states.all_reduce()
        self._uploads.all_reduce()
        gathered = self._gathered() if is_distributed() else [(self.client_states, self.losses, self.local_evals)]
        if len(gathered) > 1:
            for states, losses, evals in gathered:
                for client, state in states.items():
                    if client not in self.client_states:
                        self.received_states[client] = state
                self.losses.update(losses)
                self.local_evals.update(evals)
        return self._states.result(dtypes), self._uploads.result()

    def _gathered(self) -> list[tuple[dict[int, Any], dict[int, float], dict[int, Any]]]:
        """Every process's client states, losses and local evaluations, in rank order.

        Each process pickles its own part first, so that a state no process can receive (a function in it) ends every
        process's fit with one line naming it, rather than leaving the others waiting in the collective.
        """
        # On the CPU before pickling: a CUDA tensor would be unpickled onto its own GPU in every other process.
        mine = (to_device(self.client_states, "cpu"), self.losses, self.local_evals)
        try:
            blob, problem = pickle.dumps(mine), None
        except (TypeError, AttributeError, pickle.PicklingError) as err:
            found = (
                unstorable_state(f"client {c}'s state", s, "processes cannot send each other")
                for c, s in mine[0].items()
            )
            blob, problem = None, str(next((e for e in found if e is not None), None) or first_line(err))
        parts = all_gather_object((blob, problem))
        problems = [problem for _, problem in parts if problem is not None]
        if problems:
            raise TypeError(problems[0])
        return [pickle.loads(blob) for blob, _ in parts]

    def measurements(self, result: Evaluation, seconds: float) -> dict[str, float]:
        """The round's ``metrics.csv`` measurements, with the global model's evaluation ``result``."""
        return {
            "round": self.plan.round + 1,
            "global_acc": result.acc,
            "global_loss": result.loss,
            "train_loss": self.train_loss,
            "lr": self.lr,
            "clients": len(self.plan.clients),
            "round_seconds": seconds,
            **self.local_metrics(),
        }

    def local_metrics(self) -> dict[str, float]:
        """With local evaluations: the clients' mean accuracy AccL and mean forgetting degree τ (else nothing).

        τ (FedKA §3.1) compares each local model's class-wise accuracy with the global model it started from
        (:attr:`received_class_acc`).
        """
        if not self.local_evals:
            return {}
        evals = [self.local_evals[s] for s in sorted(self.local_evals)]
        degrees = [forgetting_degree(self.received_class_acc, class_acc) for _, class_acc in evals]
        return {
            "local_acc_mean": float(np.mean([acc for acc, _ in evals])),
            "local_forgetting_degree": float(np.mean(degrees)),
        }

    @property
    def train_loss(self) -> float:
        """Mean over the round's clients of their mean training loss (NaN before any)."""
        losses = [self.losses[s] for s in sorted(self.losses)]
        return float(np.mean(losses)) if losses else float("nan")

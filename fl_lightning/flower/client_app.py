"""The ClientApp: one client's local update, run by the round core's executor where the client's data lives.

A SuperNode holds one client of the federation: its ``--node-config`` names the partition (``partition-id``, and
``num-partitions`` for the check that the server and the node mean the same federation); Flower's simulation runtime
sets both for each virtual node. The node builds the federation from the run's config (:mod:`.build`) and trains
only its own partition. It answers two messages:

- ``query`` (before the first round): its partition, its number of samples, its method and its settings'
  fingerprint (:func:`~fl_lightning.core.agreement.settings_fingerprint`, which the server compares with its own), or
  the one-line reason
  it cannot take part (a partition outside the federation, no data for its partition, a config of another method);
- ``train``: the round's global weights, the method's payload and the client's part of the plan in; the local
  weights, the method's upload and the mean training loss out. The update runs through
  :class:`~fl_lightning.executor.SequentialClients` (the client's start and end, its seed, its context, its teacher)
  on one module that persists between messages while the process lives (in Flower's simulation runtime, the
  Ray actor; a deployed SuperNode starts a ``flwr-clientapp`` process per message, which builds the module anew);
  the client's persistent method state (SCAFFOLD's control variate, MOON's previous model, ...) stays on the node,
  in Flower's ``Context.state``, which the node keeps for the run and hands to each message's ClientApp.

The run config (``flwr run --run-config``, or :func:`client_app`'s arguments) names the fl_lightning config
(``config``) and extra command-line options (``options``); a node's own ``--node-config`` may add options of its
own (``options="--data.root /data/site-3"``), read after the run's.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import Tensor

from fl_lightning import rules
from fl_lightning.core.agreement import settings_fingerprint
from fl_lightning.core.batches import ClientBatches
from fl_lightning.core.rounds import RoundPlan, RoundState
from fl_lightning.core.state import ClientStateStore
from fl_lightning.executor import SequentialClients
from fl_lightning.flower.build import FlowerSetup, build
from fl_lightning.flower.messages import get_tree, get_weights, put_tree, put_weights
from fl_lightning.module import client_upload

#: Where a node keeps its client's persistent method state between rounds (in ``Context.state``).
STATE_NAME = "fl_lightning.client_state"

_SETUPS: dict[tuple[str, str], FlowerSetup] = {}
_LOCK = threading.Lock()


def cached_setup(config: str, options: str) -> FlowerSetup:
    """The federation built from ``config`` and ``options`` (:func:`~.build.build`), once per process."""
    key = (config, options)
    with _LOCK:
        if key not in _SETUPS:
            _SETUPS[key] = build(config, options)
        return _SETUPS[key]


def node_partition(context: Context) -> tuple[int, int | None]:
    """The node's ``partition-id`` and ``num-partitions`` (``None`` when not given) from its node config."""
    config = context.node_config
    if "partition-id" not in config:
        raise ValueError(
            'the SuperNode\'s --node-config names no partition-id (e.g. "partition-id=0 num-partitions=3")'
        )
    parts = config.get("num-partitions")
    return int(config["partition-id"]), int(parts) if parts is not None else None


def partition_problem(setup: FlowerSetup, partition: int, num_partitions: int | None) -> str | None:
    """Why this node cannot train ``partition`` of the federation ``setup`` describes (``None``: it can)."""
    n = setup.datamodule.num_clients
    if num_partitions is not None and num_partitions != n:
        return f"the node's num-partitions is {num_partitions}, the config's federation has {n} clients"
    if not 0 <= partition < n:
        return f"partition-id {partition} is outside the federation (clients 0 to {n - 1})"
    if setup.datamodule.client_sizes[partition] == 0:
        return f"the node holds no training data for partition {partition}"
    return None


class _OneClient(SequentialClients):
    """The executor of one client: keeps what the client sends up (weights, upload, loss) as it ends."""

    sent: tuple[dict[str, Tensor], dict[str, Tensor], float] | None = None

    def end_client(
        self,
        module: Any,
        pos: int,
        ctx: Any,
        loss: float | Tensor,
        weights: Mapping[str, Tensor] | None = None,
        upload: Mapping[str, Tensor] | None = None,
    ) -> None:
        """Keep the client's results (copied to the CPU), then end it as every executor does."""
        if upload is None:
            upload = client_upload(module, ctx)
        if weights is None:
            weights = module.state_dict()
        self.sent = (
            {k: v.detach().cpu().clone() for k, v in weights.items()},
            {k: v.detach().cpu().clone() for k, v in upload.items()},
            float(loss),
        )
        super().end_client(module, pos, ctx, loss, weights, upload)


def local_update(setup: FlowerSetup, content: RecordDict, state: dict[str, Any] | None) -> tuple[RecordDict, Any]:
    """Train the client a ``train`` message describes; the reply's content and the client's new state."""
    trainer, module, dm = setup.trainer, setup.module, setup.datamodule
    plan_rec = content["plan"]
    assert isinstance(plan_rec, ConfigRecord)
    client, rnd_idx = int(plan_rec["client"]), int(plan_rec["round"])  # type: ignore[arg-type]
    plan = RoundPlan(
        rnd_idx,
        (client,),
        (int(plan_rec["steps"]),),  # type: ignore[arg-type]
        int(plan_rec["local_epochs"]),  # type: ignore[arg-type]
        float(plan_rec["lr_scale"]),  # type: ignore[arg-type]
    )
    global_weights = get_weights(content, "global", module.device)
    payload = get_tree(content, "payload") or {}
    module.load_state_dict(global_weights)
    lr = rules.set_round_lr(trainer, plan.lr_scale)
    hooks = setup.hooks
    rnd = RoundState(
        plan,
        [0],
        [float(plan_rec["weight"])],  # type: ignore[arg-type]
        batches_per_client=[1],
        upload_reduce=hooks.upload_reduce if hooks is not None else None,
        global_weights=global_weights,
        lr=lr,
    )
    states = ClientStateStore()
    if state is not None:
        states.put(client, state)
    executor = _OneClient(dm, states, setup.federation.seed)
    executor.start_round(rnd, payload)
    module.train()
    raw = next(iter(dm.round_batches(plan, seed=setup.federation.seed)))
    if isinstance(raw, ClientBatches):  # what Lightning's batch transfer does
        raw = raw.to(module.device)
    batch = dm.on_after_batch_transfer(raw, 0)
    executor.on_batch_start(trainer, module, batch, 0)
    with trainer.precision_plugin.train_step_context():
        loss = module.training_step(batch, 0)
    executor.on_batch_end(module, {"loss": loss}, 0)
    assert executor.sent is not None
    weights, upload, mean_loss = executor.sent
    reply = RecordDict()
    put_weights(reply, "weights", weights)
    put_tree(reply, "upload", upload)
    reply["result"] = ConfigRecord({"client": client, "round": rnd_idx, "loss": mean_loss})
    reply["metrics"] = MetricRecord({"train_loss": mean_loss, "num-examples": int(dm.client_sizes[client])})
    return reply, states.get(client) if client in states else None


def client_app(config: str | None = None, options: str | None = None) -> ClientApp:
    """A ClientApp for the fl_lightning config ``config`` (default: the run config's ``config`` and ``options``)."""
    app = ClientApp()

    def setup_of(context: Context) -> FlowerSetup:
        path = config if config is not None else str(context.run_config.get("config", ""))
        extra = options if options is not None else str(context.run_config.get("options", ""))
        own = str(context.node_config.get("options", ""))  # this node's own options, e.g. where its data lies
        extra = f"{extra} {own}".strip()
        if not path:
            raise ValueError('the run config names no fl_lightning config (config = "path/to/config.yaml")')
        return cached_setup(path, extra)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        partition, parts = node_partition(context)
        setup = setup_of(context)
        problem = partition_problem(setup, partition, parts)
        info: dict[str, Any] = {"partition": partition, "method": setup.method_name}
        info["settings"] = json.dumps(settings_fingerprint(setup.config, science_only=True))
        if problem is not None:
            info["problem"] = problem
        else:
            info["num-examples"] = int(setup.datamodule.client_sizes[partition])
        return Message(RecordDict({"node": ConfigRecord(info)}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        partition, _ = node_partition(context)
        setup = setup_of(context)
        plan = msg.content["plan"]
        assert isinstance(plan, ConfigRecord)
        if int(plan["client"]) != partition:  # type: ignore[arg-type]
            raise ValueError(f"this node holds partition {partition}, the server sent client {plan['client']!s}")
        state = get_tree(context.state, STATE_NAME)
        reply, new_state = local_update(setup, msg.content, state)
        if new_state is not None:
            put_tree(context.state, STATE_NAME, new_state)
        return Message(reply, reply_to=msg)

    return app


#: The ClientApp ``flwr run`` loads (``fl_lightning.flower.client_app:app``): its config comes from the run config.
app = client_app()

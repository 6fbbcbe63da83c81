"""The ServerApp: fl_lightning's server rounds, with each round's local updates sent to Flower nodes.

The server builds the federation from the run's config (:mod:`.build`), as ``cli.py fit`` would, and runs the rounds
the :class:`~fl_lightning.Federation` callback runs, with the same units: the plan
(:meth:`~fl_lightning.core.server.FederatedServer.plan_for`), the method's ``on_round_start``, a
:class:`~fl_lightning.core.rounds.RoundState` that takes each client's weights, upload and loss, the server step
(:meth:`~fl_lightning.core.server.FederatedServer.server_step`: the reduce, the method's ``server_update``, the server
optimizer) and the evaluation of the global model on the test set. Only the local updates run elsewhere: each
sampled client's update is a ``train`` message to the node holding its partition. The run's record is written by a
:class:`~fl_lightning.recorder.RunRecorder`, as a fit writes it: ``metrics.csv``, ``summary.json``, ``partition.csv``
and the curves, and the rows go to the config's loggers.

Before the first round, a ``query`` message to every node maps partitions to nodes and checks that each node can take
part; a problem (a partition outside the federation, a node without data, another method, a missing or doubled
partition) stops the run with one line (:class:`FlowerRunError`) before anything is written.

The run config (``flwr run --run-config``, or :func:`server_app`'s arguments): ``config`` (the fl_lightning YAML),
``options`` (extra command-line options), ``run-dir`` (the run directory; default: the config's
``trainer.default_root_dir``), ``node-wait`` (seconds to wait for the nodes to connect), ``round-timeout``
(seconds to wait for a round's replies) and ``min-clients`` (the fewest of a round's sampled clients whose replies
let the round complete; default: all of them).

A round whose clients did not all answer (a node that failed, was killed, or did not reply within ``round-timeout``)
completes with the clients that answered when at least ``min-clients`` did: the plan, the aggregation weights and the
server's view of the round are those of the answered clients, a one-line note goes to stderr, and ``summary.json``
lists the missing clients by round (``missing_clients``). With fewer answers the run fails with one line.

A Flower run cannot be resumed: the ServerApp writes no checkpoint, and the clients' persistent states live on the
nodes. ``summary.json`` says so (``"resumable": false``); a restarted ServerApp starts a new run.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from fl_lightning import rules
from fl_lightning.core.agreement import PER_NODE_KEYS, SHOWN, differences, settings_fingerprint
from fl_lightning.core.models import trainable
from fl_lightning.core.rounds import RoundPlan, RoundState, num_sampled
from fl_lightning.core.run_lock import RunDirClaim
from fl_lightning.core.rundir import read_summary, run_status
from fl_lightning.flower.build import FlowerSetup, build, split_options
from fl_lightning.flower.messages import get_tree, get_weights, put_tree, put_weights
from fl_lightning.module import round_payload
from fl_lightning.recorder import RunRecorder, run_info


class FlowerRunError(RuntimeError):
    """A Flower run that cannot go on, with the one line that says why."""


def wait_for_nodes(grid: Grid, count: int, timeout: float) -> list[int]:
    """The ids of the connected nodes, once ``count`` are connected (``FlowerRunError`` after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= count:
            return nodes
        if time.monotonic() >= deadline:
            raise FlowerRunError(f"{len(nodes)} of the federation's {count} nodes connected within {timeout:g}s")
        time.sleep(0.2)


def reason_of(reply: Message) -> str:
    """The one-line reason a node's reply carries an error."""
    reason = str(reply.error.reason).strip().splitlines()
    return reason[-1] if reason else f"error code {reply.error.code}"


def map_partitions(grid: Grid, setup: FlowerSetup, nodes: Sequence[int], timeout: float) -> dict[int, int]:
    """Ask every node which partition it holds: client id → node id, once every node can take part.

    Raises :class:`FlowerRunError` for the first problem: a node that did not answer or failed, a node's own
    problem (its partition outside the federation, no data), a node configured for another method or with other
    settings (its settings fingerprint differs from the server's: another ``--model.lr``, batch size or seed), two
    nodes with the same partition, or a partition no node holds.
    """
    messages = [Message(RecordDict(), node, "query") for node in nodes]
    received = list(grid.send_and_receive(messages, timeout=timeout))
    sent = {msg.metadata.message_id: node for msg, node in zip(messages, nodes, strict=True)}
    replies: dict[int, Message] = {}
    for reply in received:  # an error reply the SuperLink wrote for a lost node comes from the SuperLink
        src = reply.metadata.src_node_id
        replies[src if src in nodes else sent.get(reply.metadata.reply_to_message_id, src)] = reply
    clients: dict[int, int] = {}
    own = settings_fingerprint(setup.config, science_only=True)
    for node in nodes:
        if node not in replies:
            raise FlowerRunError(f"node {node} did not answer within {timeout:g}s")
        reply = replies[node]
        if reply.has_error():
            raise FlowerRunError(f"node {node} cannot take part: {reason_of(reply)}")
        info = reply.content["node"]
        assert isinstance(info, ConfigRecord)
        partition = int(info["partition"])  # type: ignore[arg-type]
        if "problem" in info:
            raise FlowerRunError(f"node {node} cannot take part: {info['problem']!s}")
        if info["method"] != setup.method_name:
            raise FlowerRunError(
                f"node {node} (partition {partition}) is configured for method {info['method']!s}, "
                f"the server for {setup.method_name}"
            )
        if "settings" not in info:
            raise FlowerRunError(
                f"node {node} (partition {partition}) sent no settings to compare: it runs an older fl_lightning; "
                "install the server's version on every node"
            )
        diff = differences(own, json.loads(str(info["settings"])))
        if diff:  # another learning rate, batch size, mu or seed: the node would train another federation's client
            raise FlowerRunError(
                f"node {node} (partition {partition}) was started with other settings than the server: "
                f"{'; '.join(diff[:SHOWN])}{'; ...' if len(diff) > SHOWN else ''} (the server's -> the node's); give "
                f"every node the run's options (only {', '.join(k for k in PER_NODE_KEYS if k.startswith('data.'))} "
                "may differ)"
            )
        if partition in clients:
            raise FlowerRunError(f"nodes {clients[partition]} and {node} both hold partition {partition}")
        held = int(info.get("num-examples", -1))  # type: ignore[arg-type]
        expected = setup.datamodule.client_sizes[partition] if 0 <= partition < setup.datamodule.num_clients else held
        if held != expected:  # the server plans steps and weights from its own partition: the node's must be it
            raise FlowerRunError(
                f"node {node} holds {held} samples as partition {partition}, where the server's partition holds "
                f"{expected}: give the node the server's data settings (--data.*)"
            )
        clients[partition] = node
    missing = [c for c in range(setup.datamodule.num_clients) if c not in clients]
    if missing:
        raise FlowerRunError(f"no node holds partition(s) {', '.join(map(str, missing))} of the federation")
    return clients


def check_start(setup: FlowerSetup, min_clients: int | None = None) -> None:
    """Refuse, before any node is waited for (or Flower's simulation starts Ray), what would stop the run later.

    Raises :class:`FlowerRunError` for ``federation.eval_local``, a ``min_clients`` outside 1 to the clients sampled
    per round, and a run directory holding a completed or diverged run (a Flower run has no ``--overwrite``).
    """
    fed, dm = setup.federation, setup.datamodule
    if fed.eval_local:  # the local models stay on the nodes
        raise FlowerRunError(
            "federation.eval_local evaluates every local model on the server's test set, and under Flower the local "
            "models stay on the nodes; leave it off (cli.py fit measures it)"
        )
    sampled = num_sampled(dm.num_clients, fed.sample_ratio)
    if min_clients is not None and not 1 <= min_clients <= sampled:
        raise FlowerRunError(
            f"min-clients must be between 1 and the {sampled} clients sampled per round, got {min_clients} (leave it "
            "out to need every sampled client)"
        )
    run_dir = Path(setup.trainer.default_root_dir)
    status = run_status(read_summary(run_dir))
    if status in ("completed", "diverged"):
        raise FlowerRunError(
            f"{run_dir} already holds a {status} run; give this run another run directory (the run config's "
            "run-dir), or move that one away first"
        )


def run_federation(
    grid: Grid,
    setup: FlowerSetup,
    node_wait: float = 60.0,
    round_timeout: float | None = None,
    min_clients: int | None = None,
) -> list[dict[str, float]]:
    """Run the federation ``setup`` describes on ``grid``'s nodes; the evaluated rounds (``metrics.csv``'s rows).

    ``min_clients``: the fewest answered clients that complete a round (``None``: every sampled client).
    """
    trainer, dm = setup.trainer, setup.datamodule
    check_start(setup, min_clients)
    nodes = wait_for_nodes(grid, dm.num_clients, node_wait)
    clients = map_partitions(grid, setup, nodes, node_wait)
    run_dir = Path(trainer.default_root_dir)
    claim = RunDirClaim()
    claim.acquire(run_dir)
    try:
        return _rounds(grid, setup, clients, round_timeout, run_dir, min_clients)
    finally:
        claim.release()


def _rounds(
    grid: Grid,
    setup: FlowerSetup,
    clients: dict[int, int],
    timeout: float | None,
    run_dir: Path,
    min_clients: int | None = None,
) -> list[dict[str, float]]:
    trainer, module, dm, fed = setup.trainer, setup.module, setup.datamodule, setup.federation
    hooks = setup.hooks
    fed.start_fit(run_dir / "client_state")
    info = run_info(trainer, module, dm, sample_ratio=fed.sample_ratio, local_epochs=fed.local_epochs, seed=fed.seed)
    info["engine"] = "flower"
    info["resumable"] = False
    recorder = RunRecorder(run_dir, info, fed.plots, fed.rounds)
    recorder.begin(trainer, dm.client_class_counts, True, f"flower: {len(clients)} nodes, one client each")
    try:
        for r in range(fed.rounds):
            plan = fed.plan_for(r, dm.client_sizes, dm.batch_size, dm.drop_last)
            lr = rules.set_round_lr(trainer, plan.lr_scale)
            weights = fed.weights_for(plan, dm.client_sizes)
            keys = frozenset(name for name, _ in trainable(module))
            server = dm.server_context(
                plan, weights, global_weights={}, param_keys=keys, state=fed.server_state, device=module.device
            )
            payload = round_payload(module, server)
            server.global_weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
            rnd = RoundState(
                plan,
                list(range(len(plan.clients))),
                weights,
                batches_per_client=[1] * len(plan.clients),
                upload_reduce=hooks.upload_reduce if hooks is not None else None,
                global_weights=server.global_weights,
                lr=lr,
                started_at=time.perf_counter(),
            )
            replies = _train_round(grid, rnd, payload, clients, timeout, min_clients)
            missing = [c for c in plan.clients if c not in replies]
            if missing:
                rnd, plan = _answered_round(fed, dm.client_sizes, rnd, server, replies)
                recorder.info.setdefault("missing_clients", {})[str(r + 1)] = missing
            for pos, client in enumerate(plan.clients):
                reply = replies[client]
                rnd.add_client(
                    pos,
                    get_weights(reply.content, "weights", module.device),
                    get_tree(reply.content, "upload"),
                    _loss_of(reply.content),
                    client,
                )
            if rnd.diverged:
                module.load_state_dict(rnd.global_weights)  # keep the last finite global model
                recorder.finish_diverged(trainer, r + 1, rnd.diverged[0])
                _close_loggers(trainer, recorder.status)
                return recorder.history
            update = hooks.server_update if hooks is not None else None
            module.load_state_dict(fed.server_step(rnd, server, update))
            if fed.evaluates(r + 1):
                result = dm.test_evaluation(module, trainer.precision_plugin.forward_context())
                recorder.end_round(trainer, rnd, result)
                recorder.record_measured(trainer)
                diverged = recorder.divergence(fed.collapse_rounds, dm.test_class_counts)
                if diverged is not None:
                    recorder.finish_diverged(trainer, *diverged)
                    _close_loggers(trainer, recorder.status)
                    return recorder.history
            else:
                recorder.end_round(trainer, rnd, None)
    except BaseException as err:
        recorder.end_with(trainer, err)
        _close_loggers(trainer, recorder.status)
        raise
    recorder.end(trainer, fed.rounds)
    _close_loggers(trainer, recorder.status)
    return recorder.history


def _close_loggers(trainer: Any, status: str) -> None:
    """What Lightning does with the loggers at a fit's end: write what they hold (a CSVLogger's rows), then close."""
    for logger in trainer.loggers:
        logger.save()
        logger.finalize("success" if status == "completed" else "failed")


def _loss_of(content: RecordDict) -> float:
    result = content["result"]
    assert isinstance(result, ConfigRecord)
    return float(result["loss"])  # type: ignore[arg-type]


def _answered_round(
    fed: Any, sizes: Sequence[int], rnd: RoundState, server: Any, replies: dict[int, Message]
) -> tuple[RoundState, RoundPlan]:
    """Round ``rnd`` narrowed to the clients that answered: its plan, weights and the server's view of the round."""
    plan = rnd.plan
    kept = [pos for pos, c in enumerate(plan.clients) if c in replies]
    answered = RoundPlan(
        plan.round,
        tuple(plan.clients[p] for p in kept),
        tuple(plan.steps[p] for p in kept),
        plan.local_epochs,
        plan.lr_scale,
    )
    weights = fed.weights_for(answered, sizes)
    server.clients, server.weights = answered.clients, tuple(weights)
    narrowed = RoundState(
        answered,
        list(range(len(answered.clients))),
        weights,
        batches_per_client=[1] * len(answered.clients),
        upload_reduce=rnd.upload_reduce,
        global_weights=rnd.global_weights,
        lr=rnd.lr,
        started_at=rnd.started_at,
    )
    return narrowed, answered


def _train_round(
    grid: Grid,
    rnd: RoundState,
    payload: dict[str, Any],
    clients: dict[int, int],
    timeout: float | None,
    min_clients: int | None = None,
) -> dict[int, Message]:
    """Send round ``rnd``'s clients their ``train`` messages; the replies of the clients that answered, by client id.

    Raises :class:`FlowerRunError` when fewer than ``min_clients`` (``None``: all sampled clients) answered.
    """
    plan = rnd.plan
    messages = []
    for pos, client in enumerate(plan.clients):
        content = RecordDict()
        put_weights(content, "global", rnd.global_weights)
        put_tree(content, "payload", payload)
        content["plan"] = ConfigRecord(
            {
                "round": plan.round,
                "client": client,
                "steps": plan.steps[pos],
                "local_epochs": plan.local_epochs,
                "lr_scale": plan.lr_scale,
                "weight": float(rnd.weights[pos]),
            }
        )
        messages.append(Message(content, clients[client], "train", group_id=str(plan.round + 1)))
    node_client = {node: client for client, node in clients.items()}
    received = list(grid.send_and_receive(messages, timeout=timeout))
    sent = {msg.metadata.message_id: client for msg, client in zip(messages, plan.clients, strict=True)}
    replies: dict[int, Message] = {}
    failed: dict[int, str] = {}
    for reply in received:
        sender = node_client.get(reply.metadata.src_node_id)
        if sender is None:  # an error reply the SuperLink wrote for a node it lost: its source is the SuperLink
            sender = sent.get(reply.metadata.reply_to_message_id)
        if sender is None:
            continue
        client = sender
        if reply.has_error():
            failed[client] = reason_of(reply)
        else:
            replies[client] = reply
    silent = [c for c in plan.clients if c not in replies and c not in failed]
    if not failed and not silent:
        return replies
    needed = len(plan.clients) if min_clients is None else min(min_clients, len(plan.clients))
    problems = [f"client {c} failed: {reason}" for c, reason in failed.items()]
    if silent:
        problems.append(f"client(s) {', '.join(map(str, silent))} did not answer within {timeout}s")
    line = f"round {plan.round + 1}: {'; '.join(problems)}"
    if len(replies) < needed:
        raise FlowerRunError(f"{line} ({len(replies)} of {len(plan.clients)} answered, {needed} needed)")
    print(f"[fl_lightning] {line}; the round completes with the other {len(replies)}", file=sys.stderr, flush=True)
    return replies


def server_setup(config: str, options: str | Sequence[str] | None = None, run_dir: str | None = None) -> FlowerSetup:
    """The server's federation: ``config`` and ``options`` as ``cli.py fit`` reads them, in ``run_dir`` if given."""
    extra = split_options(options)
    if run_dir:
        extra += ["--trainer.default_root_dir", run_dir]
    return build(config, extra)


def server_app(
    config: str | None = None,
    options: str | None = None,
    run_dir: str | None = None,
    node_wait: float | None = None,
    round_timeout: float | None = None,
    min_clients: int | None = None,
    setup: FlowerSetup | None = None,
    on_done: Callable[[list[dict[str, float]] | BaseException], None] | None = None,
) -> ServerApp:
    """A ServerApp for the fl_lightning config ``config`` (each argument left out: the run config's value).

    ``setup``: the server's federation, built already (then ``config``, ``options`` and ``run_dir`` are not read);
    ``on_done``: told the run's evaluated rounds, or the exception that ended it.
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run = context.run_config
        path = config if config is not None else str(run.get("config", ""))
        if not path and setup is None:
            raise FlowerRunError('the run config names no fl_lightning config (config = "path/to/config.yaml")')
        extra = options if options is not None else str(run.get("options", ""))
        folder = run_dir if run_dir is not None else str(run.get("run-dir", "")) or None
        wait = node_wait if node_wait is not None else float(run.get("node-wait", 60.0))
        limit = round_timeout if round_timeout is not None else _optional_float(run.get("round-timeout"))
        fewest = min_clients if min_clients is not None else _optional_int(run.get("min-clients"))
        try:
            history = run_federation(grid, setup or server_setup(path, extra, folder), wait, limit, fewest)
        except BaseException as err:
            if isinstance(err, FlowerRunError):
                print(f"[fl_lightning] {err}", file=sys.stderr, flush=True)
            if on_done is not None:
                on_done(err)
            raise
        if on_done is not None:
            on_done(history)

    return app


def _optional_float(value: Any) -> float | None:
    return None if value in (None, "", 0) else float(value)


def _optional_int(value: Any) -> int | None:
    return None if value in (None, "") else int(value)  # 0 or below: refused by check_start


#: The ServerApp ``flwr run`` loads (``fl_lightning.flower.server_app:app``): its settings come from the run config.
app = server_app()

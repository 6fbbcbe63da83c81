"""The Flower apps: the same science as ``cli.py fit`` in Flower's simulation runtime, and their bad-input lines."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from helpers import ROOT, read_metrics, read_summary  # noqa: E402

from fl_lightning.cli import run as cli_run  # noqa: E402

QUICKSTART = str(ROOT / "configs/quickstart.yaml")

#: SCAFFOLD as a user selects it: options after ``--config configs/quickstart.yaml``.
SCAFFOLD = ["--model.class_path", "fl_lightning.methods.SCAFFOLD"]


def _options(rounds: int = 3) -> list[str]:
    return ["--federation.rounds", str(rounds), "--trainer.enable_progress_bar", "false", *SCAFFOLD]


@pytest.mark.slow
def test_simulation_equals_cli_fit(tmp_path: Path) -> None:
    """Flower's simulation runtime (Ray actors that keep their module between messages) gives ``cli.py fit``'s rounds.

    SCAFFOLD: its clients' control variates cross rounds in each node's ``Context`` state. Every other method's
    science through the same apps is test_every_method_through_the_apps_equals_cli_fit's, without the runtime.
    """
    from fl_lightning.flower.simulation import simulate

    fit_dir, flower_dir = tmp_path / "fit", tmp_path / "flower"
    options = _options()
    assert cli_run(["fit", "--config", QUICKSTART, *options, "--trainer.default_root_dir", str(fit_dir)]) == 0
    history = simulate(QUICKSTART, options, run_dir=str(flower_dir))
    fit_rows, flower_rows = read_metrics(fit_dir), read_metrics(flower_dir)
    assert [int(r["round"]) for r in flower_rows] == [1, 2, 3] == [int(r["round"]) for r in fit_rows]
    worst = max(
        abs(float(a[k]) - float(b[k]))
        for a, b in zip(fit_rows, flower_rows, strict=True)
        for k in ("global_acc", "global_loss")
    )
    print(f"scaffold: largest per-round difference {worst:.3g}")
    for fit_row, flower_row, row in zip(fit_rows, flower_rows, history, strict=True):
        for key in ("global_acc", "global_loss", "train_loss"):
            assert math.isclose(float(flower_row[key]), float(fit_row[key]), abs_tol=1e-5), (key, fit_row, flower_row)
            assert math.isclose(row[key], float(fit_row[key]), abs_tol=1e-5)
    summary = read_summary(flower_dir)
    assert summary["status"] == "completed" and summary["engine"] == "flower"
    assert summary["method"] == read_summary(fit_dir)["method"]
    assert (flower_dir / "curve.png").exists() and (flower_dir / "partition.csv").exists()


# ---- bad input: one line each, nothing written to the run ------------------------------------------------------------


class InProcessGrid:
    """A Flower Grid whose nodes are ClientApps called in this process (one per node, with its node config)."""

    def __init__(self, apps: list, node_configs: list[dict]) -> None:
        from flwr.app import Context, RecordDict

        try:  # Flower >= 1.38
            from flwr.supercore.task_identity import TaskIdentity
        except ImportError:
            TaskIdentity = None

        # what Flower's runtimes set for the ServerApp's messages (run_simulation does the same)
        if TaskIdentity is not None:
            TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
        self.apps = dict(enumerate(apps, start=1))
        self.contexts = {
            node: Context(run_id=1, node_id=node, node_config=config, state=RecordDict(), run_config={})
            for node, config in zip(self.apps, node_configs, strict=True)
        }

    def get_node_ids(self) -> list[int]:
        return list(self.apps)

    def send_and_receive(self, messages, timeout=None):
        from flwr.app import Error, Message

        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            try:
                replies.append(self.apps[node](msg, self.contexts[node]))
            except Exception as err:  # what a SuperNode returns for a ClientApp that raised
                replies.append(Message(Error(code=0, reason=f"{type(err).__name__}: {err}"), reply_to=msg))
        return replies


def _tiny(rounds: int = 2) -> list[str]:
    return [
        *("--data.num_clients", "3", "--federation.local_epochs", "1", "--federation.rounds", str(rounds)),
        *("--trainer.enable_progress_bar", "false", "--federation.plots", "false"),
    ]


def _nodes(count: int = 3) -> list[dict]:
    return [{"partition-id": k, "num-partitions": count} for k in range(count)]


def _run_in_process(tmp_path: Path, server_options: list[str], client_options: list[list[str]], configs: list[dict]):
    from fl_lightning.flower.client_app import client_app
    from fl_lightning.flower.server_app import run_federation, server_setup

    setup = server_setup(QUICKSTART, server_options, str(tmp_path / "run"))
    apps = [client_app(QUICKSTART, " ".join(options)) for options in client_options]
    return run_federation(InProcessGrid(apps, configs), setup, node_wait=1.0)


@pytest.mark.parametrize(
    ("configs", "client_extra", "line"),
    [
        (
            [
                {"partition-id": 0, "num-partitions": 3},
                {"partition-id": 1, "num-partitions": 3},
                {"partition-id": 7, "num-partitions": 3},
            ],
            [[], [], []],
            "node 3 cannot take part: partition-id 7 is outside the federation (clients 0 to 2)",
        ),
        (
            _nodes(),
            [[], ["--model.class_path", "fl_lightning.methods.FedNTD"], []],
            "node 2 (partition 1) is configured for method fedntd, the server for fedavg",
        ),
        (
            [
                {"partition-id": 0, "num-partitions": 3},
                {"partition-id": 1, "num-partitions": 3},
                {
                    "partition-id": 2,
                    "num-partitions": 3,
                    "options": "--data.dataset mnist --data.download false --data.root /nonexistent/fl",
                },
            ],
            [[], [], []],
            "node 3 cannot take part: FileNotFoundError: MNIST (",
        ),
        (
            [
                {"partition-id": 0, "num-partitions": 3},
                {"partition-id": 1, "num-partitions": 3},
                {"partition-id": 1, "num-partitions": 3},
            ],
            [[], [], []],
            "nodes 2 and 3 both hold partition 1",
        ),
        (
            [
                {"partition-id": 0, "num-partitions": 4},
                {"partition-id": 1, "num-partitions": 4},
                {"partition-id": 2, "num-partitions": 4},
            ],
            [[], [], []],
            "node 1 cannot take part: the node's num-partitions is 4, the config's federation has 3 clients",
        ),
        (
            _nodes(),
            [[], [], ["--data.alpha", "0.3"]],
            "node 3 (partition 2) was started with other settings than the server: data.alpha: 0.5 -> 0.3 (the "
            "server's -> the node's); give every node the run's options (only data.root, data.download, ",
        ),
        (
            _nodes(),
            [[], ["--model.lr", "0.1", "--seed_everything", "3"], []],
            "node 2 (partition 1) was started with other settings than the server: model.init_args.lr: 0.05 -> 0.1; "
            "seed_everything: 0 -> 3 (the server's -> the node's)",
        ),
    ],
    ids=[
        "partition-outside",
        "method-mismatch",
        "no-data",
        "doubled-partition",
        "other-federation",
        "other-data",
        "other-lr-and-seed",
    ],
)
def test_bad_input_one_line_nothing_written(configs, client_extra, line, tmp_path: Path) -> None:
    from fl_lightning.flower.server_app import FlowerRunError

    with pytest.raises(FlowerRunError) as err:
        _run_in_process(tmp_path, _tiny(), [_tiny() + extra for extra in client_extra], configs)
    message = str(err.value)
    assert message.startswith(line) and "\n" not in message, message
    assert not (tmp_path / "run").exists()


def _assert_equals_cli_fit(tmp_path: Path, options: list[str], history: list[dict[str, float]]) -> None:
    """The apps' two rounds equal ``cli.py fit`` with the same options (accuracy and losses within 1e-5)."""
    fit_dir = tmp_path / "fit"
    assert cli_run(["fit", "--config", QUICKSTART, *options, "--trainer.default_root_dir", str(fit_dir)]) == 0
    fit_rows = read_metrics(fit_dir)
    assert len(history) == len(fit_rows) == 2
    for row, fit_row in zip(history, fit_rows, strict=True):
        for key in ("global_acc", "global_loss", "train_loss"):
            assert math.isclose(row[key], float(fit_row[key]), abs_tol=1e-5), (key, row, fit_row)


def test_in_process_grid_scaffold_equals_cli_fit(tmp_path: Path) -> None:
    """The apps' round trip (records, client state kept on the node) without Flower's runtime: SCAFFOLD, 2 rounds."""
    options = [*_tiny(), "--model.class_path", "fl_lightning.methods.SCAFFOLD"]
    history = _run_in_process(tmp_path, options, [options] * 3, _nodes())
    _assert_equals_cli_fit(tmp_path, options, history)


# ---- faults: a client that fails in a round ----------------------------------------------------------------------


class FailingGrid(InProcessGrid):
    """An in-process grid whose node ``node`` fails every ``train`` message from round ``from_round`` on."""

    def __init__(self, apps: list, node_configs: list[dict], node: int, from_round: int) -> None:
        super().__init__(apps, node_configs)
        self.node, self.from_round = node, from_round

    def send_and_receive(self, messages, timeout=None):
        from flwr.app import Error, Message

        kept, failed = [], []
        for msg in messages:
            plan = msg.content["plan"] if msg.metadata.message_type == "train" else None
            down = (
                plan is not None and msg.metadata.dst_node_id == self.node and int(plan["round"]) + 1 >= self.from_round
            )
            (failed if down else kept).append(msg)
        replies = super().send_and_receive(kept, timeout)
        return replies + [Message(Error(code=0, reason="the node went away"), reply_to=msg) for msg in failed]


@pytest.mark.parametrize("min_clients", [2, None])
def test_failed_client_round_completes_with_the_others_or_fails(min_clients, tmp_path: Path) -> None:
    from fl_lightning.flower.client_app import client_app
    from fl_lightning.flower.server_app import FlowerRunError, run_federation, server_setup

    options = [*_tiny(3), "--model.class_path", "fl_lightning.methods.SCAFFOLD"]
    setup = server_setup(QUICKSTART, options, str(tmp_path / "run"))
    apps = [client_app(QUICKSTART, " ".join(options)) for _ in range(3)]
    grid = FailingGrid(apps, _nodes(), node=3, from_round=2)  # node 3 holds partition 2
    if min_clients is None:
        with pytest.raises(FlowerRunError) as err:
            run_federation(grid, setup, node_wait=1.0)
        line = str(err.value)
        assert line == "round 2: client 2 failed: the node went away (2 of 3 answered, 3 needed)", line
        assert read_summary(tmp_path / "run")["status"] == "failed"
        return
    history = run_federation(grid, setup, node_wait=1.0, min_clients=min_clients)
    assert [int(row["clients"]) for row in history] == [3, 2, 2]
    assert all(math.isfinite(row["global_acc"]) for row in history)
    summary = read_summary(tmp_path / "run")
    assert summary["status"] == "completed" and summary["missing_clients"] == {"2": [2], "3": [2]}
    assert summary["resumable"] is False


# ---- every built-in method, FedAvgM and the server optimizers through the apps -----------------------------------

_LR = ["--federation.server_optimizer.lr", "0.01"]
_SERVER_STEPS = {
    "fedavgm": ["--federation.server_momentum", "0.9"],
    "fedadagrad": ["--federation.server_optimizer", "fl_lightning.FedAdagrad", *_LR],
    "fedyogi": ["--federation.server_optimizer", "fl_lightning.FedYogi", *_LR],
}


def _every_method() -> dict[str, list[str]]:
    from fl_lightning.methods import METHODS as BUILT_IN

    holdout = {"fedssd": ["--data.holdout_per_class", "64"], "fedka": ["--data.holdout_per_class", "1"]}
    return {name: ["--model", name, *holdout.get(name, [])] for name in BUILT_IN} | _SERVER_STEPS


@pytest.mark.slow
@pytest.mark.parametrize("method", list(_every_method()))
def test_every_method_through_the_apps_equals_cli_fit(method: str, tmp_path: Path) -> None:
    """Each method's state travels as the round core defines it: two rounds through the apps equal ``cli.py fit``."""
    options = [*_tiny(), "--data.num_clients", "5", *_every_method()[method]]
    history = _run_in_process(tmp_path, options, [options] * 5, _nodes(5))
    _assert_equals_cli_fit(tmp_path, options, history)


def test_the_servers_loggers_get_every_round_and_eval_local_is_refused(tmp_path: Path) -> None:
    """A CSVLogger writes its rows when the run ends (as after a fit); eval_local needs the nodes' local models."""
    from fl_lightning.flower.server_app import FlowerRunError

    logger = ["--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(tmp_path)]
    _run_in_process(tmp_path, _tiny(3) + logger, [_tiny(3)] * 3, _nodes())
    (rows,) = tmp_path.glob("lightning_logs/*/metrics.csv")
    assert len(rows.read_text().splitlines()) == 1 + 3
    with pytest.raises(FlowerRunError, match="federation.eval_local evaluates every local model"):
        _run_in_process(tmp_path / "e", _tiny() + ["--federation.eval_local", "true"], [_tiny()] * 3, _nodes())
    assert not (tmp_path / "e" / "run").exists()


@pytest.mark.parametrize("fewest", [-1, 0, 4])
def test_a_bad_min_clients_is_refused_before_any_node_is_asked(fewest: int, tmp_path: Path) -> None:
    from fl_lightning.flower.server_app import FlowerRunError, _optional_int, run_federation, server_setup

    setup = server_setup(QUICKSTART, _tiny(), str(tmp_path / "run"))
    never = InProcessGrid([], [])  # no node: a check after the nodes' query would fail otherwise
    with pytest.raises(FlowerRunError) as err:
        run_federation(never, setup, node_wait=1.0, min_clients=_optional_int(fewest))
    assert str(err.value) == (
        f"min-clients must be between 1 and the 3 clients sampled per round, got {fewest} (leave it out to need "
        "every sampled client)"
    )
    assert not (tmp_path / "run").exists()


def test_a_completed_run_is_refused_before_the_simulation_starts(tmp_path: Path, monkeypatch) -> None:
    """Before Ray starts (about 20 s), with the Flower way to start elsewhere: there is no --overwrite here."""
    import json

    from fl_lightning.flower import simulation
    from fl_lightning.flower.server_app import FlowerRunError

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"status": "completed"}))
    monkeypatch.setattr(simulation, "run_simulation", lambda *a, **k: pytest.fail("the simulation started"))
    with pytest.raises(FlowerRunError) as err:
        simulation.simulate(QUICKSTART, _tiny(), run_dir=str(run_dir))
    line = str(err.value)
    assert line == (
        f"{run_dir} already holds a completed run; give this run another run directory (the run config's run-dir), "
        "or move that one away first"
    ), line


def test_a_client_state_crosses_a_node_context_with_its_containers_types() -> None:
    """A node keeps its client's state in ``Context.state`` between rounds (packed): its containers come back whole."""
    import collections

    import torch
    from flwr.app import RecordDict
    from helpers import Pair

    from fl_lightning.flower.messages import get_tree, put_tree

    state = {
        "visits": collections.defaultdict(int, {0: 2, 3: 1}),  # int keys, which JSON (the packed shape) has not
        "pair": Pair(torch.arange(3.0), collections.Counter("aab")),
        "by_key": {(1, "a"): torch.ones(1), "plain": [None, 0.5, "x"]},
        "tags": frozenset({"x"}),
        "seen": {3, (1, 2)},
    }
    context_state = RecordDict()
    put_tree(context_state, "fl_lightning.client_state", state)
    back = get_tree(context_state, "fl_lightning.client_state")
    assert type(back["visits"]) is collections.defaultdict and back["visits"] == {0: 2, 3: 1} and back["visits"][9] == 0
    assert type(back["pair"]) is Pair and torch.equal(back["pair"].tensor, torch.arange(3.0))
    assert type(back["pair"].count) is collections.Counter and back["pair"].count == {"a": 2, "b": 1}
    assert torch.equal(back["by_key"][(1, "a")], torch.ones(1)) and back["by_key"]["plain"] == [None, 0.5, "x"]
    assert back["tags"] == frozenset({"x"}) and back["seen"] == {3, (1, 2)}

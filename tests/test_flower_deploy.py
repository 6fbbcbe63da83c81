"""The Flower apps deployed for real on this machine: a SuperLink and two SuperNodes, ``flwr run``, faults, auth.

Every process listens on 127.0.0.1 only, on free ports; :class:`~fl_lightning.flower.localhost.LocalDeployment`
bounds every wait and ends every process it started (its ``close`` runs whatever the test does).
"""

from __future__ import annotations

import json
import math
import shlex
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from helpers import ROOT, read_metrics, read_summary  # noqa: E402

from fl_lightning.cli import run as cli_run  # noqa: E402
from fl_lightning.flower.localhost import LocalDeployment, make_node_key  # noqa: E402

QUICKSTART = str(ROOT / "configs/quickstart.yaml")
#: Two clients, one local epoch, three rounds; SCAFFOLD, whose clients keep a control variate between rounds.
OPTIONS = [
    *("--data.num_clients", "2", "--federation.local_epochs", "1", "--federation.rounds", "3"),
    *("--trainer.enable_progress_bar", "false", "--model.class_path", "fl_lightning.methods.SCAFFOLD"),
]
#: Seconds for a whole ``flwr run`` (each message starts a ClientApp process that imports torch, Lightning and Flower
#: and builds its federation).
RUN_TIMEOUT = 900.0


def _run_config(run_dir: Path, **extra: object) -> dict[str, object]:
    return {
        "config": QUICKSTART,
        "options": shlex.join(OPTIONS),
        "run-dir": str(run_dir),
        "node-wait": 120,
        **extra,
    }


def _deployment(root: Path) -> LocalDeployment:
    dep = LocalDeployment(root, env={"OMP_NUM_THREADS": "1"})
    dep.start_superlink()
    for k in range(2):
        dep.start_supernode(k, 2)
    return dep


def _fit_rows(run_dir: Path) -> list[dict[str, str]]:
    assert cli_run(["fit", "--config", QUICKSTART, *OPTIONS, "--trainer.default_root_dir", str(run_dir)]) == 0
    return read_metrics(run_dir)


def _rounds_written(run_dir: Path) -> int:
    return len(read_metrics(run_dir)) if (run_dir / "metrics.csv").exists() else 0


@pytest.mark.slow
def test_deployment_equals_cli_fit_and_survives_a_killed_supernode(tmp_path: Path) -> None:
    """SCAFFOLD on a SuperLink and two SuperNodes (one partition each) gives ``cli.py fit``'s rounds; the SuperNode
    killed after round 2 leaves round 3 to client 0 (``min-clients = 1``).

    One deployment for both: each message starts a ClientApp process that imports torch and Lightning.
    """
    run_dir = tmp_path / "run"
    outcome: list[object] = []
    with _deployment(tmp_path / "deploy") as dep:
        config = _run_config(run_dir, **{"round-timeout": 240, "min-clients": 1})
        runner = threading.Thread(target=lambda: outcome.append(dep.run(config, timeout=RUN_TIMEOUT)), daemon=True)
        runner.start()
        deadline = time.monotonic() + RUN_TIMEOUT
        while _rounds_written(run_dir) < 2 and runner.is_alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _rounds_written(run_dir) == 2, dep.log("superlink")[-3000:]
        dep.stop("supernode-1")  # the node, its SuperExec and any ClientApp it runs for round 3
        runner.join(RUN_TIMEOUT)
        assert not runner.is_alive()
    result = outcome[0]
    assert getattr(result, "returncode", None) == 0, result
    rows, fit_rows = read_metrics(run_dir), _fit_rows(tmp_path / "fit")
    assert [(int(r["round"]), int(r["clients"])) for r in rows] == [(1, 2), (2, 2), (3, 1)], result
    for row, fit_row in zip(rows[:2], fit_rows[:2], strict=True):
        for key in ("global_acc", "global_loss", "train_loss"):
            # SCAFFOLD's second round differs from FedAvg's only through the clients' control variates, which
            # reach the second round's ClientApp processes through Flower's Context state on each SuperNode.
            assert math.isclose(float(row[key]), float(fit_row[key]), abs_tol=1e-5), (key, row, fit_row)
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["engine"] == "flower" and summary["method"] == "scaffold"
    assert summary["resumable"] is False and summary["missing_clients"] == {"3": [1]}
    assert (run_dir / "curve.png").exists() and (run_dir / "partition.csv").exists()


@pytest.mark.slow
def test_unregistered_supernode_is_refused(tmp_path: Path) -> None:
    """With SuperNode authentication (and TLS), a node whose key is not registered is refused at connection."""
    root = tmp_path / "deploy"
    with LocalDeployment(root) as dep:
        dep.start_superlink(node_auth=True)
        known, stranger = make_node_key(root / "known"), make_node_key(root / "stranger")
        registered = dep.register(Path(f"{known}.pub"))
        assert registered.returncode == 0 and "registered successfully" in registered.stdout, registered
        dep.start_supernode(0, 1, "known", key=known)
        refused = dep.start_supernode(0, 1, "stranger", key=stranger)
        deadline = time.monotonic() + 120
        while refused.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert refused.returncode not in (None, 0), dep.log("stranger")[-2000:]
        assert "Failed to activate SuperNode" in dep.log("stranger")
        listed = dep.flwr(["supernode", "ls", "--format", "json"], timeout=60)
        assert listed.returncode == 0, listed
        nodes = json.loads(listed.stdout[listed.stdout.index("{") :])["nodes"]
        # the registered node alone; the stranger never got a node id, so no message of any run can reach it
        assert len(nodes) == 1, nodes
        assert "SuperNode ID" not in dep.log("stranger") and "SuperNode ID" in dep.log("known")

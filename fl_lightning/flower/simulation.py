"""Flower's simulation runtime on one machine: the ServerApp and one virtual SuperNode per client of the config."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from flwr.simulation import run_simulation

from fl_lightning.core.faults import kept_signal_handlers
from fl_lightning.flower.client_app import client_app
from fl_lightning.flower.server_app import FlowerRunError, check_start, server_app, server_setup


def simulate(
    config: str,
    options: str | Sequence[str] | None = None,
    run_dir: str | None = None,
    num_cpus: int = 1,
    round_timeout: float | None = None,
    node_wait: float = 600.0,
) -> list[dict[str, float]]:
    """Run the federation of ``config`` (and ``options``) in Flower's simulation runtime; its evaluated rounds.

    Each client of the config is one virtual SuperNode (Flower sets its ``partition-id``); ``num_cpus`` ClientApps
    train at once (Ray actors of one CPU each). The server writes the run into ``run_dir`` (default: the config's
    ``trainer.default_root_dir``). ``node_wait`` bounds the seconds to wait for the virtual nodes to come up (Ray
    starts their processes, slowly on a busy machine). Raises
    :class:`~fl_lightning.flower.server_app.FlowerRunError` (or whatever else ended the run) when the run did not
    complete.
    """
    setup = server_setup(config, options, run_dir)
    check_start(setup)  # a finished run in run_dir, say: refused before Ray starts
    outcome: list[Any] = []
    option_text = options if isinstance(options, str) else shlex.join(options or [])
    server = server_app(setup=setup, round_timeout=round_timeout, on_done=outcome.append, node_wait=node_wait)
    backend: dict[str, Any] = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": num_cpus, "num_gpus": 0},
    }
    with kept_signal_handlers():  # Ray's init leaves SIGTERM calling sys.exit
        run_simulation(server, client_app(config, option_text), setup.datamodule.num_clients, backend_config=backend)
    if not outcome:
        raise FlowerRunError("the simulation ended before the ServerApp ran")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return list(outcome[0])

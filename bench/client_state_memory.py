"""What per-client method state costs: MB per client on the CPU, for each stateful method, measured after one round.

Runs ``configs/<method>_<setting>.yaml`` through ``fl_lightning.cli`` for one round of one local epoch (the state's
size does not depend on either) and reads ``summary.json``'s ``client_state`` (``ClientStateStore.usage()``): the
clients holding a state and the CPU memory they take. Prints MB per client and what all the setting's clients would
hold once each has trained.

Usage: ``python bench/client_state_memory.py [--setting fmnist_shard2] [--methods scaffold moon ...]``
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import yaml

from fl_lightning.cli import cli_main

ROOT = Path(__file__).resolve().parents[1]


def measure(config: Path, out: Path) -> dict:
    cli_main(
        [
            "fit",
            "--config",
            str(config),
            "--federation.rounds",
            "1",
            "--federation.local_epochs",
            "1",
            "--federation.plots",
            "false",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.default_root_dir",
            str(out),
        ]
    )
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", default="fmnist_shard2")
    parser.add_argument("--methods", nargs="+", default=["scaffold", "feddyn", "moon", "fedcurv", "fednova"])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            config = ROOT / "configs" / f"{method}_{args.setting}.yaml"
            summary = measure(config, Path(tmp) / method)
            usage = summary.get("client_state") or {"clients": 0, "memory_mb": 0.0}
            clients = yaml.safe_load(config.read_text())["data"]["num_clients"]
            per_client = usage["memory_mb"] / usage["clients"] if usage["clients"] else 0.0
            rows.append((method, summary["model"], usage["clients"], per_client, per_client * clients, clients))
    print(f"\nsetting {args.setting}: per-client state on the CPU after one round")
    print(f"{'method':10} {'net':8} {'clients':>7} {'MB/client':>10} {'MB for all':>11}")
    for method, net, n, per_client, total, clients in rows:
        print(f"{method:10} {net:8} {n:7d} {per_client:10.3f} {total:8.1f} ({clients})")


if __name__ == "__main__":
    main()

"""A quickstart round through Flower's simulation runtime and a localhost deployment against ``cli.py fit``.

All runs train the same federation (configs/quickstart.yaml with ``--clients`` clients, one thread); each side's
per-round time is its ``round_seconds`` in ``metrics.csv`` (plan, local updates, server step, evaluation), so
start-up (Ray and the ClientApp actors; the SuperLink, the SuperNodes and the ServerApp process) is reported apart,
as the total wall time of each command. The deployment (``--deploy``) starts a SuperLink and one SuperNode per client
on 127.0.0.1 (:class:`~fl_lightning.flower.localhost.LocalDeployment`) and runs the app with ``flwr run``; its
SuperNodes start a ``flwr-clientapp`` process per message, which imports torch, Lightning and Flower and builds the
federation before it trains.

    OMP_NUM_THREADS=1 python bench/bench_flower.py --rounds 3 --clients 3 --deploy
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _round_seconds(run_dir: Path) -> list[float]:
    with open(run_dir / "metrics.csv") as f:
        return [float(row["round_seconds"]) for row in csv.DictReader(f)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--config", default=str(ROOT / "configs/quickstart.yaml"))
    parser.add_argument("--clients", type=int, default=3, help="data.num_clients (one SuperNode each when deployed)")
    parser.add_argument("--deploy", action="store_true", help="also run a SuperLink and SuperNodes on 127.0.0.1")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from fl_lightning.cli import run as cli_run
    from fl_lightning.flower.simulation import simulate

    options = [
        *("--federation.rounds", str(args.rounds), "--data.num_clients", str(args.clients)),
        *("--trainer.enable_progress_bar", "false"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        fit_dir, flower_dir, deploy_dir = Path(tmp) / "fit", Path(tmp) / "flower", Path(tmp) / "deploy"
        t0 = time.perf_counter()
        assert cli_run(["fit", "--config", args.config, *options, "--trainer.default_root_dir", str(fit_dir)]) == 0
        fit_wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        simulate(args.config, options, run_dir=str(flower_dir))
        flower_wall = time.perf_counter() - t0
        deploy_wall = _deploy(args.config, options, args.clients, Path(tmp), deploy_dir) if args.deploy else None
        fit, flower = _round_seconds(fit_dir), _round_seconds(flower_dir)
        deployed = _round_seconds(deploy_dir) if args.deploy else []
    header = "round  cli.py fit (s)  flower simulation (s)  ratio"
    print(header + ("  localhost deployment (s)  ratio" if deployed else ""))
    for r, (a, b) in enumerate(zip(fit, flower, strict=True), start=1):
        line = f"{r:5d}  {a:14.3f}  {b:21.3f}  {b / a:5.2f}"
        if deployed:
            line += f"  {deployed[r - 1]:24.3f}  {deployed[r - 1] / a:5.0f}"
        print(line)
    print(
        f"median ratio per round: simulation {statistics.median(b / a for a, b in zip(fit, flower, strict=True)):.2f}"
    )
    if deployed:
        ratio = statistics.median(d / a for a, d in zip(fit, deployed, strict=True))
        print(f"median ratio per round: deployment {ratio:.0f}")
    print(f"whole command: cli.py fit {fit_wall:.1f} s, flower simulation {flower_wall:.1f} s (Ray and actor start-up)")
    if deploy_wall is not None:
        print(f"whole command: localhost deployment {deploy_wall:.1f} s (SuperLink, SuperNodes, flwr run)")


def _deploy(config: str, options: list[str], clients: int, tmp: Path, run_dir: Path) -> float:
    """Start a SuperLink and ``clients`` SuperNodes on 127.0.0.1, ``flwr run`` the app; the wall time in seconds."""
    import os
    import shlex

    from fl_lightning.flower.localhost import LocalDeployment

    t0 = time.perf_counter()
    with LocalDeployment(tmp / "localhost", env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}) as dep:
        dep.start_superlink()
        for k in range(clients):
            dep.start_supernode(k, clients)
        run_config = {"config": config, "options": shlex.join(options), "run-dir": str(run_dir), "node-wait": 120}
        result = dep.run(run_config, timeout=3600)
    if result.returncode != 0 or not (run_dir / "metrics.csv").exists():
        raise SystemExit(f"the deployment failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()

"""Seconds per round with 1 process and with N CPU processes sharing each round's clients (DDP, gloo).

Workload: ``configs/fedavg_fmnist_shard2.yaml`` (the FedNTD-paper setting on Fashion-MNIST: 100 clients, shard 2,
ratio 0.1, E = 5, batch 50, ``lenet``), run through ``cli.py fit`` exactly as a user would, once with one process
(all cores to its threads) and once with ``--trainer.devices N --trainer.strategy ddp`` (Lightning gives each
process cores/N threads). Prints the median round time of each (the first round is warm-up), their ratio, and the
largest per-round difference in global accuracy between the two runs.

Usage: ``python bench/bench_processes.py [--rounds 6] [--devices 2] [--method fedavg]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from _setting import ROOT, cli_fit  # bench/ is on sys.path when run as a script


def run(config: Path, rounds: int, devices: int, out: Path) -> list[dict[str, str]]:
    """Run one federation through the CLI and return its metrics rows."""
    extra = ["--federation.rounds", str(rounds), "--trainer.accelerator", "cpu"]
    if devices > 1:
        extra += ["--trainer.devices", str(devices), "--trainer.strategy", "ddp"]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return cli_fit(config, out, *extra, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--method", default="fedavg", help="config prefix: configs/<method>_fmnist_shard2.yaml")
    args = parser.parse_args()
    config = ROOT / "configs" / f"{args.method}_fmnist_shard2.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        one = run(config, args.rounds, 1, Path(tmp) / "one")
        many = run(config, args.rounds, args.devices, Path(tmp) / "many")
    t_one = statistics.median(float(r["round_seconds"]) for r in one[1:])
    t_many = statistics.median(float(r["round_seconds"]) for r in many[1:])
    diff = max(abs(float(a["global_acc"]) - float(b["global_acc"])) for a, b in zip(one, many, strict=True))
    print(f"workload: {config.name}, {args.rounds} rounds (first is warm-up), {os.cpu_count()} CPU cores")
    print(f"1 process:            {t_one:.3f} s/round")
    print(f"{args.devices} processes (ddp): {t_many:.3f} s/round")
    print(f"ratio: {t_many / t_one:.3f}x")
    print(f"largest per-round global accuracy difference: {diff:.5f}")


if __name__ == "__main__":
    main()

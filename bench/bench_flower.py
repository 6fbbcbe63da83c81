"""A quickstart round through Flower's simulation runtime against ``cli.py fit``: seconds per round and their ratio.

Both runs train the same federation (configs/quickstart.yaml, one thread); each side's per-round time is its
``round_seconds`` in ``metrics.csv`` (plan, local updates, server step, evaluation), so start-up (Ray, the ClientApp
actors building the federation) is reported apart, as the total wall time of each command.

    OMP_NUM_THREADS=1 python bench/bench_flower.py --rounds 3
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
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from fl_lightning.cli import run as cli_run
    from fl_lightning.flower.simulation import simulate

    options = ["--federation.rounds", str(args.rounds), "--trainer.enable_progress_bar", "false"]
    with tempfile.TemporaryDirectory() as tmp:
        fit_dir, flower_dir = Path(tmp) / "fit", Path(tmp) / "flower"
        t0 = time.perf_counter()
        assert cli_run(["fit", "--config", args.config, *options, "--trainer.default_root_dir", str(fit_dir)]) == 0
        fit_wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        simulate(args.config, options, run_dir=str(flower_dir))
        flower_wall = time.perf_counter() - t0
        fit, flower = _round_seconds(fit_dir), _round_seconds(flower_dir)
    print("round  cli.py fit (s)  flower simulation (s)  ratio")
    for r, (a, b) in enumerate(zip(fit, flower, strict=True), start=1):
        print(f"{r:5d}  {a:14.3f}  {b:21.3f}  {b / a:5.2f}")
    print(f"median ratio per round: {statistics.median(b / a for a, b in zip(fit, flower, strict=True)):.2f}")
    print(f"whole command: cli.py fit {fit_wall:.1f} s, flower simulation {flower_wall:.1f} s (Ray and actor start-up)")


if __name__ == "__main__":
    main()

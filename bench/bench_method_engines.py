"""Seconds per round of shipped configs with the sequential and the batched engine, run through ``cli.py fit``.

Each config runs once per engine (one run at a time, ``--federation.rounds N``), as a user would run it; the figure
is the median ``round_seconds`` of rounds 2..N (the first is warm-up). Also printed: the batched/sequential speedup
and each run's global accuracy after every round, so that the two engines can be seen to train the same model
(equal up to float rounding in float32; within a point or so in ``bf16-mixed``).

``--gpu`` (``accelerator="gpu"``, the GPU default ``bf16-mixed``) reproduces the fits behind README's GPU figures:

- the teacher methods in the FedNTD setting: ``--configs fedntd_fmnist_shard2,fedlmd_fmnist_shard2 --rounds 6``;
- FedKA's t-CNN setting: ``--configs fedavg_fmnist_dir01,fedka_fmnist_dir01 --rounds 3 --engines batched``.

An engine may name how the batched engine runs its step: ``batched:off`` (uncaptured), ``batched:graph``,
``batched:compile`` (``Federation(step_capture=...)``; plain ``batched`` is ``auto``: a CUDA graph on a GPU).

Usage: ``python bench/bench_method_engines.py [--configs quickstart] [--rounds 4] [--engines sequential,batched]
[--gpu]`` (engines: ``sequential``, ``batched``, ``batched:off``, ``batched:graph``, ``batched:compile``)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from _setting import ROOT, cli_fit  # bench/ is on sys.path when run as a script


def run(config: str, engine: str, rounds: int, gpu: bool, out: Path) -> list[dict[str, str]]:
    """One fit of ``configs/<config>.yaml`` with ``engine`` (``batched:off``: its step uncaptured); its metrics rows."""
    engine, _, capture = engine.partition(":")
    extra = ["--federation.rounds", str(rounds), "--federation.engine", engine]
    if capture:
        extra += ["--federation.step_capture", capture]
    return cli_fit(ROOT / "configs" / f"{config}.yaml", out, *extra, "--trainer.accelerator", "gpu" if gpu else "cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="quickstart", help="comma-separated names in configs/ (no .yaml)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per fit; the first is warm-up")
    parser.add_argument("--engines", default="sequential,batched", help="comma-separated engines to time")
    parser.add_argument("--gpu", action="store_true", help='accelerator="gpu" (bf16-mixed, the GPU default)')
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the first round is warm-up)")
    engines = [e for e in args.engines.split(",") if e]
    where = "GPU" if args.gpu else f"CPU, {os.cpu_count()} cores"
    print(f"{args.rounds} rounds a fit, median s/round of rounds 2-{args.rounds}, one run at a time ({where})")
    with tempfile.TemporaryDirectory() as tmp:
        for config in filter(None, args.configs.split(",")):
            seconds = {}
            for engine in engines:
                rows = run(config, engine, args.rounds, args.gpu, Path(tmp) / f"{config}_{engine}")
                seconds[engine] = statistics.median(float(r["round_seconds"]) for r in rows[1:])
                accs = " / ".join(f"{100 * float(r['global_acc']):.2f}" for r in rows)
                print(f"{config:28s} {engine:10s} {seconds[engine]:8.3f} s/round   acc (%) {accs}")
            for engine in (e for e in engines if e.startswith("batched") and "sequential" in seconds):
                print(f"{config:28s} {engine} speedup {seconds['sequential'] / seconds[engine]:.2f}x")


if __name__ == "__main__":
    main()

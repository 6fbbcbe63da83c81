"""Comparisons: methods × seeds × settings from one YAML, each an ordinary ``fit`` run in its own directory.

``python cli.py compare --config configs/compare/fmnist_shard2.yaml`` runs what is missing (a finished run is reused,
an interrupted one resumes from its last checkpoint), then writes the paper-style tables and plots.

The YAML::

    name: fmnist_shard2                     # the comparison's name (W&B group, output folder)
    output_dir: runs/compare/fmnist_shard2
    methods: [fedavg, fedntd, fedlmd]      # names used in {method} below; the first is the baseline
    seeds: [0, 1, 2]
    settings:                               # setting name -> config path template
      shard2: configs/{method}_fmnist_shard2.yaml
    overrides: ["--federation.rounds", "100"]   # extra CLI arguments for every run (optional)
    jobs: 1                                 # runs in parallel (each gets cpu_count/jobs threads)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fl_lightning.report import write_report


@dataclass
class CompareSpec:
    """A comparison: every method × seed × setting."""

    name: str
    output_dir: Path
    methods: list[str]
    seeds: list[int]
    settings: dict[str, str]
    overrides: list[str] = field(default_factory=list)
    jobs: int = 1
    baseline: str | None = None
    wandb: bool = False

    @classmethod
    def from_yaml(cls, path: str | Path) -> CompareSpec:
        """Read and validate a comparison YAML."""
        raw = yaml.safe_load(Path(path).read_text())
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a mapping with methods, seeds and settings")
        missing = [k for k in ("methods", "settings") if k not in raw]
        if missing:
            raise ValueError(f"{path}: missing key(s) {missing}")
        name = str(raw.get("name", Path(path).stem))
        spec = cls(
            name=name,
            output_dir=Path(raw.get("output_dir", f"runs/compare/{name}")),
            methods=[str(m) for m in raw["methods"]],
            seeds=[int(s) for s in raw.get("seeds", [0])],
            settings={str(k): str(v) for k, v in raw["settings"].items()},
            overrides=[str(a) for a in raw.get("overrides", [])],
            jobs=int(raw.get("jobs", 1)),
            baseline=raw.get("baseline"),
            wandb=bool(raw.get("wandb", False)),
        )
        spec.baseline = spec.baseline or spec.methods[0]
        if spec.jobs < 1:
            raise ValueError(f"{path}: jobs must be at least 1")
        for setting, template in spec.settings.items():
            for method in spec.methods:
                config = Path(template.format(method=method, setting=setting))
                if not config.exists():
                    raise FileNotFoundError(f"{path}: setting {setting!r}, method {method!r}: no config {config}")
        return spec

    def runs(self) -> list[Run]:
        """Every run of the comparison, in a stable order."""
        return [
            Run(
                setting,
                method,
                seed,
                Path(template.format(method=method, setting=setting)),
                self.output_dir / setting / method / f"seed{seed}",
            )
            for setting, template in self.settings.items()
            for method in self.methods
            for seed in self.seeds
        ]


@dataclass
class Run:
    """One fit run of a comparison."""

    setting: str
    method: str
    seed: int
    config: Path
    run_dir: Path

    def state(self) -> str:
        """``done`` (finished or diverged), ``partial`` (has a checkpoint to resume) or ``new``."""
        summary = self.run_dir / "summary.json"
        if summary.exists():
            status = json.loads(summary.read_text()).get("status")
            if status in ("completed", "diverged"):
                return "done"
        if (self.run_dir / "checkpoints" / "last.ckpt").exists():
            return "partial"
        return "new"


def _command(spec: CompareSpec, run: Run, resume: bool) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "fl_lightning.cli",
        "fit",
        "--config",
        str(run.config),
        "--seed_everything",
        str(run.seed),
        "--trainer.default_root_dir",
        str(run.run_dir),
        "--trainer.enable_progress_bar",
        "false",
        *spec.overrides,
    ]
    if spec.wandb:
        cmd += [
            "--trainer.logger",
            "WandbLogger",
            "--trainer.logger.offline",
            "true",
            "--trainer.logger.project",
            "fl_lightning",
            "--trainer.logger.group",
            spec.name,
            "--trainer.logger.name",
            f"{run.setting}/{run.method}/seed{run.seed}",
            "--trainer.logger.tags",
            json.dumps([run.method, f"seed{run.seed}", run.setting]),
            "--trainer.logger.save_dir",
            str(run.run_dir),
        ]
    if resume:
        cmd += ["--ckpt_path", "last"]
    return cmd


def run_comparison(spec: CompareSpec, dry_run: bool = False, report_only: bool = False) -> Path:
    """Run what is missing (nothing with ``report_only``), then write the report; returns the report's folder."""
    runs = spec.runs()
    todo = [] if report_only else [r for r in runs if r.state() != "done"]
    if report_only:
        done = sum(r.state() == "done" for r in runs)
        print(f"[compare] {spec.name}: report only, {done} of {len(runs)} runs finished", flush=True)
    else:
        print(
            f"[compare] {spec.name}: {len(runs)} runs, {len(runs) - len(todo)} already done, {len(todo)} to run "
            f"({spec.jobs} at a time); output in {spec.output_dir}",
            flush=True,
        )
    threads = max(1, (os.cpu_count() or 1) // spec.jobs)
    started = time.time()
    finished = 0

    def execute(run: Run) -> tuple[Run, int]:
        resume = run.state() == "partial"
        cmd = _command(spec, run, resume)
        if dry_run:
            print(" ".join(cmd))
            return run, 0
        run.run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        with open(run.run_dir / "stdout.log", "a") as log:
            code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        return run, code

    failures = []
    with ThreadPoolExecutor(max_workers=spec.jobs) as pool:
        for run, code in pool.map(execute, todo):
            finished += 1
            state = (
                "failed"
                if code
                else json.loads((run.run_dir / "summary.json").read_text())["status"]
                if (run.run_dir / "summary.json").exists()
                else "no summary"
            )
            print(
                f"[compare] {finished}/{len(todo)} {run.setting}/{run.method}/seed{run.seed}: {state} "
                f"({time.time() - started:.0f}s elapsed)",
                flush=True,
            )
            if code:
                failures.append(run)
    report_dir = write_report(
        spec.name, spec.output_dir, [(r.setting, r.method, r.seed, r.run_dir) for r in runs], spec.baseline
    )
    if spec.wandb and not dry_run:
        _log_report_to_wandb(spec, report_dir)
    if failures:
        names = ", ".join(f"{r.setting}/{r.method}/seed{r.seed}" for r in failures)
        print(f"[compare] {len(failures)} run(s) failed: {names}; see their stdout.log, then run again to retry")
    return report_dir


def _log_report_to_wandb(spec: CompareSpec, report_dir: Path) -> None:
    """The comparison's table and plots as one W&B run of the comparison's group (offline unless WANDB_MODE says)."""
    import csv

    import wandb

    with open(report_dir / "results.csv") as f:
        rows = list(csv.reader(f))
    mode = os.environ.get("WANDB_MODE", "offline")
    run = wandb.init(
        project="fl_lightning",
        group=spec.name,
        name=f"{spec.name}/report",
        job_type="report",
        dir=str(spec.output_dir),
        mode=mode,
        tags=["report"],
    )
    run.log({"results": wandb.Table(columns=rows[0], data=rows[1:])})
    for png in sorted(report_dir.glob("*.png")):
        run.log({f"plots/{png.stem}": wandb.Image(str(png))})
    run.finish()


def main(argv: list[str] | None = None) -> int:
    """``cli.py compare --config FILE [--dry-run]``."""
    parser = argparse.ArgumentParser(prog="cli.py compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="comparison YAML (see fl_lightning/compare.py)")
    parser.add_argument("--dry-run", action="store_true", help="print the fit commands instead of running them")
    parser.add_argument("--jobs", type=int, default=None, help="override the YAML's parallel runs")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: write the tables and plots from the runs that exist (unfinished ones are marked)",
    )
    args = parser.parse_args(argv)
    spec = CompareSpec.from_yaml(args.config)
    if args.jobs:
        spec.jobs = args.jobs
    out = run_comparison(spec, dry_run=args.dry_run, report_only=args.report_only)
    print(f"[compare] report: {out / 'results.md'}")
    return 0

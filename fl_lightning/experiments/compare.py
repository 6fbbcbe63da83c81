"""Comparisons: methods × seeds × settings from one YAML, each an ordinary ``fit`` run in its own directory.

``python cli.py compare --config configs/compare/fmnist_shard2.yaml`` runs what is missing (a finished run is reused,
an interrupted one resumes from its last checkpoint), then writes the paper-style tables and plots.

The YAML::

    name: fmnist_shard2                     # the comparison's name (W&B group, output folder)
    output_dir: runs/compare/fmnist_shard2
    methods: [fedavg, fedntd, fedntd_b05]  # {method} below, or a variant's; the first is the baseline
    seeds: [0, 1, 2]
    settings:                               # setting name -> config path template
      shard2: configs/{method}_fmnist_shard2.yaml
    overrides: ["--federation.rounds", "100"]   # extra CLI arguments for every run (optional)
    variants:                               # a method under its own name with its own arguments (optional): a
      fedntd_b05:                           # hyperparameter sweep or ablation, listed under methods
        method: fedntd                      # the {method} whose config it runs
        overrides: ["--model.init_args.beta", "0.5"]
    jobs: 1                                 # runs in parallel (each gets cpu_count/jobs threads, or OMP_NUM_THREADS)
    baseline: fedavg                        # the method others are compared with (default: the first)
    smooth: 0                               # > 0: also plot curves as a moving average over this many rounds
    wandb: false                            # log every fit to W&B (offline)
    notes: ["why a run diverged, ..."]      # lines written under the report's tables (optional)
    published:                              # a source's numbers, set beside ours in the report (optional)
      source: "NIID-Bench (Li et al., ICDE 2022): mean ± std over 3 runs."
      metric: best_acc                      # best_acc, final_acc or last10_acc
      values: {shard2: {fedavg: [78.10, 2.51], fedntd: 80.2}}   # setting -> method -> [mean, std] or mean (%)

A finished run is reused, and an interrupted one resumed, only when its saved ``config.yaml`` matches what the YAML
asks for now; otherwise it is run again with ``--overwrite`` (the old run is moved to ``<dir>.replaced-<time>``),
unless it completed and only its rounds grew: then it is extended from its checkpoint (``fit --ckpt_path last``).
Interrupted runs start first, then the rest seed by seed (every method's first seed before any second seed), so a
comparison stopped early leaves whole seeds behind.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fl_lightning import shipped_configs
from fl_lightning.core.rundir import read_summary, run_status
from fl_lightning.experiments.compare_spec import CompareSpec, Run
from fl_lightning.experiments.report import write_report
from fl_lightning.rules import busy_cpu_note


def _threads_per_run(jobs: int) -> int:
    """Threads for each fit: ``OMP_NUM_THREADS`` if set (two comparisons sharing the cores), else a share of them."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, (os.cpu_count() or 1) // jobs)


def _command(spec: CompareSpec, run: Run, resume: bool, overwrite: bool = False) -> list[str]:
    """The command line of one run's fit: its ``fit`` arguments, the W&B logger's, and resume or overwrite flags."""
    cmd = [sys.executable, "-m", "fl_lightning.cli", *spec.fit_args(run)]
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
            json.dumps(
                list(dict.fromkeys([run.method, spec.config_method(run.method), f"seed{run.seed}", run.setting]))
            ),
            "--trainer.logger.save_dir",
            str(run.run_dir),
        ]
    if resume:
        cmd += ["--ckpt_path", "last"]
    if overwrite:
        cmd += ["--overwrite"]
    return cmd


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be."""


def _held_elsewhere(log: Path, start: int) -> str | None:
    """The refusal of a fit whose run directory another process held (from its log, written from ``start``), or None.

    >>> import tempfile; path = Path(tempfile.mkdtemp()) / "stdout.log"
    >>> _ = path.write_text("error: runs/x is in use by another fit (pid 7); wait for it to end or stop it")
    >>> _held_elsewhere(path, 0)
    'runs/x is in use by another fit (pid 7)'
    """
    try:
        with open(log, errors="replace") as f:
            f.seek(start)
            text = f.read()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("error: ") and " is in use by another fit" in line:
            return line.removeprefix("error: ").split(";")[0]
    return None


#: A fit's exit code for bad input (``fl_lightning.cli.EXIT_CODES``, which imports this module: not imported here).
EXIT_BAD_INPUT = 2


def _last_error(log: Path) -> str | None:
    r"""The last ``error: ...`` line of a fit's log, without the prefix; None when there is none.

    >>> import tempfile; path = Path(tempfile.mkdtemp()) / "stdout.log"
    >>> _ = path.write_text("digits: ...\nerror: rounds must be at least 1, got -1\n")
    >>> _last_error(path)
    'rounds must be at least 1, got -1'
    """
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    return next((ln.removeprefix("error: ") for ln in reversed(lines) if ln.startswith("error: ")), None)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM handler: stop the comparison as Ctrl-C does."""
    raise _Terminated


def check_output_dir(path: Path) -> None:
    """Create the comparison's output folder if need be; refuse it in one line where nothing can be written there."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ValueError(
            f"output_dir {path} cannot be written ({err.strerror or err}); choose another output_dir in the YAML, "
            "or --output-dir"
        ) from None


def check_has_runs(path: Path, runs: list[Run]) -> None:
    """Refuse to write a report (``--report-only``) of a folder that is not there or holds none of the runs."""
    if not path.is_dir():
        raise ValueError(f"no folder {path} to report on; --output-dir names the folder holding the comparison's runs")
    if not any((r.run_dir / "summary.json").is_file() for r in runs):
        example = runs[0].run_dir.relative_to(path) if runs else "<setting>/<method>/seed<n>"
        raise ValueError(
            f"{path} holds none of the comparison's runs (such as {example}/summary.json); --output-dir names the "
            "folder holding them"
        )


def run_comparison(spec: CompareSpec, dry_run: bool = False, report_only: bool = False) -> Path | None:
    """Run what is missing (nothing with ``report_only``), then write the report; returns the report's folder.

    ``dry_run``: print what would run and the fit commands, in their order, and nothing else (no report: None).
    """
    runs = spec.runs()
    if report_only:
        check_has_runs(spec.output_dir, runs)
    if not dry_run:
        check_output_dir(spec.output_dir)
    plans = {} if report_only else {r.run_dir: r.plan(spec) for r in runs}
    todo = [r for r in runs if plans.get(r.run_dir, ("reuse", ""))[0] != "reuse"]
    # Interrupted runs first, then seed by seed: a comparison stopped early has whole seeds, seed 0 first.
    todo.sort(key=lambda r: (plans[r.run_dir][0] != "resume", spec.seeds.index(r.seed)))
    threads = _threads_per_run(spec.jobs)
    commands: dict[Path, list[str]] = {}  # each run's fit (report_only: none to run)
    if report_only:
        done = sum(r.state() == "done" for r in runs)
        print(f"[compare] {spec.name}: report only, {done} of {len(runs)} runs finished", flush=True)
    else:
        print(
            f"[compare] {spec.name}: {len(runs)} runs, {len(runs) - len(todo)} already done, {len(todo)} to run "
            f"({spec.jobs} at a time); output in {spec.output_dir}",
            flush=True,
        )
        busy = busy_cpu_note(threads, min(spec.jobs, len(todo)), "its fits run") if todo and not dry_run else None
        if busy is not None:
            print(f"[compare] warning: {busy}", flush=True)
        for r in todo:
            action, why = plans[r.run_dir]
            commands[r.run_dir] = _command(spec, r, resume=action in ("resume", "extend"), overwrite=action == "rerun")
            if action == "extend":
                print(
                    f"[compare] {r.setting}/{r.method}/seed{r.seed}: extending, {why}; it trains the new rounds from "
                    "its checkpoint",
                    flush=True,
                )
            if action == "rerun":
                print(
                    f"[compare] {r.setting}/{r.method}/seed{r.seed}: rerunning, {why}; the old run is moved "
                    f"to {r.run_dir.name}.replaced-<time>",
                    flush=True,
                )
    if dry_run:
        for r in todo:
            print(shlex.join(commands[r.run_dir]), flush=True)  # quoted: paths with spaces paste as one argument
        return None
    started = time.time()
    finished = 0
    fits: set[subprocess.Popen] = set()  # the fits running now, stopped with the comparison on Ctrl-C
    stopping = threading.Event()
    lock = threading.Lock()

    def execute(run: Run) -> tuple[Run, int | str]:
        action, cmd = plans[run.run_dir][0], commands[run.run_dir]
        busy = run.in_use()
        if busy is not None:  # another comparison (or fit) runs it now: never two fits in one run directory
            return run, busy
        run.run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        log_path = run.run_dir.parent / f"{run.run_dir.name}.stdout.log" if action == "rerun" else None
        with open(log_path or run.run_dir / "stdout.log", "a") as log:
            start = log.tell()
            with lock:
                if stopping.is_set():
                    return run, "not started (the comparison was interrupted)"
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
                fits.add(proc)
            code = proc.wait()
            with lock:
                fits.discard(proc)
        held = _held_elsewhere(Path(log.name), start) if code == EXIT_BAD_INPUT else None
        if held is not None:  # another process's fit claimed the directory after the check above
            if log_path is not None:
                log_path.unlink(missing_ok=True)  # it holds only the refusal
            return run, held
        if log_path is not None and run.run_dir.is_dir():
            os.replace(log_path, run.run_dir / "stdout.log")
        return run, code

    failures = []
    elsewhere = []  # runs that another process (a second comparison, a fit) was running
    pool = ThreadPoolExecutor(max_workers=spec.jobs)
    # SIGTERM (``kill``, a scheduler, a background job's end) stops the comparison the way Ctrl-C does, so that its
    # fits are never left running without it.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    try:
        for run, code in pool.map(execute, todo):
            finished += 1
            summary = read_summary(run.run_dir)
            if isinstance(code, str):
                state = f"skipped: {code}"
            else:
                state = run_status(summary) if summary else ("failed" if code else "no summary")
                if code:
                    state += f" (exit code {code})"
                refused = _last_error(run.run_dir / "stdout.log") if code == EXIT_BAD_INPUT else None
                if refused is not None:  # the fit refused its input: say why here, not only in its log
                    state += f": {refused}"
            print(
                f"[compare] {finished}/{len(todo)} {run.setting}/{run.method}/seed{run.seed}: {state} "
                f"({time.time() - started:.0f}s elapsed)",
                flush=True,
            )
            if isinstance(code, str) and " is in use by another fit" in code:
                elsewhere.append(run)
            elif code not in (0, 3):  # a diverged run (exit code 3) is a result
                failures.append(run)
    except (KeyboardInterrupt, BrokenPipeError) as stop:
        # Ctrl-C or SIGTERM, or the pipe our output goes to was closed: start no other fit, stop those running
        # (SIGTERM reaches a fit in the background too, where SIGINT is ignored; each records itself as
        # interrupted), then end.
        with lock:
            stopping.set()
            for proc in fits:
                proc.send_signal(signal.SIGINT if type(stop) is KeyboardInterrupt else signal.SIGTERM)
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    pool.shutdown(wait=True)
    report_dir = write_spec_report(spec)
    if spec.wandb:
        _log_report_to_wandb(spec, report_dir)
    if elsewhere:
        names = ", ".join(f"{r.setting}/{r.method}/seed{r.seed}" for r in elsewhere)
        print(
            f"[compare] {len(elsewhere)} run(s) were being run by another process (another comparison on this output "
            f"folder, or a fit): {names}; run again once it has ended to include them",
            flush=True,
        )
    if failures:
        names = ", ".join(f"{r.setting}/{r.method}/seed{r.seed}" for r in failures)
        print(
            f"[compare] {len(failures)} run(s) did not finish: {names}; see their stdout.log, then run again to retry",
            flush=True,
        )
    return report_dir


def write_spec_report(spec: CompareSpec, report_root: Path | None = None, plots: bool = True) -> Path:
    """The comparison's report of the runs under ``spec.output_dir``, into ``report_root/report`` (default: there)."""
    return write_report(
        spec.name,
        report_root or spec.output_dir,
        [(r.setting, r.method, r.seed, r.run_dir) for r in spec.runs()],
        spec.baseline if spec.baseline is not None else spec.methods[0],
        smooth=spec.smooth,
        notes=spec.notes,
        published=spec.published,
        plots=plots,
    )


def _log_report_to_wandb(spec: CompareSpec, report_dir: Path) -> None:
    """The comparison's table and plots as one W&B run of the comparison's group (offline unless WANDB_MODE says)."""
    import csv

    import wandb

    with open(report_dir / "results.csv") as f:
        rows = list(csv.reader(f))
    mode: Any = os.environ.get("WANDB_MODE", "offline")  # wandb checks the value
    run = wandb.init(
        project="fl_lightning",
        group=spec.name,
        name=f"{spec.name}/report",
        job_type="report",
        dir=str(spec.output_dir),
        mode=mode,
        tags=["report"],
    )
    header: list[str | int] = list(rows[0])
    run.log({"results": wandb.Table(columns=header, data=rows[1:])})
    for png in sorted(report_dir.glob("[!.]*.png")):
        run.log({f"plots/{png.stem}": wandb.Image(str(png))})
    run.finish()


def main(argv: list[str] | None = None) -> int:
    """``fl-lightning compare --config FILE [--dry-run]``."""
    parser = argparse.ArgumentParser(prog="fl-lightning compare", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config",
        required=True,
        help="a comparison YAML, or a shipped one's name (fl-lightning configs lists them); its keys are described "
        "in the documentation's page 'Comparisons and the papers' tables' (docs/source/guide/compare.md)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the fit commands, in the order they would run, instead of running them (writes nothing)",
    )
    parser.add_argument("--jobs", type=int, default=None, help="override the YAML's parallel runs")
    parser.add_argument(
        "--output-dir",
        default=None,
        help="override the YAML's output_dir (e.g. with --report-only: the report of runs archived under results/)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: write the tables and plots from the runs that exist (unfinished ones are marked)",
    )
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    spec = CompareSpec.from_yaml(shipped_configs.resolve_config_arg(args.config), check_fits=not args.report_only)
    if args.jobs is not None:
        spec.jobs = args.jobs
    if args.output_dir:
        spec.output_dir = Path(args.output_dir)
    out = run_comparison(spec, dry_run=args.dry_run, report_only=args.report_only)
    if out is None:  # --dry-run
        return 0
    print(f"[compare] report: {out / 'results.md'}")
    if args.report_only:
        return 0
    # Exit code 1 when a run did not end completed or diverged (it failed, was refused, stopped or is in use).
    return 0 if all(r.state() == "done" for r in spec.runs()) else 1

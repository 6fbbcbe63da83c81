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
asks for now; otherwise it is run again with ``--overwrite`` (the old run is moved to ``<dir>.replaced-<time>``).
Interrupted runs start first, then the rest seed by seed (every method's first seed before any second seed), so a
comparison stopped early leaves whole seeds behind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_lightning import shipped_configs
from fl_lightning.cli_args import SEED_RANGE, method_class_path
from fl_lightning.cli_errors import one_line
from fl_lightning.core.files import read_yaml
from fl_lightning.core.run_lock import claim_run_dir, release_run_dir
from fl_lightning.core.rundir import RunDirError, has_results, read_config, read_summary, run_status, science_diff
from fl_lightning.experiments.report import Published, write_report
from fl_lightning.lightning_cli import resolve_config
from fl_lightning.methods import METHODS
from fl_lightning.rules import busy_cpu_note

_KEYS = {
    "name",
    "output_dir",
    "methods",
    "seeds",
    "settings",
    "overrides",
    "jobs",
    "baseline",
    "wandb",
    "smooth",
    "notes",
    "published",
    "variants",
}


def _as_list(value: object, key: str, path: str | Path, allow_empty: bool = False) -> list[Any]:
    """A YAML list; a single name or number stands for a one-item list (``methods: fedavg``)."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list):
        raise ValueError(f"{path}: {key} must be a list, e.g. {key}: [a, b]; got {value!r}")
    if not value and not allow_empty:
        raise ValueError(f"{path}: {key} is empty; list at least one")
    return value


def _published(raw: object, spec: CompareSpec, path: str | Path) -> Published:
    """The YAML's ``published`` block, every setting and method in it checked against the comparison's."""
    example = "published: {source: '...', metric: best_acc, values: {<setting>: {<method>: [mean, std]}}}"
    given = raw.get("values") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(given, dict) or not given or not raw.get("source"):
        raise ValueError(f"{path}: published needs a source and values, e.g. {example}")
    unknown = sorted(set(raw) - {"source", "metric", "values"})
    if unknown:
        raise ValueError(f"{path}: published: unknown key(s) {unknown}; the keys are source, metric, values")
    values: dict[tuple[str, str], tuple[float, float | None]] = {}
    for setting, by_method in given.items():
        if str(setting) not in spec.settings:
            raise ValueError(f"{path}: published: {setting!r} is not one of the settings {sorted(spec.settings)}")
        if not isinstance(by_method, dict):
            raise ValueError(f"{path}: published: {setting}: map each method to [mean, std] or a mean, e.g. {example}")
        for method, number in by_method.items():
            if str(method) not in spec.methods:
                raise ValueError(f"{path}: published: {method!r} is not one of the methods {spec.methods}")
            pair = number if isinstance(number, list) else [number]
            ok = len(pair) in (1, 2) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair)
            if not ok or (len(pair) == 2 and pair[1] < 0):
                raise ValueError(
                    f"{path}: published: {setting}/{method} is {number!r}; give [mean, std] (std >= 0) or a mean, in %"
                )
            values[(str(setting), str(method))] = (float(pair[0]), float(pair[1]) if len(pair) == 2 else None)
    try:
        return Published(source=str(raw["source"]), metric=str(raw.get("metric", "best_acc")), values=values)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def _variants(raw: object, methods: list[str], path: str | Path) -> dict[str, tuple[str, list[str]]]:
    """The ``variants`` block: each a method listed under ``methods``, run from another method's config."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: variants must map each variant's name to its method and overrides")
    out: dict[str, tuple[str, list[str]]] = {}
    for name, body in raw.items():
        name = str(name)
        if not isinstance(body, dict) or "method" not in body:
            raise ValueError(f"{path}: variant {name!r} needs 'method' (whose config it runs) and optional 'overrides'")
        unknown = sorted(set(body) - {"method", "overrides"})
        if unknown:
            raise ValueError(
                f"{path}: variant {name!r}: unknown key(s) {unknown}; its keys are method and overrides (arguments go "
                'in overrides, e.g. overrides: [--model.init_args.beta, "0.5"])'
            )
        if name not in methods:
            raise ValueError(f"{path}: variant {name!r} is not one of the methods {methods}; add it there to run it")
        base = str(body["method"])
        if base == name:
            raise ValueError(f"{path}: variant {name!r} needs a name of its own, not its method's")
        if base in raw:
            raise ValueError(f"{path}: variant {name!r} is based on another variant, {base!r}; name a method's config")
        if name in METHODS:
            raise ValueError(
                f"{path}: variant {name!r} has a method's name, so its rows would pass for {name}'s; rename it"
            )
        if isinstance(body.get("overrides"), str):
            raise ValueError(f"{path}: variant {name!r}: overrides must be a list of arguments, e.g. [--a.b, '1']")
        overrides = _as_list(body.get("overrides") or [], f"variants.{name}.overrides", path, allow_empty=True)
        out[name] = (base, [str(a) for a in overrides])
    return out


def _as_int(value: object, path: str | Path, key: str = "seeds") -> int:
    """A YAML whole number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{path}: {key} takes whole numbers, got {value!r}")
    return value


def _as_seed(value: object, path: str | Path) -> int:
    """A YAML seed: a whole number in :data:`~fl_lightning.cli_args.SEED_RANGE`."""
    seed = _as_int(value, path)
    if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise ValueError(f"{path}: seed {seed} is out of range; a seed is between {SEED_RANGE[0]} and {SEED_RANGE[1]}")
    return seed


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
    smooth: int = 0
    notes: list[str] = field(default_factory=list)
    published: Published | None = None
    #: variant name -> (the method whose config it runs, its extra CLI arguments)
    variants: dict[str, tuple[str, list[str]]] = field(default_factory=dict)

    @classmethod
    def from_yaml(cls, path: str | Path) -> CompareSpec:
        """Read and validate a comparison YAML."""
        raw = read_yaml(path)
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a mapping with methods, seeds and settings")
        missing = [k for k in ("methods", "settings") if k not in raw]
        if missing:
            raise ValueError(f"{path}: missing key(s) {missing}")
        name = str(raw.get("name", Path(path).stem))
        if not isinstance(raw["settings"], dict) or not raw["settings"]:
            raise ValueError(f"{path}: settings must map at least one setting name to a config path template")
        spec = cls(
            name=name,
            output_dir=Path(raw.get("output_dir", f"runs/compare/{name}")),
            methods=[str(m) for m in _as_list(raw["methods"], "methods", path)],
            seeds=[_as_seed(s, path) for s in _as_list(raw.get("seeds", [0]), "seeds", path)],
            settings={str(k): str(v) for k, v in raw["settings"].items()},
            overrides=[str(a) for a in _as_list(raw.get("overrides") or [], "overrides", path, allow_empty=True)],
            jobs=_as_int(raw.get("jobs", 1), path, "jobs"),
            baseline=raw.get("baseline"),
            wandb=bool(raw.get("wandb", False)),
            smooth=_as_int(raw.get("smooth", 0), path, "smooth"),
            notes=[str(n) for n in _as_list(raw.get("notes") or [], "notes", path, allow_empty=True)],
        )
        if raw.get("published") is not None:
            spec.published = _published(raw["published"], spec, path)
        spec.variants = _variants(raw.get("variants"), spec.methods, path)
        spec.baseline = str(spec.baseline) if spec.baseline is not None else spec.methods[0]
        for key, listed in (("methods", spec.methods), ("seeds", [str(s) for s in spec.seeds])):
            twice = sorted({v for v in listed if listed.count(v) > 1})
            if twice:
                raise ValueError(f"{path}: {key} lists {', '.join(twice)} more than once; list each once")
        if spec.jobs < 1:
            raise ValueError(f"{path}: jobs must be at least 1")
        if spec.smooth < 0:
            raise ValueError(f"{path}: smooth must be 0 (off) or a moving-average window in rounds")
        if spec.baseline not in spec.methods:
            raise ValueError(f"{path}: baseline {spec.baseline!r} is not one of the methods {spec.methods}")
        unknown = sorted(set(raw) - _KEYS)
        if unknown:
            raise ValueError(f"{path}: unknown key(s) {unknown}; the keys are {sorted(_KEYS)}")
        for setting, template in spec.settings.items():
            for method in spec.methods:
                config = _setting_config(template, spec.config_method(method), setting)
                if not config.exists():
                    raise FileNotFoundError(f"{path}: setting {setting!r}, method {method!r}: no config {config}")
                if method not in spec.variants:
                    continue
                own = _setting_config(template, method, setting)
                if own != config and own.exists():  # a fixed path is every method's config, not the variant's own
                    raise ValueError(f"{path}: variant {method!r} has a config of its own, {own}; rename the variant")
        spec.check_variants(path)
        spec.check_fixed_configs(path)
        return spec

    def check_fixed_configs(self, path: str | Path) -> None:
        """A setting with one config for every method (no ``{method}`` in its path) must train each method it names.

        Otherwise every method's row would hold that config's method under another name (a variant runs its own
        ``overrides``, such as ``--model fedntd``, and is not checked).
        """
        firsts: dict[tuple[str, str], Run] = {}
        for run in self.runs():
            if "{method}" not in self.settings[run.setting] and run.method not in self.variants:
                firsts.setdefault((run.setting, run.method), run)
        for (setting, method), run in firsts.items():
            try:
                wanted = method_class_path(method, "method")
            except ValueError as err:
                raise ValueError(f"{path}: {one_line(err)}") from None
            trains = str((self.resolved(run).get("model") or {}).get("class_path", ""))
            if trains.rsplit(".", 1)[-1] != wanted.rsplit(".", 1)[-1]:
                raise ValueError(
                    f"{path}: setting {setting!r} runs {run.config} for every method, and it trains {trains}, not "
                    f"{method}; give the setting a path with {{method}} (one config per method), or make {method} a "
                    f"variant with [--model, {method}] in its overrides"
                )

    def check_variants(self, path: str | Path) -> None:
        """Resolve each variant's first run now: an override its method does not take fails here, in one line."""
        firsts: dict[str, Run] = {}
        for run in self.runs():
            firsts.setdefault(run.method, run)
        for method in self.variants:
            run = firsts[method]
            try:
                self.resolved(run)
            except Exception as err:  # the parser's error, whatever its type
                raise ValueError(f"{path}: variant {method!r} does not resolve: {one_line(err)}") from err

    def config_method(self, method: str) -> str:
        """The method whose config ``method`` runs: a variant's base method, else the method itself."""
        return self.variants[method][0] if method in self.variants else method

    def resolved(self, run: Run) -> dict[str, Any]:
        """The resolved config a run of this comparison trains with (what its ``config.yaml`` must hold)."""
        return resolve_config(_fit_args(self, run))

    def runs(self) -> list[Run]:
        """Every run of the comparison, in a stable order."""
        return [
            Run(
                setting,
                method,
                seed,
                _setting_config(template, self.config_method(method), setting),
                self.output_dir / setting / method / f"seed{seed}",
            )
            for setting, template in self.settings.items()
            for method in self.methods
            for seed in self.seeds
        ]


def _setting_config(template: str, method: str, setting: str) -> Path:
    """A setting's config for a method: the file the template names, else the shipped config of that name.

    So the shipped comparisons' ``configs/{method}_...yaml`` work from a pip install, outside a checkout.
    """
    path = Path(template.format(method=method, setting=setting))
    return path if path.exists() else shipped_configs.find_config(str(path)) or path


@dataclass
class Run:
    """One fit run of a comparison."""

    setting: str
    method: str
    seed: int
    config: Path
    run_dir: Path

    def state(self) -> str:
        """``done`` (finished or diverged), ``partial`` (a checkpoint to resume or finish) or ``new``, from its files.

        An unfinished run with a checkpoint resumes from it whatever stopped it (a signal, a kill, an error, a full
        disk); one whose rounds are all done is finished from it (``fit --ckpt_path last`` writes what is missing).
        """
        summary = read_summary(self.run_dir)
        if run_status(summary) in ("completed", "diverged"):
            return "done"
        if (self.run_dir / "checkpoints" / "last.ckpt").exists():
            return "partial"
        return "new"

    def in_use(self) -> str | None:
        """Why another process is running this run now (its fit holds the run directory), else None."""
        if not self.run_dir.is_dir():
            return None
        try:
            claim_run_dir(self.run_dir)
        except RunDirError as err:
            return str(err).split(";")[0]
        release_run_dir(self.run_dir)
        return None

    def plan(self, spec: CompareSpec) -> tuple[str, str]:
        """What to do with the run: ``reuse``, ``resume``, ``new`` or ``rerun`` (replace it), and why.

        A finished run is reused, and an unfinished one resumed, only when its saved ``config.yaml`` matches the
        config the comparison would run now (the science keys of :mod:`fl_lightning.core.rundir`).
        """
        state = self.state()
        if state == "new":
            return ("rerun", "it failed or left no checkpoint") if has_results(self.run_dir) else ("new", "")
        saved = read_config(self.run_dir / "config.yaml")
        if saved is None:
            return "rerun", "it has no config.yaml to check against"
        diff = science_diff(saved, spec.resolved(self), allow_growth=state == "partial")
        if diff:
            return "rerun", "its config differs (" + "; ".join(diff) + ")"
        return ("reuse", "") if state == "done" else ("resume", "")


def _threads_per_run(jobs: int) -> int:
    """Threads for each fit: ``OMP_NUM_THREADS`` if set (two comparisons sharing the cores), else a share of them."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, (os.cpu_count() or 1) // jobs)


def _command(spec: CompareSpec, run: Run, resume: bool, overwrite: bool = False) -> list[str]:
    """The command line of one run's fit: its ``fit`` arguments, the W&B logger's, and resume or overwrite flags."""
    cmd = [sys.executable, "-m", "fl_lightning.cli", *_fit_args(spec, run)]
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


def _fit_args(spec: CompareSpec, run: Run) -> list[str]:
    """The ``fit`` arguments of one run (without logger, resume and overwrite flags)."""
    return [
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
        *spec.variants.get(run.method, ("", []))[1],
    ]


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


#: A fit's exit code for bad input (``fl_lightning.cli.EXIT_CODES``): it refused to start.
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


def run_comparison(spec: CompareSpec, dry_run: bool = False, report_only: bool = False) -> Path | None:
    """Run what is missing (nothing with ``report_only``), then write the report; returns the report's folder.

    ``dry_run``: print what would run and the fit commands, in their order, and nothing else (no report: None).
    """
    runs = spec.runs()
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
            commands[r.run_dir] = _command(spec, r, resume=action == "resume", overwrite=action == "rerun")
            if action == "rerun":
                print(
                    f"[compare] {r.setting}/{r.method}/seed{r.seed}: rerunning, {why}; the old run is moved "
                    f"to {r.run_dir.name}.replaced-<time>",
                    flush=True,
                )
    if dry_run:
        for r in todo:
            print(" ".join(commands[r.run_dir]), flush=True)
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
        held = _held_elsewhere(Path(log.name), start) if code == 2 else None
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
    spec = CompareSpec.from_yaml(shipped_configs.resolve_config_arg(args.config))
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

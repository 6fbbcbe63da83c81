"""A comparison's YAML, read and checked (:class:`CompareSpec`), and its fit runs (:class:`Run`).

The YAML's keys are described in :mod:`fl_lightning.experiments.compare`, which runs a spec.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_lightning import shipped_configs
from fl_lightning.cli_args import SEED_RANGE, method_class_path
from fl_lightning.cli_errors import one_line
from fl_lightning.core.files import read_yaml
from fl_lightning.core.run_lock import claim_run_dir, release_run_dir
from fl_lightning.core.rundir import RunDirError, has_results, read_config, read_summary, run_status, science_diff
from fl_lightning.experiments.report import Published
from fl_lightning.lightning_cli import resolve_config
from fl_lightning.methods import METHODS

__all__ = ["CompareSpec", "Run"]


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


def _check_name(name: str, kind: str, path: str | Path) -> None:
    """A setting's or method's name is one path part: it names a folder and the report's files.

    >>> _check_name("fedntd/b05", "method", "c.yaml")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: c.yaml: method 'fedntd/b05' names a folder, so it must be one path part: ...
    """
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(
            f"{path}: {kind} {name!r} names a folder, so it must be one path part: no '/' or '\\', not '.' or '..'"
        )


def _check_template(template: str, setting: str, path: str | Path) -> None:
    """A setting's config path template names no field but ``{method}`` and ``{setting}``.

    >>> _check_template("configs/{method}_{setting}.yaml", "s", "c.yaml")  # fine
    >>> _check_template("configs/{metod}.yaml", "s", "c.yaml")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: c.yaml: setting 's': ... names {metod}; a path may name only {method} and {setting}
    """
    try:
        fields = [name for _text, name, _spec, _conv in string.Formatter().parse(template) if name is not None]
    except ValueError as err:
        raise ValueError(
            f"{path}: setting {setting!r}: its config path {template!r} is not a template ({err}); name {{method}} or "
            "{setting}, and write {{ or }} for a brace"
        ) from None
    unknown = [name for name in fields if name not in ("method", "setting")]
    if unknown:
        raise ValueError(
            f"{path}: setting {setting!r}: its config path {template!r} names {{{unknown[0]}}}; a path may name only "
            "{method} and {setting}"
        )


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
    def from_yaml(cls, path: str | Path, check_fits: bool = True) -> CompareSpec:
        """Read and validate a comparison YAML; ``check_fits``: also resolve every fit it runs (not for a report)."""
        raw = read_yaml(path)
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a mapping with methods, seeds and settings")
        missing = [k for k in ("methods", "settings") if k not in raw]
        if missing:
            raise ValueError(f"{path}: missing key(s) {missing}")
        name = str(raw.get("name", Path(path).stem))
        if not isinstance(raw["settings"], dict) or not raw["settings"]:
            raise ValueError(f"{path}: settings must map at least one setting name to a config path template")
        for setting, template in raw["settings"].items():
            _check_template(str(template), str(setting), path)
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
        for kind, names in (("setting", list(spec.settings)), ("method", spec.methods)):
            for item in names:
                _check_name(item, kind, path)
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
        if check_fits:
            spec.check_fixed_configs(path, spec.check_resolves(path))
        return spec

    def check_fixed_configs(self, path: str | Path, resolved: dict[tuple[str, str], dict[str, Any]]) -> None:
        """A setting with one config for every method (no ``{method}`` in its path) must train each method it names.

        Otherwise every method's row would hold that config's method under another name (a variant runs its own
        ``overrides``, such as ``--model fedntd``, and is not checked). ``resolved``: :meth:`check_resolves`'s.
        """
        for (setting, method), config in resolved.items():
            if "{method}" in self.settings[setting] or method in self.variants:
                continue
            try:
                wanted = method_class_path(method, "method")
            except ValueError as err:
                raise ValueError(f"{path}: {one_line(err)}") from None
            trains = str((config.get("model") or {}).get("class_path", ""))
            if trains.rsplit(".", 1)[-1] != wanted.rsplit(".", 1)[-1]:
                raise ValueError(
                    f"{path}: setting {setting!r} runs {self.settings[setting]} for every method, and it trains "
                    f"{trains}, not {method}; give the setting a path with {{method}} (one config per method), or make "
                    f"{method} a variant with [--model, {method}] in its overrides"
                )

    def check_resolves(self, path: str | Path) -> dict[tuple[str, str], dict[str, Any]]:
        """Resolve each setting × method's first run now, so that a bad override is refused before any fit, in one line.

        An override no config takes (a typo, ``--federation.round``) would otherwise fail every fit in turn, each after
        its start-up. Returns each (setting, method)'s resolved config (the seed aside, every seed's is the same).
        """
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for run in self.runs():
            if (run.setting, run.method) in out:
                continue
            try:
                out[(run.setting, run.method)] = self.resolved(run)
            except Exception as err:  # the parser's error, whatever its type
                who = (
                    f"variant {run.method!r}"
                    if run.method in self.variants
                    else f"setting {run.setting!r}, method {run.method!r}"
                )
                raise ValueError(f"{path}: {who} does not resolve: {one_line(err)}") from err
        return out

    def config_method(self, method: str) -> str:
        """The method whose config ``method`` runs: a variant's base method, else the method itself."""
        return self.variants[method][0] if method in self.variants else method

    def resolved(self, run: Run) -> dict[str, Any]:
        """The resolved config a run of this comparison trains with (what its ``config.yaml`` must hold)."""
        return resolve_config(self.fit_args(run))

    def fit_args(self, run: Run) -> list[str]:
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
            *self.overrides,
            *self.variants.get(run.method, ("", []))[1],
        ]

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
        """What to do with the run: ``reuse``, ``resume``, ``extend``, ``new`` or ``rerun`` (replace it), and why.

        A finished run is reused, and an unfinished one resumed, only when its saved ``config.yaml`` matches the
        config the comparison would run now (the science keys of :mod:`fl_lightning.core.rundir`). A completed run
        whose config differs only in more rounds is extended from its checkpoint (``fit --ckpt_path last``), as
        ``fit`` extends a run, instead of trained again from round 1.
        """
        state = self.state()
        if state == "new":
            return ("rerun", "it failed or left no checkpoint") if has_results(self.run_dir) else ("new", "")
        saved = read_config(self.run_dir / "config.yaml")
        if saved is None:
            return "rerun", "it has no config.yaml to check against"
        wanted = spec.resolved(self)
        diff = science_diff(saved, wanted, allow_growth=state == "partial")
        if diff and self.extendable() and not science_diff(saved, wanted, allow_growth=True):
            return "extend", "its rounds grew (" + "; ".join(diff) + ")"
        if diff:
            return "rerun", "its config differs (" + "; ".join(diff) + ")"
        return ("reuse", "") if state == "done" else ("resume", "")

    def extendable(self) -> bool:
        """Whether the run completed and kept its checkpoint, so that ``fit --ckpt_path last`` can add rounds to it.

        A diverged run is not extended (``fit`` refuses to resume one): it is run again.
        """
        completed = run_status(read_summary(self.run_dir)) == "completed"
        return completed and (self.run_dir / "checkpoints" / "last.ckpt").is_file()

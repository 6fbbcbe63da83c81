"""Run-directory safety: what a ``fit`` may do with the directory it is pointed at, decided before it writes anything.

A run directory holds one experiment. A new fit refuses a directory that already holds results unless told to
replace them (``--overwrite`` moves the old run aside to ``<dir>.replaced-<time>``); a resume (``--ckpt_path``)
first checks that the checkpoint is whole (its checksum), loads, and that everything that changes the science
matches the saved run. A fit claims its directory (:func:`claim_run_dir`, an exclusive lock) before it checks it, and
holds the claim until it ends, so that two fits never write into one directory.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fl_lightning.core.files import DamagedCheckpoint, verify_checkpoint
from fl_lightning.core.messages import first_line
from fl_lightning.core.registry import import_path

# The errors of run directories are defined beside the lock; importing them from here keeps working.
from fl_lightning.core.run_lock import LOCK_NAME, RunDirError, free_aside, move_claimed
from fl_lightning.core.run_lock import RunDirInUse as RunDirInUse
from fl_lightning.core.run_lock import RunDirLost as RunDirLost

#: Config keys (dotted) that may differ between a run and its resume: they do not change what is trained.
FREE_KEYS: tuple[str, ...] = (
    "trainer.",  # the trainer's settings, except those in TRAINER_SCIENCE_KEYS
    "ckpt_path",
    "weights_only",
    "data.download",
    "data.eval_batch_size",
    "federation.plots",
    "federation.client_state_mb",  # where client states live, not what they are
    "federation.collapse_rounds",  # when a collapsed run stops; never a round's numbers
    "federation.engine",  # how the local updates run: the same science up to float rounding
    "federation.group_size",
    "federation.step_capture",  # how the batched engine's step runs: the same step, up to float rounding
    "federation.memory_budget_gb",
    "federation.process_timeout",  # how long processes wait for each other
    "federation.stacked_conv",  # how the batched engine's convolutions run: the same ones, up to float rounding
)
#: Trainer settings that change the numbers a run produces.
TRAINER_SCIENCE_KEYS: tuple[str, ...] = (
    "trainer.precision",
    "trainer.gradient_clip_val",
    "trainer.gradient_clip_algorithm",
    "trainer.accumulate_grad_batches",
)
#: Keys that may grow on a resume (a run can be extended with more rounds, never shortened).
GROW_KEYS: tuple[str, ...] = ("federation.rounds", "trainer.max_epochs")
#: Model hyper-parameters derived from the data (linked at instantiation, absent from the parsed config).
_DERIVED = ("num_classes", "in_channels", "image_size")
_MOVE_IT_AWAY = "move it away (the command line's --overwrite does that)"  # a fit from Python has no --overwrite
#: Data options that, left unset (None), are read from the data itself; the data keys themselves are compared.
_DATA_DERIVED = ("data.num_classes", "data.num_clients")
#: Files that make a directory hold a run's results (a directory with only config.yaml/partition files holds none).
RESULT_FILES: tuple[str, ...] = ("summary.json", "metrics.csv")
#: Statuses after which a run is over.
FINISHED = ("completed", "diverged", "failed")


@dataclass(frozen=True)
class RunDirPlan:
    """What a fit does with its run directory.

    Attributes:
        action: ``fresh`` (nothing there worth keeping), ``resume`` (continue from ``ckpt``), ``finish`` (every
            round is done: restore ``ckpt``, write what is missing, mark the run completed) or ``replace`` (move the
            old run aside to ``aside`` first).
        run_dir: the run directory.
        ckpt: the checkpoint a resume starts from.
        aside: where ``replace`` moves the old run.
        message: one line for the user, or ``""``.
    """

    action: str
    run_dir: Path
    ckpt: Path | None = None
    aside: Path | None = None
    message: str = ""


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one dict with dotted keys.

    >>> flatten({"a": {"b": 1, "c": [2]}, "d": None})
    {'a.b': 1, 'a.c': [2], 'd': None}
    """
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def is_science_key(key: str) -> bool:
    """Whether a dotted config key changes what a run trains and measures."""
    if key in TRAINER_SCIENCE_KEYS or key in GROW_KEYS:
        return True
    if key.startswith("model.init_args.") and key.rsplit(".", 1)[-1] in _DERIVED:
        return False
    return not any(key == free or (free.endswith(".") and key.startswith(free)) for free in FREE_KEYS)


def science_diff(saved: Mapping[str, Any], new: Mapping[str, Any], allow_growth: bool = True) -> list[str]:
    """The science keys whose values differ between a saved config and a new one, each as ``key: old -> new``.

    Args:
        saved: the run's saved config (nested, as in ``config.yaml``).
        new: the new resolved config (nested).
        allow_growth: rounds may be larger in ``new`` than in ``saved`` (a resume that extends a run).

    Returns:
        One entry per differing key, sorted; empty when the configs describe the same experiment.

    A key that one config lacks and the other leaves at ``None`` (an option added later, at its default) is the same.

    >>> science_diff({"data": {"alpha": 0.5}, "trainer": {"logger": False}}, {"data": {"alpha": 0.1}})
    ['data.alpha: 0.5 -> 0.1']
    >>> science_diff({"federation": {"rounds": 5}}, {"federation": {"rounds": 5, "server_optimizer": None}})
    []
    """
    old_flat, new_flat = _named_in_full(flatten(saved)), _named_in_full(flatten(new))
    out = []
    for key in sorted(set(old_flat) | set(new_flat)):
        if not is_science_key(key):
            continue
        old, cur = old_flat.get(key, "<unset>"), new_flat.get(key, "<unset>")
        if _same(old, cur) or (cur is None and key in _DATA_DERIVED) or {old, cur} == {None, "<unset>"}:
            continue
        if key.endswith("class_path") and _same_class(old, cur):
            continue
        if allow_growth and key in GROW_KEYS and isinstance(old, int) and isinstance(cur, int) and cur > old:
            continue
        out.append(f"{key}: {old} -> {cur}")
    return out


def _same_class(old: Any, new: Any) -> bool:
    """Whether two class paths name one class (``fl_lightning.FedAvg`` and ``fl_lightning.module.FedAvg``).

    >>> _same_class("collections.OrderedDict", "collections.OrderedDict"), _same_class("a.B", "a.C")
    (True, False)
    """
    if not (isinstance(old, str) and isinstance(new, str)) or old.rpartition(".")[2] != new.rpartition(".")[2]:
        return False
    cls = import_path(old)
    return cls is not None and cls is import_path(new)


def _named_in_full(flat: dict[str, Any]) -> dict[str, Any]:
    """A flattened config whose server optimizer given by name (``server_optimizer: fedadam``) is given in full.

    The command line turns a name into its class and arguments; a YAML file may keep the name. Both are one setting.
    """
    name = flat.get("federation.server_optimizer")
    if not isinstance(name, str):
        return flat
    from fl_lightning.core.server_optim import server_optimizer_class  # torch: only for a config that names one

    try:
        cls = server_optimizer_class(name)
    except ValueError:
        return flat
    out = {k: v for k, v in flat.items() if k != "federation.server_optimizer"}
    out["federation.server_optimizer.class_path"] = f"{cls.__module__}.{cls.__qualname__}"
    for arg in inspect.signature(cls.__init__).parameters.values():
        if arg.default is not inspect.Parameter.empty:
            out[f"federation.server_optimizer.init_args.{arg.name}"] = arg.default
    return out


def _same(a: Any, b: Any) -> bool:
    """Whether two config values are one setting: numbers by value, and a class without ``init_args`` as with ``{}``.

    >>> _same({"class_path": "pkg.P"}, {"class_path": "pkg.P", "init_args": {}}), _same(1, 1.0)
    (True, True)
    """
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool | str):
        return float(a) == float(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        a, b = ({"init_args": {}, **v} if "class_path" in v else v for v in (a, b))
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """A run's ``summary.json`` (None when absent); an unreadable one is a :class:`RunDirError`."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise RunDirError(f"{path} is unreadable ({err}); {_MOVE_IT_AWAY}") from err
    if not isinstance(summary, dict):
        raise RunDirError(f"{path} is not a run summary; {_MOVE_IT_AWAY}")
    return summary


def read_config(path: Path) -> dict[str, Any] | None:
    """A saved ``config.yaml`` as a nested dict (None when absent)."""
    if not Path(path).exists():
        return None
    try:
        config = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise RunDirError(f"{path} is unreadable ({err}); {_MOVE_IT_AWAY}") from err
    return config if isinstance(config, dict) else None


def pid_alive(pid: Any) -> bool:
    """Whether a process with this id runs on this machine."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_status(summary: Mapping[str, Any] | None) -> str:
    """The status a summary reports, with ``running`` told apart from a stale ``running`` (its process is gone).

    >>> run_status({"status": "running", "pid": -1})
    'stale running'
    """
    if summary is None:
        return "missing"
    status = str(summary.get("status", "unknown"))
    if status != "running":
        return status
    if summary.get("hostname") not in (None, os.uname().nodename):
        return status  # another machine's process: its pid says nothing here
    # A summary without a pid names no writer to check; its writer is taken as gone.
    return status if pid_alive(summary.get("pid")) else "stale running"


#: The folders under a run location, one per fit: ``version_0``, ``version_1``, ... (Lightning's own convention).
VERSION_PREFIX = "version_"


def versions(base: str | os.PathLike[str]) -> list[Path]:
    """The ``version_N`` folders under ``base``, by N (none when ``base`` does not exist)."""
    found = []
    base = Path(base)
    if base.is_dir():
        for path in base.iterdir():
            number = path.name.removeprefix(VERSION_PREFIX)
            if path.name.startswith(VERSION_PREFIX) and number.isdigit() and path.is_dir():
                found.append((int(number), path))
    return [path for _, path in sorted(found)]


def has_results(run_dir: Path) -> bool:
    """Whether a directory holds a run's results or checkpoints."""
    run_dir = Path(run_dir)
    return any((run_dir / name).exists() for name in RESULT_FILES) or any((run_dir / "checkpoints").glob("[!.]*.ckpt"))


def resolve_checkpoint(run_dir: Path, ckpt_path: str | os.PathLike[str]) -> Path | None:
    """The file ``--ckpt_path`` names: ``last`` is the run directory's ``checkpoints/last.ckpt`` (None when absent)."""
    if str(ckpt_path) == "last":
        last = Path(run_dir) / "checkpoints" / "last.ckpt"
        return last if last.exists() else None
    path = Path(ckpt_path)
    if not path.is_file() and (str(ckpt_path) in ("best", "hpc") or str(ckpt_path).startswith("registry")):
        raise RunDirError(
            f"--ckpt_path {ckpt_path}: a federation keeps one checkpoint, <run dir>/checkpoints/last.ckpt (the global "
            "model after the last finished round); pass --ckpt_path last, or a checkpoint file"
        )
    if not path.is_file():
        raise RunDirError(f"--ckpt_path {ckpt_path}: no such file")
    return path


def check_checkpoint_file(path: str | os.PathLike[str]) -> None:
    """Verify a checkpoint's checksum before anything is read from it; a damaged or foreign file is a RunDirError."""
    try:
        verify_checkpoint(path)
    except DamagedCheckpoint as err:
        if err.foreign:
            raise RunDirError(
                f"{err}; give --ckpt_path a checkpoint file (in Python ckpt_path=), such as "
                "<run dir>/checkpoints/last.ckpt, or last"
            ) from err
        raise RunDirError(
            f"{err}; it is damaged: give another checkpoint (--ckpt_path <file>; in Python ckpt_path=), or start the "
            "fit again (--overwrite; in Python another default_root_dir)"
        ) from err


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint onto the CPU; a corrupt, truncated or foreign file is a :class:`RunDirError`."""
    import torch

    check_checkpoint_file(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError, ... for a damaged file
        reason = first_line(err)
        raise RunDirError(
            f"checkpoint {path} cannot be loaded ({reason}); it is damaged: resume from another checkpoint with "
            "--ckpt_path <file>, or start again with --overwrite"
        ) from err
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "callbacks" not in ckpt:
        raise RunDirError(f"checkpoint {path} is not a Lightning checkpoint of a fl_lightning run")
    return ckpt


def federation_state(ckpt: Mapping[str, Any]) -> dict[str, Any]:
    """The Federation callback's saved state in a checkpoint (empty when it has none)."""
    for key, value in ckpt.get("callbacks", {}).items():
        if str(key).startswith("Federation") and isinstance(value, dict):
            return value
    return {}


def rounds_done(ckpt: Mapping[str, Any]) -> int:
    """The last round a checkpoint recorded (0 for none); the last round of a run is always evaluated."""
    state = federation_state(ckpt)
    history = (state.get("record") or state).get("history") or []
    return int(history[-1]["round"]) if history else 0


def checkpoint_diff(ckpt: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Differences between what a checkpoint was trained with and a new config: seed, method, network, data, rounds.

    The one check of a resume's settings, for the command line (:func:`check_run_dir`, from the parsed config) and
    for ``trainer.fit(..., ckpt_path=...)`` (the :class:`~fl_lightning.Federation` callback, from the live objects).

    Args:
        ckpt: the checkpoint (its ``hyper_parameters``, ``datamodule_hyper_parameters`` and the Federation callback's
            state, whose ``settings`` are :meth:`FederatedServer.settings
            <fl_lightning.core.server.FederatedServer.settings>`).
        new: the new settings, nested as in ``config.yaml`` (``model.init_args``, ``data``, ``federation``,
            ``seed_everything``); a key that ``new`` lacks is not compared, nor a value that is no plain data (an
            object given in Python).

    Returns:
        One ``key: old -> new`` entry per differing key (``federation.rounds`` may grow).

    >>> ckpt = {"callbacks": {"Federation": {"settings": {"rounds": 3, "lr_decay": 1.0}}}}
    >>> checkpoint_diff(ckpt, {"federation": {"rounds": 5, "lr_decay": 0.9}})
    ['federation.lr_decay: 1.0 -> 0.9']
    """
    out = []
    fed = federation_state(ckpt)
    seed = new.get("seed_everything")
    if "seed" in fed and seed is not None and int(fed["seed"]) != int(seed):
        out.append(f"seed_everything: {fed['seed']} -> {seed}")
    out += _settings_diff(fed.get("settings") or {}, new.get("federation") or {})
    model = new.get("model") or {}
    hparams = dict(ckpt.get("hyper_parameters") or {})
    class_path = hparams.pop("_class_path", None)
    new_path = model.get("class_path") if isinstance(model, Mapping) else None
    if class_path and new_path not in (None, class_path) and not _same_class(class_path, new_path):
        out.append(f"model.class_path: {class_path} -> {model.get('class_path')}")
    init_args = model.get("init_args") or {} if isinstance(model, Mapping) else {}
    for key, value in sorted(hparams.items()):
        if key.startswith("_") or key in _DERIVED or key not in init_args or not _plain(init_args[key]):
            continue
        cur = init_args[key]
        if isinstance(cur, Mapping) and isinstance(value, str) and "class_path" in cur:
            cur = cur["class_path"]  # a class given by path (--model.net): the checkpoint holds its name
        if not _same(value, cur):
            out.append(f"model.init_args.{key}: {value} -> {cur}")
    data = new.get("data") or {}
    for key, value in sorted((ckpt.get("datamodule_hyper_parameters") or {}).items()):
        if key.startswith("_") or key not in data or not is_science_key(f"data.{key}"):
            continue
        if (data[key] is None and f"data.{key}" in _DATA_DERIVED) or not _plain(data[key]):
            continue
        if not _same(value, data[key]):
            out.append(f"data.{key}: {value} -> {data[key]}")
    return out


def _settings_diff(saved: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The federation settings (``federation.<key>``) that differ; the rounds may grow."""
    out = []
    for key, value in sorted(saved.items()):
        if key not in new or not is_science_key(f"federation.{key}"):
            continue
        cur = new[key]
        if key == "rounds" and isinstance(value, int) and isinstance(cur, int) and cur >= value:
            continue
        if not _same(value, cur):
            out.append(f"federation.{key}: {value} -> {cur}")
    return out


def _plain(value: Any) -> bool:
    """Whether a value is plain data (what a config holds), that a checkpoint's copy can be compared with."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def check_fresh_run_dir(run_dir: str | os.PathLike[str]) -> None:
    """A fit that starts afresh (no checkpoint restored) refuses a directory holding a finished or resumable run.

    The command line checked the directory before anything was built (:func:`check_run_dir`; ``--overwrite`` moved
    an old run aside); this is the same rule for a plain ``trainer.fit``, checked before any of the run's files is
    written. A run that ended ``completed`` or ``diverged``, or left a checkpoint, is kept; one killed before its
    first checkpoint has nothing to resume and, unfinished, nothing to protect (as for ``--ckpt_path last``).
    """
    run_dir = Path(run_dir)
    status = run_status(read_summary(run_dir))
    resumable = any((run_dir / "checkpoints").glob("[!.]*.ckpt"))
    if status in ("completed", "diverged") or (resumable and has_results(run_dir)):
        finished = status in ("completed", "diverged")
        hint = "" if finished else "resume it with trainer.fit(..., ckpt_path='last'), "
        raise RunDirError(
            f"{run_dir} already holds a {status} run; {hint}choose another default_root_dir, or move it away first "
            "(the command line's --overwrite does that)"
        )


def run_files(plots: bool) -> list[str]:
    """The files a finished run of a plain ``trainer.fit`` holds (the command line adds ``config.yaml``)."""
    return ["summary.json", "metrics.csv", "partition.csv"] + (["curve.png", "partition.png"] if plots else [])


def check_resumed_run_dir(run_dir: str | os.PathLike[str], rounds: int, done: int, files: Sequence[str] | None) -> None:
    """A fit that resumes a checkpoint into ``run_dir`` refuses a run that is over (the command line's rule).

    A diverged run has nothing to resume; nor has a completed run unless ``rounds`` extends it, or it lacks one of
    its ``files`` (``None``: the caller has checked them): Lightning then trains nothing and the record is completed.

    >>> check_resumed_run_dir("no/such/run", rounds=3, done=1, files=run_files(plots=True))  # nothing to protect
    """
    run_dir = Path(run_dir)
    summary = read_summary(run_dir)
    status = run_status(summary)
    if status == "diverged":
        raise RunDirError(
            f"{run_dir} holds a diverged run; there is nothing to resume (start a new run in another default_root_dir)"
        )
    planned = int((summary or {}).get("rounds") or 0)
    complete = files is not None and all((run_dir / name).exists() for name in files)
    if status == "completed" and 0 < rounds <= planned and (done < rounds or complete):
        early = f", stopped early after round {done}" if done < rounds else ""
        raise RunDirError(
            f"{run_dir} holds a completed run of {planned} rounds{early}; there is nothing to resume (raise rounds "
            f"above {planned} to extend it, or start a new run in another default_root_dir)"
        )


def check_run_dir(
    run_dir: str | os.PathLike[str],
    new_config: Mapping[str, Any],
    resume: bool,
    overwrite: bool,
    ckpt_path: str | os.PathLike[str] | None = None,
    rerun: str = "pass --overwrite to rerun it",
) -> RunDirPlan:
    """Decide what a fit may do with ``run_dir``, reading only; refuses with a :class:`RunDirError` naming the fix.

    Args:
        run_dir: the run directory (``--trainer.default_root_dir``).
        new_config: the new run's resolved config (nested, as it would be saved in ``config.yaml``).
        resume: the fit continues from a checkpoint (``--ckpt_path``).
        overwrite: the user asked to replace whatever run the directory holds (``--overwrite``).
        ckpt_path: the ``--ckpt_path`` value (``last`` or a file); defaults to ``last`` when ``resume``.
        rerun: how a resume of a finished run is told to run it again (a versioned run's command: in a new version).

    Returns:
        The plan: start fresh, resume from a checked checkpoint, or move the old run aside first.
    """
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise RunDirError("--overwrite starts a new run and --ckpt_path resumes one: pass only one of them")
    summary = read_summary(run_dir)
    status = run_status(summary)
    if status == "running":
        pid = summary.get("pid") if summary else None
        raise RunDirError(
            f"{run_dir} is being written by a running fit (pid {pid}); wait for it or stop it first, "
            "or choose another --trainer.default_root_dir"
        )
    if not resume:
        _refuse_versioned_runs(run_dir)
        if not has_results(run_dir):
            return RunDirPlan("fresh", run_dir)
        if overwrite:
            aside = free_aside(run_dir)
            return RunDirPlan("replace", run_dir, aside=aside, message=f"moving the old run in {run_dir} to {aside}")
        what = f"a {status} run" if summary else "results of an earlier run"
        hint = "resume it with --ckpt_path last, " if status in ("interrupted", "stale running", "failed") else ""
        raise RunDirError(
            f"{run_dir} already holds {what}; {hint}pass --overwrite to replace it (it is moved to "
            f"{run_dir.name}.replaced-<time>), or choose another --trainer.default_root_dir"
        )
    return _check_resume(run_dir, new_config, summary, status, ckpt_path or "last", rerun)


def _refuse_versioned_runs(run_dir: Path) -> None:
    """Refuse to start a run in a directory that holds ``version_N`` runs (a fresh run, or one replacing another).

    A run written beside them would mix with them, and replacing it would move them too. A ``version_N`` folder
    counts when it holds a run (its ``config.yaml``, ``summary.json``, checkpoints or a fit's lock), not a logger's
    ``version_N`` folder.
    """
    held = [
        v
        for v in versions(run_dir)
        if any((v / name).exists() for name in ("config.yaml", "summary.json", "checkpoints", LOCK_NAME))
    ]
    if held:
        raise RunDirError(
            f"{run_dir} holds the versioned runs of a config ({', '.join(p.name for p in held[:3])}"
            f"{', ...' if len(held) > 3 else ''}), not a run of its own: choose another "
            "--trainer.default_root_dir (a config file's trainer.default_root_dir names one too; with none, a "
            "fit takes a new runs/<config name>/version_N)"
        )


def _check_resume(
    run_dir: Path,
    new_config: Mapping[str, Any],
    summary: dict[str, Any] | None,
    status: str,
    ckpt_path: str | os.PathLike[str],
    rerun: str,
) -> RunDirPlan:
    ckpt_file = resolve_checkpoint(run_dir, ckpt_path)
    if ckpt_file is None:  # killed before its first checkpoint: nothing to resume and, unfinished, to protect
        if not has_results(run_dir) or status in ("stale running", "interrupted", "failed"):
            _refuse_versioned_runs(run_dir)
            return RunDirPlan("fresh", run_dir, message=f"no checkpoint in {run_dir}/checkpoints: starting a new run")
        raise RunDirError(
            f"--ckpt_path last: {run_dir} holds results but no checkpoints/last.ckpt; pass --ckpt_path <file>, "
            "or --overwrite (without --ckpt_path) to start again"
        )
    ckpt = load_checkpoint(ckpt_file)
    saved_dir = ckpt_file.parent.parent if ckpt_file.parent.name == "checkpoints" else run_dir
    saved = read_config(saved_dir / "config.yaml") or read_config(run_dir / "config.yaml")
    diff = checkpoint_diff(ckpt, new_config)
    if saved is not None:
        diff += [d for d in science_diff(saved, new_config) if d.split(":")[0] not in {x.split(":")[0] for x in diff}]
    done = rounds_done(ckpt)
    rounds = (new_config.get("federation") or {}).get("rounds")
    if isinstance(rounds, int) and rounds < done and not any(d.startswith("federation.rounds") for d in diff):
        diff.append(f"federation.rounds: {rounds} is fewer than the {done} rounds the checkpoint has done")
    if diff:
        raise RunDirError(
            f"cannot resume {run_dir}: the new config differs in what it trains ({'; '.join(sorted(diff))}); "
            "use the run's own config (--config "
            f"{saved_dir / 'config.yaml'}), or choose another --trainer.default_root_dir"
        )
    if status == "diverged":
        raise RunDirError(f"{run_dir} holds a diverged run; there is nothing to resume ({rerun})")
    finished = isinstance(rounds, int) and 0 < rounds <= done
    same_rounds = isinstance(rounds, int) and summary and rounds <= int(summary.get("rounds", 0))
    files = [*run_files((new_config.get("federation") or {}).get("plots", True)), "config.yaml"]
    whole = all((run_dir / name).exists() for name in files)  # else a fault during its final writes, or deleted since
    if status == "completed" and summary and same_rounds and (whole or not finished):
        raise RunDirError(
            f"{run_dir} holds a completed run of {summary.get('rounds')} rounds; there is nothing to resume "
            f"(raise --federation.rounds to extend it, or {rerun})"
        )
    if finished:  # Lightning trains nothing once max_epochs is reached; the Federation completes the record
        return RunDirPlan("finish", run_dir, ckpt=ckpt_file)
    return RunDirPlan("resume", run_dir, ckpt=ckpt_file, message=extension_note(summary, saved, rounds, done))


def extension_note(summary: Mapping[str, Any] | None, saved: Mapping[str, Any] | None, rounds: Any, done: int) -> str:
    """The line a resume that raises a run's rounds says before it starts (``""`` when it raises none).

    Args:
        summary: the run's ``summary.json`` (its status and rounds), or None.
        saved: the run's saved config (its ``federation.rounds``), or None.
        rounds: the rounds the resume asks for.
        done: the rounds the checkpoint has done.

    >>> extension_note({"status": "completed", "rounds": 3}, None, 20, 3)
    'extending a completed run from 3 to 20 rounds: rounds 4-20 are trained, and its results rewritten'
    >>> extension_note({"status": "completed", "rounds": 3}, None, 4, 3)
    'extending a completed run from 3 to 4 rounds: round 4 is trained, and its results rewritten'
    >>> extension_note({"status": "interrupted", "rounds": 3}, None, 3, 2)
    ''
    """
    planned = (summary or {}).get("rounds")
    if not isinstance(planned, int):
        planned = ((saved or {}).get("federation") or {}).get("rounds")
    if not isinstance(rounds, int) or not isinstance(planned, int) or rounds <= planned:
        return ""
    what = "a completed run" if (summary or {}).get("status") == "completed" else "the run"
    trained = f"round {rounds} is" if done + 1 == rounds else f"rounds {done + 1}-{rounds} are"
    return f"extending {what} from {planned} to {rounds} rounds: {trained} trained, and its results rewritten"


def move_aside(plan: RunDirPlan) -> Path | None:
    """Carry out a ``replace`` plan: rename the old run directory to ``plan.aside`` (one atomic rename).

    A claim this process holds on the directory moves to the new, empty directory of the same name.
    """
    if plan.action != "replace" or plan.aside is None:
        return None
    move_claimed(plan.run_dir, plan.aside)
    return plan.aside

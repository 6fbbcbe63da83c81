"""Whether the processes (nodes) of one run, or a Flower run's nodes and server, were started with the same settings.

Each process reduces its settings to a *fingerprint* (:func:`settings_fingerprint`): the resolved config flattened
to dotted keys (``federation.rounds``, ``model.init_args.lr``), each value in one canonical text, without the keys
that may differ from node to node (:data:`PER_NODE_KEYS`: where a node's data lies, where it logs, its progress
bar). The processes of a ``torchrun``/``srun`` run gather each other's fingerprints at the start of the fit
(:func:`check_same_settings`); a Flower node sends its own with its answer to the server's first query. Any other
difference (a seed, a number of rounds, a learning rate) is refused with one line naming the keys
(:func:`settings_disagreement`), before anything is trained or written.

>>> a = settings_fingerprint({"seed_everything": 0, "data": {"root": "/a", "alpha": 0.5}})
>>> b = settings_fingerprint({"seed_everything": 1, "data": {"root": "/b", "alpha": 0.5}})
>>> differences(a, b)
['seed_everything: 0 -> 1']
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fl_lightning.core.distributed import all_gather_object, is_distributed
from fl_lightning.core.messages import option
from fl_lightning.core.registry import import_path
from fl_lightning.core.rundir import flatten, is_science_key

#: Config keys (dotted; a key ending in ``.`` covers the keys under it) that may differ between the nodes of one run:
#: where a node's data lies and how it reads it, where it logs, its progress bar, the config files it read (their
#: settings are compared) and a checkpoint's path (a shared filesystem may be mounted elsewhere on each node; whether a
#: node resumes at all is compared).
PER_NODE_KEYS: tuple[str, ...] = (
    "config",
    "data.root",
    "data.download",
    "data.num_workers",
    "data.pin_memory",
    "trainer.default_root_dir",
    "trainer.enable_progress_bar",
    "trainer.logger",
    "trainer.logger.",
)
#: How many differing keys a refusal names (then ``...``).
SHOWN = 4


def _canonical(value: Any) -> Any:
    """``value`` as plain JSON data that is the same text in every process for the same setting.

    Numbers compare by value (``1`` and ``1.0`` are one setting); an object that is no plain data is named by its
    class (its ``repr`` may hold a memory address, which differs between processes).
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def _per_node(key: str) -> bool:
    return any(key == free or (free.endswith(".") and key.startswith(free)) for free in PER_NODE_KEYS)


def settings_fingerprint(config: Mapping[str, Any], science_only: bool = False) -> dict[str, str]:
    """The settings of ``config`` (nested, as ``config.yaml`` holds them) that every node must share, by dotted key.

    Keys of :data:`PER_NODE_KEYS` are left out; ``ckpt_path`` counts only as given or not (``resume``/``fresh``).
    ``science_only`` keeps only the keys that change what is trained (:func:`~fl_lightning.core.rundir.is_science_key`),
    for a Flower node, whose engine, trainer and run directory are its own.

    >>> settings_fingerprint({"ckpt_path": "/mnt/a/last.ckpt", "trainer": {"logger": {"save_dir": "x"}, "devices": 1}})
    {'ckpt_path': '"resume"', 'trainer.devices': '1.0'}
    """
    out: dict[str, str] = {}
    for key, value in sorted(flatten(config).items()):
        if any(part.startswith("_") for part in key.split(".")) or _per_node(key):
            continue
        if value is None and key != "ckpt_path":
            continue  # an option left None is one left out (a node of an older version lacks it)
        if science_only and (not is_science_key(key) or key == "trainer.precision"):
            continue  # a Flower node's precision is its own hardware's (a CPU server, GPU nodes)
        if key.endswith("class_path") and isinstance(value, str):  # fl_lightning.FedAvg is fl_lightning.module.FedAvg
            cls = import_path(value)
            value = f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else value
        if key == "ckpt_path":
            value = "fresh" if value is None else "resume"
        out[key] = json.dumps(_canonical(value), sort_keys=True)
    return out


def differences(mine: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
    """The keys whose values differ between two fingerprints, each as ``key: mine -> theirs``, sorted."""
    out = []
    for key in sorted(set(mine) | set(theirs)):
        a, b = mine.get(key, "<unset>"), theirs.get(key, "<unset>")
        if a != b:
            out.append(f"{key}: {_shown(a)} -> {_shown(b)}")
    return out


def _shown(text: str) -> str:
    """A fingerprint's value as the config wrote it (``0`` for ``0.0``; a string without its quotes)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return text
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return value if isinstance(value, str) else json.dumps(value)


def settings_disagreement(
    fingerprints: Sequence[Mapping[str, str]], name: Callable[[int], str] = lambda i: f"rank {i}"
) -> str | None:
    """Why the processes whose ``fingerprints`` these are cannot run together (``None``: they agree).

    The first one (rank 0, or the Flower server) is the reference; the first process that differs is named, with its
    differing keys (``reference -> its``).

    >>> settings_disagreement([{"seed_everything": "0.0"}, {"seed_everything": "0.0"}]) is None
    True
    >>> settings_disagreement([{"federation.rounds": "2.0"}, {"federation.rounds": "3.0"}])
    'rank 1 was started with other settings than rank 0: federation.rounds: 2 -> 3'
    """
    reference = fingerprints[0]
    for i, theirs in enumerate(fingerprints[1:], start=1):
        diff = differences(reference, theirs)
        if diff:
            shown = "; ".join(diff[:SHOWN]) + (f"; and {len(diff) - SHOWN} more" if len(diff) > SHOWN else "")
            return f"{name(i)} was started with other settings than {name(0)}: {shown}"
    return None


#: The Trainer's attributes a fit from Python compares between its processes (with the model, data and federation).
TRAINER_KEYS = (
    "precision",
    "max_epochs",
    "gradient_clip_val",
    "gradient_clip_algorithm",
    "accumulate_grad_batches",
    "limit_train_batches",
    "limit_val_batches",
    "check_val_every_n_epoch",
)


def fit_settings(trainer: Any, module: Any, federation: Mapping[str, Any]) -> dict[str, Any]:
    """A fit's settings nested as ``config.yaml`` holds them, from its live objects (a fit from Python has no config).

    ``module``'s class and hyper-parameters are ``model``, the Trainer's datamodule's hyper-parameters ``data``, the
    Trainer's :data:`TRAINER_KEYS` ``trainer``; ``federation`` is the callback's settings.
    """
    cls = type(module)
    model = {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": dict(getattr(module, "hparams", {}))}
    data = dict(getattr(getattr(trainer, "datamodule", None), "hparams", {}))
    own = {key: getattr(trainer, key, None) for key in TRAINER_KEYS}
    return {"model": model, "data": data, "federation": dict(federation), "trainer": own}


def check_same_settings(config: Mapping[str, Any], node: int = 0) -> None:
    """Refuse, in every process, a run whose processes were started with different settings (all must call this).

    Each process gives its resolved ``config`` and its ``node`` (rank); nothing happens in a single process.

    Raises:
        ValueError: one line naming the first differing process and its keys, on every process.
    """
    if not is_distributed():
        return
    gathered = all_gather_object((node, settings_fingerprint(config)))
    nodes = [n for n, _ in gathered]
    problem = settings_disagreement([f for _, f in gathered], lambda i: f"rank {i} (node {nodes[i]})")
    if problem is not None:
        if "trainer.precision:" in problem:  # unless given, each machine's own GPU chooses it
            problem += f" (the precision each machine's GPU chose: give {option('trainer.precision')} on every node)"
        raise ValueError(
            f"{problem} (rank 0's -> its); start every node with the same command line or arguments (only "
            f"{', '.join(k.rstrip('.') for k in PER_NODE_KEYS if not k.endswith('.'))} may differ)"
        )
